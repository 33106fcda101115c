"""runtime.py: rank layout from torchrun / Slurm / plain environments; a process group of one; and a rank
that dies mid-run under `gpuval ... --nproc 2` (killed by tests/dist/killhook/sitecustomize.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import cli_env, run_cli, run_dist_worker

from gpuval import runtime as rt
from gpuval.errors import RunError
from gpuval.runtime import distributed_env, launcher_env, node_name

KILLHOOK = Path(__file__).parent / "dist" / "killhook"
TORCHRUN_ENV = {
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29400",
}
SLURM_ENV = {
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "2(x2)",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_LAUNCH_NODE_IPADDR": "10.1.2.3",
    "SLURM_JOB_ID": "123456",
}
SINGLE = {
    "launcher": "single",
    "rank": 0,
    "world_size": 1,
    "local_rank": 0,
    "local_world_size": 1,
    "node_rank": 0,
    "master_addr": "127.0.0.1",
    "master_port": "0",
}


def test_torchrun_env():
    assert distributed_env(TORCHRUN_ENV) == {
        "launcher": "torchrun",
        "rank": 5,
        "world_size": 8,
        "local_rank": 1,
        "local_world_size": 4,
        "node_rank": 1,
        "master_addr": "10.0.0.1",
        "master_port": "29400",
    }


def test_torchrun_env_minimal():
    # without GROUP_RANK the node is rank // local world size; defaults for the rest
    env = {"RANK": "6", "WORLD_SIZE": "8", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"}
    assert distributed_env(env) == {
        "launcher": "torchrun",
        "rank": 6,
        "world_size": 8,
        "local_rank": 2,
        "local_world_size": 4,
        "node_rank": 1,
        "master_addr": "127.0.0.1",
        "master_port": "29500",
    }


def test_slurm_env():
    assert distributed_env(SLURM_ENV) == {
        "launcher": "slurm",
        "rank": 3,
        "world_size": 4,
        "local_rank": 1,
        "local_world_size": 2,
        "node_rank": 1,
        "master_addr": "10.1.2.3",
        "master_port": "23456",
    }  # 20000 + 123456 % 20000


def test_slurm_env_first_rank():
    env = {**SLURM_ENV, "SLURM_PROCID": "0", "SLURM_NODEID": "0", "SLURM_LOCALID": "0"}
    got = distributed_env(env)
    assert (got["rank"], got["local_rank"], got["node_rank"]) == (0, 0, 0)


def test_slurm_env_master_from_environment_wins():
    env = {**SLURM_ENV, "MASTER_ADDR": "head", "MASTER_PORT": "31000"}
    got = distributed_env(env)
    assert (got["master_addr"], got["master_port"]) == ("head", "31000")


def test_slurm_tasks_per_node_missing_or_uneven():
    env = {k: v for k, v in SLURM_ENV.items() if k != "SLURM_NTASKS_PER_NODE"}
    assert distributed_env(env)["local_world_size"] == 2  # 4 tasks / 2 nodes
    assert distributed_env({**SLURM_ENV, "SLURM_NTASKS_PER_NODE": "4"})["local_world_size"] == 4
    assert distributed_env({**SLURM_ENV, "SLURM_NTASKS_PER_NODE": "3,1"})["local_world_size"] == 2


def test_slurm_job_id_missing_gives_base_port():
    env = {k: v for k, v in SLURM_ENV.items() if k != "SLURM_JOB_ID"}
    assert distributed_env(env)["master_port"] == "20000"


def test_slurm_master_from_scontrol(monkeypatch):
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"] = cmd
        return SimpleNamespace(stdout="node7\nnode8\n")

    monkeypatch.setattr(rt.subprocess, "run", fake_run)
    env = {k: v for k, v in SLURM_ENV.items() if k != "SLURM_LAUNCH_NODE_IPADDR"}
    env["SLURM_STEP_NODELIST"] = "node[7-8]"
    assert distributed_env(env)["master_addr"] == "node7"
    assert seen["cmd"] == ["scontrol", "show", "hostnames", "node[7-8]"]


def test_slurm_master_without_scontrol(monkeypatch):
    def missing(cmd, **kwargs):
        raise FileNotFoundError("scontrol")

    monkeypatch.setattr(rt.subprocess, "run", missing)
    env = {k: v for k, v in SLURM_ENV.items() if k != "SLURM_LAUNCH_NODE_IPADDR"}
    assert distributed_env(env)["master_addr"] == "127.0.0.1"


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"PATH": "/usr/bin", "HOME": "/root"},
        {k: v for k, v in SLURM_ENV.items() if k != "SLURM_STEP_ID"},  # the batch script itself, not srun
        {**SLURM_ENV, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"},  # one task
        {"RANK": "0"},  # half a torchrun environment
    ],
)
def test_plain_env_is_single(env):
    assert distributed_env(env) == SINGLE
    assert launcher_env(env) == "single"


def test_torchrun_inside_slurm_is_torchrun():
    assert launcher_env({**SLURM_ENV, **TORCHRUN_ENV}) == "torchrun"
    assert distributed_env({**SLURM_ENV, **TORCHRUN_ENV})["rank"] == 5


def test_distributed_env_reads_os_environ(no_launcher_env, monkeypatch):
    assert distributed_env() == SINGLE
    for key, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(key, value)
    assert distributed_env()["rank"] == 5


def test_node_name_precedence():
    assert node_name({"GPUVAL_NODE_NAME": "a", "SLURMD_NODENAME": "b"}) == "a"
    assert node_name({"SLURMD_NODENAME": "b"}) == "b"
    assert node_name({}) == __import__("socket").gethostname()


def test_init_runtime_single_process(no_launcher_env, monkeypatch):
    monkeypatch.setenv("GPUVAL_NODE_NAME", "testnode")
    runtime = rt.init_runtime(timeout_s=30, backend="gloo")
    try:
        layout = (runtime.rank, runtime.world_size, runtime.local_rank, runtime.local_world_size)
        assert layout == (0, 1, 0, 1)
        assert runtime.launcher == "single" and runtime.backend == "gloo"
        assert runtime.device.type == "cpu" and not runtime.on_gpu
        assert runtime.is_main and runtime.num_nodes == 1
        assert runtime.node_names == ["testnode"]
        assert runtime.all_gather_object({"x": 1}) == [{"x": 1}]
        assert runtime.world_info() == {"size": 1, "nodes": 1, "backend": "gloo"}
    finally:
        runtime.shutdown()
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_all_gather_object_lost_peer_is_run_error(monkeypatch):
    import torch.distributed as dist

    def broken(gathered, obj):
        raise dist.DistBackendError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1420\nmore")

    monkeypatch.setattr(dist, "all_gather_object", broken)
    runtime = rt.Runtime(
        rank=2,
        world_size=4,
        local_rank=2,
        local_world_size=4,
        node_rank=0,
        node_name="n",
        backend="gloo",
        device=None,
        launcher="torchrun",
        timeout_s=10,
    )
    with pytest.raises(RunError, match=r"^rank 2 lost contact with the other ranks: .*closed by peer"):
        runtime.all_gather_object(None)


# ---------------------------------------------------------------------------------------------------------
# A rank dies mid-run: exit 3, one 'gpuval:' line naming it last, no traceback, no output file.
# ---------------------------------------------------------------------------------------------------------


def _gpuval(
    args: list[str], cwd: Path, kill_rank: str | None, tmpdir: Path | None = None
) -> subprocess.CompletedProcess:
    # gloo on CPUs (cli_env hides the GPUs), also on a GPU machine; 80 columns: the one-line message
    # must stay one line in a narrow terminal too
    env = cli_env(
        PYTHONPATH=os.pathsep.join(filter(None, [str(KILLHOOK), os.environ.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
    )
    if kill_rank is not None:
        env["GPUVAL_TEST_KILL_RANK"] = kill_rank
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return run_cli(args, cwd, env=env)


def _assert_dead_rank_reported(proc: subprocess.CompletedProcess) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode == 3, output
    assert "Traceback" not in output, output
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gpuval:"), output
    assert "rank 1" in last and "died" in last, last


def test_killhook_inert_without_matching_rank(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(KILLHOOK), "RANK": "0", "GPUVAL_TEST_KILL_RANK": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, sitecustomize; print('torch' in sys.modules)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


class _Writes:
    """A pipe's end as rich sees it: not a terminal, every write kept apart."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@pytest.mark.parametrize("make", ["accept", "eval"])
def test_a_progress_display_into_a_pipe_ends_each_write_with_a_whole_line(make, monkeypatch):
    """A rank the launcher stops between two writes must not leave a line open for the launcher's one
    `gpuval:` line to be glued to (CI once saw `⠹ collectives … 0:00:00gpuval: rank 1 died …`)."""
    from rich.console import Console

    from gpuval.cli import options
    from gpuval.report import finetune as report_finetune

    sink = _Writes()
    console = Console(file=sink, width=80)
    if make == "accept":
        monkeypatch.setattr(options, "err_console", console)
        bar = options.progress()
        with bar:
            task = bar.add_task("all_reduce 4096 B", total=2, bench="collectives")
            bar.advance(task)
            bar.console.print("gpuval: collectives failed on rank 0")
    else:
        monkeypatch.setattr(report_finetune, "Console", lambda **_: console)
        bar = report_finetune.eval_progress()
        task = bar.add_task("held-out", total=4)
        bar.advance(task)
        bar.stop()
    frames = [text for text in sink.writes if text]
    assert any("━" in text for text in frames), frames  # the last frame was written …
    assert all(text.endswith("\n") for text in frames), frames  # … with the newline that ends it


@pytest.mark.dist
def test_dead_rank_bench(tmp_path, tmp_path_factory):
    out = tmp_path / "bench.json"
    temp = tmp_path_factory.mktemp("tmpdir")
    proc = _gpuval(
        [
            "bench",
            "collectives",
            "--nproc",
            "2",
            "--set",
            "min_bytes=4KiB",
            "--set",
            "max_bytes=16KiB",
            "--set",
            "warmup=1",
            "--set",
            "iters=1",
            "--set",
            "repeats=1",
            "--output",
            str(out),
        ],
        tmp_path,
        kill_rank="1",
        tmpdir=temp,
    )
    _assert_dead_rank_reported(proc)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []
    # the launcher's exit-code folder goes too, also when a rank died
    assert not list(temp.glob("gpuval-exit-*"))


@pytest.mark.dist
def test_dead_rank_accept(tmp_path):
    profile = tmp_path / "tiny.yaml"
    profile.write_text(
        "name: tiny\n"
        "runtime: {timeout_s: 60}\n"
        "checks:\n"
        "  all_reduce.busbw_gbps: {min: 0.000001, bytes: 4KiB}\n"
        "benchmarks:\n"
        "  collectives: {min_bytes: 4KiB, max_bytes: 4KiB, warmup: 0, iters: 1, repeats: 1}\n"
    )
    results = tmp_path / "results"
    proc = _gpuval(
        ["accept", "--profile", str(profile), "--output", str(results), "--nproc", "2"],
        tmp_path,
        kill_rank="1",
    )
    _assert_dead_rank_reported(proc)
    assert not (results / "result.json").exists()
    assert not (results / "junit.xml").exists()


@pytest.mark.parametrize(("local_rank", "visible", "expected"), [(0, 8, 0), (5, 8, 5), (3, 1, 0), (0, 1, 0)])
def test_gpu_index_binds_local_rank_or_the_only_visible_gpu(local_rank, visible, expected):
    assert rt.gpu_index(local_rank, visible) == expected


def test_gpu_index_without_a_gpu_for_the_rank_is_a_one_line_error():
    with pytest.raises(RunError, match=r"local rank 4 has no GPU: 2 visible"):
        rt.gpu_index(4, 2)


@pytest.mark.parametrize(
    ("device", "visible", "expected"),
    [
        (("cpu", None), None, "cpu:n1/1"),
        (("cuda", 1), None, "gpu:n1/1"),
        (("cuda", 0), "5", "gpu:n1/5"),  # srun --gpus-per-task=1: the task's only GPU is the node's GPU 5
        (("cuda", 1), "4,6", "gpu:n1/6"),
        (("cuda", 0), "GPU-1234", "gpu:n1/0"),  # UUIDs: no number to map to, CUDA's own index is kept
    ],
)
def test_device_scope_uses_the_nodes_gpu_numbering(monkeypatch, device, visible, expected):
    from types import SimpleNamespace

    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    runtime = rt.Runtime(
        rank=1,
        world_size=2,
        local_rank=1,
        local_world_size=2,
        node_rank=0,
        node_name="n1",
        backend="gloo",
        device=SimpleNamespace(type=device[0], index=device[1]),
        launcher="torchrun",
        timeout_s=60,
    )
    assert runtime.device_scope == expected


@pytest.mark.parametrize("had_peers, expected_atexit", [(False, "atexit ran"), (True, "")])
def test_leave_process_keeps_the_output_and_the_exit_code(had_peers, expected_atexit):
    """A rank that had peers skips interpreter finalization (runtime.Runtime.shutdown says why) but must
    still deliver what it printed and its exit code; a lone process exits the ordinary way."""
    script = (
        "import atexit, sys\n"
        "from gpuval import runtime\n"
        f"runtime._HAD_PEERS = {had_peers}\n"
        "atexit.register(lambda: print('atexit ran', file=sys.stderr))\n"
        "print('verdict line', end='')\n"  # a pipe is block-buffered: lost unless flushed
        "sys.stderr.write('err line')\n"
        "runtime.leave_process(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stdout == "verdict line"
    assert (
        proc.stderr.startswith("err line") and proc.stderr.removeprefix("err line").strip() == expected_atexit
    )


def test_exit_now_runs_the_exit_handlers_and_waits_for_threads_but_skips_finalization():
    """The program's exit (gpuval.exiting.exit_now, through gpuval.cli.run): what a user can see of an
    exit stays (output, exit code, atexit handlers, a non-daemon thread's last words), the interpreter's
    teardown goes (an object whose finalizer would print at teardown never prints)."""
    script = (
        "import atexit, sys, threading, time\n"
        "from gpuval import exiting\n"
        "class Torn:\n"
        "    def __del__(self):\n"
        "        sys.stderr.write('torn down')\n"
        "kept = Torn()\n"  # a module global: freed only by the interpreter's finalization
        "atexit.register(lambda: sys.stderr.write('atexit ran;'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), sys.stderr.write('thread done;'))).start()\n"
        "print('verdict line', end='')\n"
        "exiting.exit_now(4)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (4, "verdict line", "thread done;atexit ran;")
    ordinary = subprocess.run(
        [sys.executable, "-c", script.replace("exiting.exit_now(4)", "sys.exit(4)")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ordinary.stderr.endswith("torn down")  # the teardown the check above would see


def test_the_program_exits_through_exit_now(tmp_path):
    """`python -m gpuval` ends by gpuval.exiting.exit_now, with main's exit code and its one line."""
    hook = tmp_path / "sitecustomize.py"
    hook.write_text(
        "import atexit, sys\n"
        "class Torn:\n"
        "    def __del__(self):\n"
        "        sys.stderr.write('torn down')\n"
        "sys.modules['gpuval_test_torn'] = Torn()\n"
        "atexit.register(lambda: sys.stderr.write('atexit ran'))\n"
    )
    env = cli_env(PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, "-m", "gpuval", "report", str(tmp_path / "missing.json")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("gpuval: ") and lines[-1] == "atexit ran", proc.stderr
    assert "torn down" not in proc.stderr


@pytest.mark.dist
def test_local_turns_let_one_rank_per_node_work_at_a_time(tmp_path):
    """Host<->device copies take turns per node (runtime.local_turns): within a node the working spans
    never overlap; the two nodes' ranks of the same turn work at the same time."""
    import json

    out = tmp_path / "turns.json"
    run_dist_worker("turns_worker.py", str(out), nproc=4, cwd=tmp_path)
    spans = {(node, local): spans for node, local, spans in json.loads(out.read_text())}
    assert all(len(s) == 1 for s in spans.values())  # one turn each
    (a0,), (a1,), (b0,), (b1,) = spans[0, 0], spans[0, 1], spans[1, 0], spans[1, 1]
    for first, second in ((a0, a1), (b0, b1)):  # a node's ranks: local rank 0 first, no overlap
        assert first[1] <= second[0]
    for one, other in ((a0, b0), (a1, b1)):  # one turn across nodes: overlapping spans
        assert one[0] < other[1] and other[0] < one[1]

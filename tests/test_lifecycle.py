"""Process lifecycle of a run (issue 19): a hung rank, a killed or interrupted launcher, two trainers.

Every run here is a real `gpuval` child process with 2 gloo ranks (or one process), a rank made to hang
by tests/dist/hanghook/sitecustomize.py. Each test asserts the exit code, the seconds it took, that no
worker process outlives the run (a /proc scan of the pids the workers registered), and that no PASS
result was written.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_env

HANGHOOK = Path(__file__).parent / "dist" / "hanghook"
TINY_CPU = Path(__file__).parents[1] / "configs" / "finetune" / "tiny-cpu.yaml"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG, /proc")


def _profile(tmp_path: Path, timeout_s: float | None = None) -> Path:
    """A profile of one tiny collective; without `timeout_s`, the default collective timeout (no
    runtime.timeout_s ends a hang early)."""
    profile = tmp_path / "tiny.yaml"
    profile.write_text(
        "name: tiny\n"
        + (f"runtime: {{timeout_s: {timeout_s}}}\n" if timeout_s is not None else "")
        + "checks:\n"
        "  all_reduce.busbw_gbps: {min: 0.000001, bytes: 4KiB}\n"
        "benchmarks:\n"
        "  collectives: {min_bytes: 4KiB, max_bytes: 4KiB, warmup: 0, iters: 1, repeats: 1}\n"
    )
    return profile


def _start(args: list[str], tmp_path: Path, hang: str, rank: str = "1") -> subprocess.Popen[str]:
    """`gpuval ARGS` in the background, rank RANK hanging ('stop' or 'sleep') at its first all_reduce."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = cli_env(
        PYTHONPATH=os.pathsep.join(filter(None, [str(HANGHOOK), os.environ.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        TMPDIR=str(tmp_path / "tmp"),  # the launcher's exit folder lands here, where the test sees it
        GPUVAL_TEST_HANG=hang,
        GPUVAL_TEST_HANG_RANK=rank,
        GPUVAL_TEST_HANG_MARK=str(tmp_path / "hung"),
    )
    return subprocess.Popen(
        [sys.executable, "-m", "gpuval", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"gpuval ended (exit {proc.returncode}) before {path.name} appeared:\n{out}{err}")
        assert time.monotonic() < deadline, f"{path.name} did not appear in {timeout} s"
        time.sleep(0.1)


def _worker_pids(tmp_path: Path) -> list[int]:
    """The pids the workers registered in the launcher's exit folder (launch.worker_start)."""
    return [int(p.read_text()) for p in (tmp_path / "tmp").glob("gpuval-exit-*/pid-*") if p.read_text()]


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a killed orphan may wait a moment for its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def _assert_gone(pids: list[int], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [pid for pid in pids if _alive(pid)]
    for pid in survivors:  # do not leave them behind for the next test, then fail
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"worker process(es) {survivors} outlived the run"


def _finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"gpuval did not end within {timeout} s:\n{out}{err}")
    return proc.returncode, out, err


def _no_pass_result(results: Path) -> None:
    result = results / "result.json"
    if result.exists():
        assert json.loads(result.read_text()).get("verdict") != "PASS"


def _gpuval_processes(marker: str) -> list[int]:
    """Live processes whose environment holds MARKER (a path unique to the test): every rank, whoever
    started it (gpuval's launcher, torchrun), and the launcher itself."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes() and _alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _one_gpuval_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("gpuval:")]
    assert len(lines) == 1, err
    return lines[0]


def _assert_ended_by_deadline(
    proc: subprocess.Popen[str], tmp_path: Path, hang: str, within_s: float, began: float
) -> str:
    """The run ends with exit 3 within WITHIN_S of the hang, one `gpuval:` line naming rank 1, its phase and
    its silence (or its overrun), no traceback, no process left; returns the line."""
    _wait_for(tmp_path / "hung", proc, timeout=120)
    hung_at = time.monotonic()
    code, out, err = _finish(proc, timeout=within_s + 60)
    took = time.monotonic() - hung_at
    assert code == 3, out + err
    assert took < within_s, f"{took:.1f} s from the hang to the end (started {hung_at - began:.0f} s in)"
    assert "Traceback" not in out + err, out + err
    line = _one_gpuval_line(err)
    assert line.startswith("gpuval: rank 1 "), line
    assert "in phase '" in line, line
    if hang == "stop":
        assert re.search(r"rank 1 \(stopped by a signal\) silent for \d+ s in phase '", line), line
    else:  # the rank's heartbeat goes on: its phase overran its deadline, and the line says where it is
        assert re.search(r"rank 1 still in phase '[^']+' \d+ s after it began", line), line
        assert "at _hang (sitecustomize.py" in line, line
    _assert_gone(_gpuval_processes(str(tmp_path / "hung")))
    return line


@pytest.mark.parametrize("hang", ["stop", "sleep"])
@pytest.mark.dist
def test_a_hung_rank_ends_a_self_launched_accept_with_exit_3(tmp_path, hang):
    """`kill -STOP` on a rank (or a rank blocked for ever), with the default collective timeout: the ranks'
    watchdog ends the run — a stopped rank once silent for SILENT_S, a hung one at its phase's deadline
    (the collectives phase's plan is a fraction of a second, so MARGIN_S) — and rank 0 leaves an ERROR
    result naming it; the launcher stops the stopped rank."""
    from gpuval.deadline import BEAT_S, MARGIN_S, SILENT_S

    results = tmp_path / "results"
    began = time.monotonic()
    proc = _start(
        ["accept", "--profile", str(_profile(tmp_path)), "--output", str(results), "--nproc", "2"],
        tmp_path,
        hang,
    )
    within = (SILENT_S if hang == "stop" else MARGIN_S + 1) + 2 * BEAT_S + 10
    line = _assert_ended_by_deadline(proc, tmp_path, hang, within, began)
    assert "'collectives'" in line, line
    result = json.loads((results / "result.json").read_text())
    assert result["verdict"] == "ERROR"
    assert [c["name"] for c in result["checks"]] == ["run.ranks"]
    assert result["checks"][0]["detail"] == line.removeprefix("gpuval: ")
    assert not list((tmp_path / "tmp").glob("gpuval-exit-*"))


@pytest.mark.dist
def test_a_stopped_rank_ends_gpuval_bench_with_exit_3(tmp_path):
    from gpuval.deadline import BEAT_S, SILENT_S

    out = tmp_path / "bench.json"
    sets = ["min_bytes=4KiB", "max_bytes=16KiB", "warmup=1", "iters=1", "repeats=1"]
    began = time.monotonic()
    proc = _start(
        ["bench", "collectives", "--nproc", "2", *[f"--set={s}" for s in sets], "--output", str(out)],
        tmp_path,
        "stop",
    )
    line = _assert_ended_by_deadline(proc, tmp_path, "stop", SILENT_S + 2 * BEAT_S + 10, began)
    assert "'collectives'" in line, line
    assert not out.exists()


@pytest.mark.dist
def test_a_stopped_rank_ends_a_two_rank_finetune_with_exit_3(tmp_path):
    pytest.importorskip("peft")
    from gpuval.deadline import BEAT_S, SILENT_S

    config = _tiny_training(tmp_path)
    began = time.monotonic()
    proc = _start(["finetune", "train", "--config", str(config), "--nproc", "2"], tmp_path, "stop")
    line = _assert_ended_by_deadline(proc, tmp_path, "stop", SILENT_S + 2 * BEAT_S + 10, began)
    assert "'train " in line, line  # the model's set-up or a step
    assert not (tmp_path / "run" / "adapter").exists()


@pytest.mark.dist
def test_a_stopped_rank_ends_accept_under_external_torchrun(tmp_path):
    """Not gpuval's launcher: rank 0 prints the line and SIGKILLs the stopped rank of its host (torchrun
    would wait for it), torchrun then reports rank 0's exit code 3."""
    from gpuval.deadline import BEAT_S, SILENT_S

    results = tmp_path / "results"
    env = cli_env(
        PYTHONPATH=os.pathsep.join(filter(None, [str(HANGHOOK), os.environ.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        GPUVAL_TEST_HANG="stop",
        GPUVAL_TEST_HANG_RANK="1",
        GPUVAL_TEST_HANG_MARK=str(tmp_path / "hung"),
    )
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    command = [torchrun, "--standalone", "--nproc-per-node=2", "-m", "gpuval", "accept"]
    began = time.monotonic()
    proc = subprocess.Popen(
        [*command, "--profile", str(_profile(tmp_path)), "--output", str(results)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for(tmp_path / "hung", proc, timeout=120)
    hung_at = time.monotonic()
    code, out, err = _finish(proc, timeout=SILENT_S + 60)
    took = time.monotonic() - hung_at
    assert code != 0, out + err
    assert re.search(r"exitcode\s*:\s*3\b", err), err  # torchrun's summary: rank 0 ended with 3
    assert took < SILENT_S + 2 * BEAT_S + 10, f"{took:.1f} s (started {hung_at - began:.0f} s in)"
    line = _one_gpuval_line(err)
    assert re.match(r"gpuval: rank 1 \(stopped by a signal\) silent for \d+ s in phase 'collectives'", line)
    assert json.loads((results / "result.json").read_text())["verdict"] == "ERROR"
    _assert_gone(_gpuval_processes(str(tmp_path / "hung")))


@pytest.mark.dist
def test_killing_the_launcher_takes_its_workers_with_it(tmp_path):
    results = tmp_path / "results"
    proc = _start(
        ["accept", "--profile", str(_profile(tmp_path, 60)), "--output", str(results), "--nproc", "2"],
        tmp_path,
        "sleep",
    )
    _wait_for(tmp_path / "hung", proc)
    pids = _worker_pids(tmp_path)
    assert len(pids) == 2
    proc.kill()
    code, _out, _err = _finish(proc)
    assert code == -signal.SIGKILL
    _assert_gone(pids, within=5.0)  # PR_SET_PDEATHSIG: the kernel kills them with the launcher
    _no_pass_result(results)


@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
@pytest.mark.dist
def test_a_signal_to_the_launcher_stops_every_rank_with_one_line(tmp_path, sig, expected):
    results = tmp_path / "results"
    proc = _start(
        ["accept", "--profile", str(_profile(tmp_path, 60)), "--output", str(results), "--nproc", "2"],
        tmp_path,
        "sleep",
    )
    _wait_for(tmp_path / "hung", proc)
    pids = _worker_pids(tmp_path)
    began = time.monotonic()
    proc.send_signal(sig)
    code, out, err = _finish(proc, timeout=30)
    took = time.monotonic() - began
    assert code == expected, out + err
    assert took < 10, f"{took:.1f} s from the signal to the exit"
    assert "Traceback" not in out + err, out + err
    lines = [line for line in err.splitlines() if line.startswith("gpuval:")]
    assert lines == [f"gpuval: interrupted ({sig.name}); 2 ranks stopped"], err
    assert err.strip().splitlines()[-1] == lines[0], err
    _assert_gone(pids)
    _no_pass_result(results)
    assert list((tmp_path / "tmp").iterdir()) == []  # no exit folder, no torchelastic_* log folder


def _tiny_training(tmp_path: Path) -> Path:
    """tiny-cpu.yaml on a dozen synthetic records, for many steps: a trainer that runs until stopped."""
    import yaml

    from gpuval.finetune.data.prepare import SourceRecord, convert_all
    from gpuval.finetune.data.synth import synth_records

    records = [SourceRecord(f"record {i}", r) for i, r in enumerate(synth_records(12, seed=3))]
    conversations, _skipped = convert_all(records)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(c) + "\n" for c in conversations), encoding="utf-8")
    config = yaml.safe_load(TINY_CPU.read_text())
    config.pop("synth", None)
    config.pop("prepare", None)
    config["data"] = {"train": str(train), "max_seq_len": 256}
    config["train"].update(max_steps=10000)
    config["train"]["optim"]["warmup_steps"] = 1
    config["train"]["save"]["every_steps"] = 0
    config["output"] = str(tmp_path / "run")
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.dist
def test_a_second_trainer_on_the_same_output_is_refused(tmp_path):
    pytest.importorskip("peft")
    config = _tiny_training(tmp_path)
    lock = tmp_path / "run" / ".gpuval.lock"
    first = _start(["finetune", "train", "--config", str(config)], tmp_path, "sleep", rank="none")
    deadline = time.monotonic() + 30
    while not (lock.exists() and lock.read_text().strip() == str(first.pid)):
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "the first trainer did not take the lock"
        time.sleep(0.1)

    began = time.monotonic()
    second = subprocess.run(
        [sys.executable, "-m", "gpuval", "finetune", "train", "--config", str(config)],
        cwd=tmp_path,
        env=cli_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - began
    assert second.returncode == 2, second.stdout + second.stderr
    assert took < 15, f"{took:.1f} s"
    assert "Traceback" not in second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert (
        lines[0].startswith("gpuval: output ") and f"in use by another trainer (pid {first.pid})" in lines[0]
    )

    # SIGTERM to a single-process run: exit 143, one line, and the lock is free again
    first.send_signal(signal.SIGTERM)
    code, out, err = _finish(first, timeout=30)
    assert code == 143, out + err
    assert "Traceback" not in out + err
    assert err.strip().splitlines()[-1] == "gpuval: interrupted (SIGTERM)", err
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if a lock outlived its trainer


@pytest.mark.dist
def test_under_external_torchrun_a_failing_rank_still_prints_its_line(tmp_path):
    """Not gpuval's launcher: torchrun ends the run; rank 0 still says in one line what went wrong."""
    killhook = Path(__file__).parent / "dist" / "killhook"
    results = tmp_path / "results"
    began = time.monotonic()
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("torchrun")),
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "gpuval",
            "accept",
            "--profile",
            str(_profile(tmp_path, 10)),
            "--output",
            str(results),
        ],
        cwd=tmp_path,
        env=cli_env(PYTHONPATH=str(killhook), GPUVAL_TEST_KILL_RANK="1", OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - began
    assert proc.returncode != 0
    assert took < 40, f"{took:.1f} s"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gpuval: ")]
    assert any("rank 0" in line for line in lines), proc.stderr
    _no_pass_result(results)


def test_a_rank_of_an_external_launcher_stopped_by_it_says_so_in_one_line(tmp_path):
    """When a peer fails, torchrun SIGTERMs the other ranks, often before rank 0 has seen the peer go (CI on
    a loaded machine, 2026-12-06: rank 0 ended by SIGTERM without a word). Rank 0 of an external launcher
    now says in one line that the launcher stopped it, and exits 143 with no PASS; another rank ends
    quietly. Two ranks started as torchrun starts them; rank 0 sleeps at its first all_reduce (the hang
    hook) when SIGTERM comes."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    mark, results = tmp_path / "hung", tmp_path / "results"
    args = ["accept", "--profile", str(_profile(tmp_path, 60)), "--output", str(results)]
    ranks = []
    for rank in ("0", "1"):
        env = cli_env(
            PYTHONPATH=str(HANGHOOK),
            OMP_NUM_THREADS="1",
            GPUVAL_TEST_HANG="sleep",
            GPUVAL_TEST_HANG_RANK="0",
            GPUVAL_TEST_HANG_MARK=str(mark),
            RANK=rank,  # what torchrun gives each rank
            LOCAL_RANK=rank,
            WORLD_SIZE="2",
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        ranks.append(
            subprocess.Popen(
                [sys.executable, "-m", "gpuval", *args],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        deadline = time.monotonic() + 90
        while not mark.exists() and ranks[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mark.exists(), ranks[0].communicate(timeout=30)
        ranks[0].send_signal(signal.SIGTERM)
        out, err = ranks[0].communicate(timeout=30)
    finally:
        for proc in ranks:
            proc.kill()
            proc.communicate()
    lines = [line for line in err.splitlines() if line.startswith("gpuval: ")]
    assert ranks[0].returncode == 128 + signal.SIGTERM, err
    assert len(lines) == 1 and "(SIGTERM); rank 0 of 2: torchrun stopped this rank" in lines[0], err
    _no_pass_result(results)


def test_a_killed_launchers_exit_folder_is_swept_by_the_next_launch(tmp_path):
    """SIGKILL runs no `finally`: the next launcher removes exit folders whose launcher is gone, and only
    those (a live launcher's folder stays)."""
    from gpuval.launch import _sweep_stale_exit_dirs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"gpuval-exit-{gone.pid}-abc123"
    live = tmp_path / f"gpuval-exit-{os.getpid()}-def456"
    other = tmp_path / "gpuval-exit-notapid"
    for folder in (stale, live, other):
        (folder / "sub").mkdir(parents=True)
    _sweep_stale_exit_dirs(tmp_path)
    assert not stale.exists() and live.exists() and other.exists()


def test_a_signal_that_a_library_turns_into_its_own_error_still_ends_in_one_line(monkeypatch, capsys):
    """SIGTERM arriving inside an import: transformers' lazy import turns what the signal raised into a
    RuntimeError of its own. The signal, not the error, decides: exit 143 and one line, no traceback."""
    from gpuval import cli
    from gpuval.errors import Interrupted

    def importing_library(*_args, **_kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler main() installed raises Interrupted here
        except Interrupted as exc:
            raise RuntimeError("Failed to import transformers.models.qwen2") from exc

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(cli, "app", importing_library)
    monkeypatch.setattr(sys, "argv", ["gpuval", "finetune", "train"])
    for key in ("RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    try:
        with pytest.raises(SystemExit) as ended:
            cli.main()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert ended.value.code == 143
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["gpuval: interrupted (SIGTERM)"], err


def test_a_signal_inside_an_import_ends_in_one_line_without_unwinding_through_it(tmp_path):
    """SIGTERM while a module is being imported: raising there may cross C++ (torch's extension init calls
    back into Python, and pybind11 aborts the process on an exception it cannot pass on). The run ends in
    one line with 143, and the code after the signal never runs."""
    (tmp_path / "slow_import.py").write_text(
        "import os, signal, time\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(2)\n"
        # what a C++ frame between the handler and the importer does: the exception does not pass through
        "except BaseException:\n"
        "    pass\n"
        "print('the import went on after the signal')\n"
    )
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from gpuval import cli\n"
        "cli.app = lambda **kwargs: __import__('slow_import')\n"
        "sys.argv = ['gpuval', 'finetune', 'train']\n"
        "cli.main()\n"
    )
    env = {k: v for k, v in cli_env().items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 143, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == ["gpuval: interrupted (SIGTERM)"], done.stderr
    assert "went on" not in done.stdout

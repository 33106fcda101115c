"""deploy/slurm/ against a real Slurm: a 2-node cluster on this host (deploy/slurm/local-cluster.sh, Debian's
slurmctld/slurmd/munge), the project's own sbatch scripts submitted with `sbatch --wait`.

Needs root and the Slurm packages; skipped without them, except where GPUVAL_REQUIRE_SLURM=1 (.ci/run sets
it after installing them), so CI can never pass by skipping.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_env

from gpuval.config import load_profile

REPO = Path(__file__).resolve().parents[1]
SLURM = REPO / "deploy" / "slurm"
CLUSTER = SLURM / "local-cluster.sh"

pytestmark = pytest.mark.slurm  # every test here runs jobs on the real cluster (slow, by conftest)


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (munged runs as the munge user)"
    for tool in ("slurmctld", "slurmd", "sbatch", "munged"):
        if not (shutil.which(tool) or Path("/usr/sbin", tool).exists()):
            return f"{tool} is not installed (apt-get install slurmctld slurmd slurm-client munge)"
    return None


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    why = _missing()
    if why:
        if os.environ.get("GPUVAL_REQUIRE_SLURM") == "1":
            pytest.fail(f"GPUVAL_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("slurm")
    port = str(30000 + os.getpid() % 20000)  # a cluster of its own, beside any other on this host
    # No launcher variables from this process (an earlier test's RANK/WORLD_SIZE would make every task a
    # world of one): the jobs' ranks come from Slurm alone.
    env = cli_env(SLURMCTLD_PORT=port, PATH=os.environ["PATH"] + ":/usr/sbin")
    started = subprocess.run(
        [str(CLUSTER), "start", str(folder)], env=env, capture_output=True, text=True, timeout=120
    )
    assert started.returncode == 0, started.stdout + started.stderr
    env["SLURM_CONF"] = str(folder / "slurm.conf")
    env["GPUVAL_PYTHON"] = sys.executable
    env["OMP_NUM_THREADS"] = "1"  # both "nodes" share this host's cores: one thread per rank
    yield env
    subprocess.run([str(CLUSTER), "stop", str(folder)], env=env, capture_output=True, timeout=60)


def _run(command: list[str], env: dict, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _job_output(cwd: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(cwd.glob("*.out")))


def test_accept_on_two_nodes_passes_with_both_nodes_in_the_result(slurm, tmp_path):
    out = tmp_path / "results"
    socket_env = REPO / "deploy" / "env" / "socket.env"
    env = {**slurm, "GPUVAL_OUTPUT": str(out), "GPUVAL_ENV": str(socket_env)}
    job = _run(
        ["sbatch", "--wait", "--nodes=2", "--ntasks-per-node=1", str(SLURM / "accept.sbatch"), "--quick"],
        env,
        tmp_path,
    )
    log = _job_output(tmp_path)
    assert job.returncode == 0, job.stderr + log  # the job's exit code is the verdict
    result = json.loads((out / "result.json").read_text(encoding="utf-8"))
    assert result["verdict"] == "PASS"
    assert result["world"] == {"size": 2, "nodes": 2, "backend": "gloo"}
    assert [n["node"] for n in result["inventory"]["nodes"]] == ["node1", "node2"]
    assert result["inventory"]["launcher"] == "slurm"
    # the NCCL environment profile the script sourced reached every node's tasks, and result.json says so
    for inventory in result["inventory"]["nodes"]:
        assert inventory["communication"]["profile"] == "socket"
        assert inventory["communication"]["variables"]["NCCL_IB_DISABLE"] == "1"
    [comm] = [c for c in result["checks"] if c["name"] == "fleet.communication_env"]
    assert comm["status"] == "PASS"
    shared = [c for c in result["checks"] if c["name"] == "fleet.shared_fs"]
    assert {c["scope"] for c in shared} == {"node:node1", "node:node2"}
    assert all(c["status"] == "PASS" for c in shared)
    # the smoke tests ran first: node states, then one line per node from its own task
    assert "== partition and nodes" in log and "node1: " in log and "node2: " in log


def test_one_failing_node_is_named_and_the_verdict_is_the_jobs_exit_code(slurm, tmp_path):
    """node2 answers NVML with a recorded H100 (tests/dist/nvmlhook), which the CPU profile does not
    expect: its health FAILs, node1's passes. The job exits 1 and result.json blames node2 alone. node2's
    rank runs on the CPU although NVML lists a GPU there, so no benchmark runs at all (it would measure a
    CPU standing in for the GPU): every benchmark check is SKIP naming node2's cuda.visible. node2's rank
    leaves late, as on a loaded node: Slurm kills it once node1's rank exited with FAIL's 1, and the job's
    code is still FAIL's (accept.sbatch reads this run's verdict), not the killed task's."""
    hook = Path(__file__).parent / "dist" / "nvmlhook"
    path = os.pathsep.join(filter(None, [str(hook), slurm.get("PYTHONPATH")]))
    env = {
        **slurm,
        "GPUVAL_OUTPUT": str(tmp_path / "results"),
        "PYTHONPATH": path,
        "GPUVAL_TEST_NVML_NODE": "node2",
        "GPUVAL_TEST_SLOW_EXIT_NODE": "node2",  # leaves 5 s after node1's FAIL exit: Slurm kills it
    }
    job = _run(
        [
            "sbatch",
            "--wait",
            "--nodes=2",
            "--ntasks-per-node=1",
            str(SLURM / "accept.sbatch"),
            "--profile",
            "cpu",  # the same on both nodes: node2 alone would pick h100-sxm for its recorded GPU
            "--quick",
        ],
        env,
        tmp_path,
    )
    assert job.returncode == 1, job.stderr + _job_output(tmp_path)
    result = json.loads((tmp_path / "results" / "result.json").read_text(encoding="utf-8"))
    assert result["verdict"] == "FAIL"
    failed = [c for c in result["checks"] if c["status"] == "FAIL"]
    assert ("expect.gpu_count", "node:node2") in {(c["name"], c["scope"]) for c in failed}
    for check in failed:  # nothing blames node1: node2's own checks, or fleet checks that name node2
        assert ":node2" in check["scope"] or (check["scope"] == "cluster" and "(node2: " in check["detail"])
    [cuda] = [c for c in result["checks"] if c["name"] == "cuda.visible" and c["scope"] == "node:node2"]
    assert cuda["status"] == "ERROR" and "built without CUDA" in cuda["detail"]  # this torch has no CUDA
    assert result["measurements"] == []
    benchmark_checks = [c for c in result["checks"] if c["name"] in load_profile("cpu").checks]
    assert benchmark_checks and {c["status"] for c in benchmark_checks} == {"SKIP"}
    assert all("node2: cuda.visible ERROR on node:node2" in c["detail"] for c in benchmark_checks)


def test_a_stopped_rank_ends_the_job_with_exit_3_naming_it(slurm, tmp_path):
    """Rank 1 (node2's task) stops itself with SIGSTOP at its first all_reduce (tests/dist/hanghook), with
    no timeout set. Under srun rank 0 hosts the rendezvous store: its watchdog finds rank 1 silent past
    the 20 s limit, writes result.json saying ERROR, says one line and ends; srun then reports a task
    ended by a signal, and the job's exit code is still gpuval's ERROR, 3."""
    hook = Path(__file__).parent / "dist" / "hanghook"
    env = {
        **slurm,
        "GPUVAL_OUTPUT": str(tmp_path / "results"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), slurm.get("PYTHONPATH")])),
        "GPUVAL_TEST_HANG_RANK": "1",
        "GPUVAL_TEST_HANG": "stop",
        "GPUVAL_TEST_HANG_MARK": str(tmp_path / "hung"),
    }
    began = time.monotonic()
    job = _run(
        ["sbatch", "--wait", "--nodes=2", "--ntasks-per-node=1", str(SLURM / "accept.sbatch"), "--quick"],
        env,
        tmp_path,
        timeout=300,
    )
    took = time.monotonic() - began
    log = _job_output(tmp_path)
    assert (tmp_path / "hung").exists(), log  # rank 1 did stop mid-run
    assert job.returncode == 3, job.stderr + log
    lines = [line for line in log.splitlines() if line.startswith("gpuval: ")]
    assert len(lines) == 1, log
    assert re.search(r"rank 1 \(stopped by a signal\) silent for \d+ s in phase '", lines[0]), lines[0]
    result = json.loads((tmp_path / "results" / "result.json").read_text(encoding="utf-8"))
    assert result["verdict"] == "ERROR"
    assert [c["name"] for c in result["checks"]] == ["run.ranks"]
    assert took < 180, f"{took:.0f} s for the whole job"


def test_tiny_finetune_trains_with_ddp_across_two_nodes(slurm, tmp_path):
    run = tmp_path / "run"
    job = _run(
        [
            "sbatch",
            "--wait",
            "--nodes=2",
            "--ntasks-per-node=1",
            str(SLURM / "finetune.sbatch"),
            "run",
            "--config",
            str(REPO / "configs" / "finetune" / "tiny-cpu.yaml"),
            "--output",
            str(run),
            "--set",
            "synth.n=120",
            "--set",
            "synth.holdout_n=10",
            "--set",
            "train.max_steps=4",
            "--set",
            "train.save.every_steps=0",
            "--set",
            "eval.max_examples=4",
            "--set",
            "eval.max_new_tokens=48",
            "--set",
            "eval.base_model=false",
        ],
        slurm,
        tmp_path,
    )
    assert job.returncode == 0, job.stderr + _job_output(tmp_path)
    summary = json.loads((run / "train_summary.json").read_text(encoding="utf-8"))
    assert summary["world_size"] == 2 and summary["final_step"] == 4
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    assert (run / "eval.json").is_file()


def _node(env: dict, name: str) -> str:
    return _run(["scontrol", "show", "node", name], env, Path.cwd(), timeout=30).stdout


def test_health_fail_drains_the_node_with_the_gpuval_reason_and_error_leaves_it(slurm, tmp_path):
    check = str(SLURM / "healthcheck.sh")
    try:
        fail = {**slurm, "GPUVAL_HEALTH_ARGS": "--profile cpu --set expect.gpu_count=8"}
        proc = _run(["srun", "-w", "node1", "-N1", "-n1", check], fail, tmp_path, timeout=180)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        node1 = _node(slurm, "node1")
        assert "DRAIN" in node1 and "Reason=gpuval: expect.gpu_count (node:node1)" in node1, node1

        broken = {**slurm, "GPUVAL_HEALTH_ARGS": f"--profile {tmp_path / 'missing.yaml'}"}
        proc = _run(["srun", "-w", "node2", "-N1", "-n1", check], broken, tmp_path, timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "could not check node2 (exit 2)" in proc.stderr
        node2 = _node(slurm, "node2")
        assert "DRAIN" not in node2 and "Reason=" not in node2, node2
    finally:
        for name in ("node1", "node2"):
            _run(["scontrol", "update", f"NodeName={name}", "State=RESUME"], slurm, tmp_path, timeout=30)


def test_a_checker_that_cannot_start_never_drains(slurm, tmp_path):
    """`python3 -m gpuval` without gpuval installed exits 1, like a FAIL: without a result it is an ERROR."""
    env = {**slurm, "GPUVAL_PYTHON": "/usr/bin/false", "GPUVAL_PROFILE": "cpu"}
    try:
        proc = _run(["srun", "-w", "node1", "-N1", "-n1", str(SLURM / "healthcheck.sh")], env, tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "could not check node1 (exit 3)" in proc.stderr
        assert "DRAIN" not in _node(slurm, "node1")
    finally:
        _run(["scontrol", "update", "NodeName=node1", "State=RESUME"], slurm, tmp_path, timeout=30)


def test_a_node_gpuval_drained_is_resumed_once_healthy_and_one_drained_by_others_stays(slurm, tmp_path):
    """As HealthCheckProgram runs it (outside any job, so a drained node is still checked): FAIL drains
    node1; the next PASS resumes it. node2, drained by an operator, stays drained through a PASS."""
    check = str(SLURM / "healthcheck.sh")
    on = {name: {**slurm, "SLURMD_NODENAME": name, "GPUVAL_PROFILE": "cpu"} for name in ("node1", "node2")}
    try:
        failing = {**on["node1"], "GPUVAL_HEALTH_ARGS": "--set expect.gpu_count=8"}
        proc = _run([check], failing, tmp_path, timeout=180)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "DRAIN" in _node(slurm, "node1")

        proc = _run([check], on["node1"], tmp_path, timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        said = "node1 resumed: health passes (it was drained for 'gpuval: expect.gpu_count (node:node1)')"
        assert said in proc.stderr, proc.stderr
        node1 = _node(slurm, "node1")
        assert "DRAIN" not in node1 and "Reason=" not in node1, node1

        drain = ["scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=maintenance"]
        _run(drain, slurm, tmp_path, timeout=30)
        proc = _run([check], on["node2"], tmp_path, timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "resumed" not in proc.stderr
        node2 = _node(slurm, "node2")
        assert "DRAIN" in node2 and "Reason=maintenance" in node2, node2
    finally:
        for name in ("node1", "node2"):
            _run(["scontrol", "update", f"NodeName={name}", "State=RESUME"], slurm, tmp_path, timeout=30)

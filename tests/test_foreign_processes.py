"""Another program on a tested GPU (issue 18): FAIL in `gpuval accept`, WARN in `gpuval health` by default.

NVML is replayed from the recorded 2xH200 (tests/data/nvml/h200x2.json) with process entries in the shape
pynvml gives them (nvmlDeviceGetComputeRunningProcesses: pid, usedGpuMemory, gpuInstanceId,
computeInstanceId); /proc is a fake tree. Accept's health phase and run_accept run in this process on one
fake rank, with the other health families left out and the benchmarks replaced.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from nvml_replay import ReplayNvml, load

import gpuval.accept as accept
import gpuval.bench.run as suite
import gpuval.health.arrivals as arrivals
import gpuval.health.run as health_run
import gpuval.nvml as nvml
from gpuval.bench.registry import all_benchmarks
from gpuval.bench.run import plan_benchmarks
from gpuval.config import Profile, Threshold, load_profile
from gpuval.errors import UsageError
from gpuval.health import all_checks
from gpuval.results import Measurement, Status

NODE = "n1"
GIB = 2**30
HOG = 4321  # another program's pid
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of a process on a GPU without MIG


def process(pid: int, used_bytes: int | None) -> dict[str, Any]:
    """One entry of nvmlDeviceGetComputeRunningProcesses as pynvml returns it (None: usage not available)."""
    return {
        "pid": pid,
        "usedGpuMemory": used_bytes,
        "gpuInstanceId": NO_INSTANCE,
        "computeInstanceId": NO_INSTANCE,
    }


def occupy(recording: dict, gpu: int, used_bytes: int, processes: list[dict[str, Any]]) -> None:
    device = recording["devices"][gpu]
    memory = device["nvmlDeviceGetMemoryInfo"]
    memory.update(used=used_bytes, free=memory["total"] - used_bytes)
    device["nvmlDeviceGetComputeRunningProcesses"] = processes


@pytest.fixture
def h200() -> dict:
    return load("h200x2")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """/proc with the hog: its name, and its owner root (uid 0, a name every system has)."""
    proc = tmp_path / "root" / "proc" / str(HOG)
    proc.mkdir(parents=True)
    (proc / "comm").write_text("python3\n")
    (proc / "status").write_text("Name:\tpython3\nUmask:\t0022\nState:\tR (running)\nUid:\t0\t0\t0\t0\n")
    return tmp_path / "root"


def profile(*sets: str) -> Profile:
    return load_profile("h200-sxm", ["expect.gpu_count=2", *sets])


def others() -> frozenset[str]:
    """Every health family but processes: what they judge is other tests' business."""
    return frozenset(all_checks()) - {"processes"}


def foreign(recording: dict, root: Path, command: str = "accept", sets=(), own_pids=frozenset()) -> list:
    checks = health_run.node_health(
        profile(*sets),
        NODE,
        library=ReplayNvml(recording),
        root=root,
        kmsg=None,
        own_pids=set(own_pids),
        exclude=others(),
        command=command,
    )
    return [c for c in checks if c.name == "processes.foreign"]


# --- the processes family ---------------------------------------------------------------------------------


def test_another_programs_process_fails_accept_naming_pid_name_user_and_memory(h200, root):
    occupy(h200, 1, 70 * GIB + 600 * 2**20, [process(HOG, 70 * GIB)])
    gpu0, gpu1 = foreign(h200, root)
    assert (gpu0.status, gpu1.status) == (Status.PASS, Status.FAIL)
    assert (gpu1.scope, gpu1.value, gpu1.unit) == ("gpu:n1/1", 1, "processes")
    assert gpu1.detail.startswith(
        "pid 4321 (python3, user root, 70.0 GiB) on GPU 1: benchmarks on it would be skewed or run out of "
        "memory; wait for it to end, stop it, or ask its owner (user root)"
    )
    assert gpu1.detail.endswith("on a shared node set health.foreign_processes: warn")
    assert "\n" not in gpu1.detail


def test_a_process_this_container_cannot_see_in_proc_is_still_named_by_pid(h200, tmp_path):
    occupy(h200, 0, 10 * GIB, [process(HOG, 9 * GIB)])
    [check] = foreign(h200, tmp_path)[:1]
    assert check.status is Status.FAIL
    assert check.detail.startswith("pid 4321 (9.0 GiB) on GPU 0")
    assert "find its owner (ps -o user= -p 4321, on the host in a container)" in check.detail


@pytest.mark.parametrize(
    "command, setting, status",
    [
        ("accept", "auto", Status.FAIL),
        ("accept", "warn", Status.WARN),  # a shared node
        ("accept", "fail", Status.FAIL),
        ("health", "auto", Status.WARN),  # the Slurm health check runs beside user jobs: no drain
        ("health", "fail", Status.FAIL),
    ],
)
def test_the_setting_and_the_command_decide_fail_or_warn(h200, root, command, setting, status):
    occupy(h200, 0, 41 * GIB, [process(HOG, 40 * GIB)])
    check = foreign(h200, root, command, [f"health.foreign_processes={setting}"])[0]
    assert check.status is status
    assert check.detail.startswith("pid 4321 (python3, user root, 40.0 GiB) on GPU 0")
    assert ("health.foreign_processes: warn" in check.detail) is (status is Status.FAIL)


def test_an_unknown_setting_is_rejected():
    with pytest.raises(
        UsageError, match="'health.foreign_processes': Input should be 'auto', 'fail' or 'warn'"
    ):
        profile("health.foreign_processes=sometimes")


def test_gpuvals_own_ranks_pass_and_their_memory_is_theirs(h200, root):
    # as on the 4xH200 run: each rank listed with its context, used minus theirs = the idle 0.6 GiB
    occupy(h200, 0, 2300510208, [process(HOG, 1646264320)])
    occupy(h200, 1, 2948071424, [process(HOG + 1, 1522532352), process(HOG, 765460480)])
    checks = foreign(h200, root, own_pids={HOG, HOG + 1})
    assert [(c.status, c.detail) for c in checks] == [(Status.PASS, "none")] * 2


@pytest.mark.parametrize(
    "used_gib, processes, status",
    [
        (0.6, [], Status.PASS),  # an idle H200 as recorded
        (6.5, [], Status.PASS),  # below 5% of 140.4 GiB (7.0): not clearly someone else's
        (8.0, [], Status.FAIL),
        (70.0, [], Status.FAIL),  # the 70 GiB hog of issue 18, in another container
        (2.2, [process(os.getpid(), None)], Status.PASS),  # own rank whose usage NVML did not give
        (60.6, [process(os.getpid(), 60 * GIB)], Status.PASS),  # all of it gpuval's own
        (70.6, [process(os.getpid(), 10 * GIB)], Status.FAIL),  # 60 GiB nobody listed holds
    ],
)
def test_memory_no_listed_process_holds(h200, root, used_gib, processes, status):
    occupy(h200, 0, int(used_gib * GIB), processes)
    check = foreign(h200, root, own_pids={os.getpid()})[0]
    assert check.status is status, check.detail
    if status is Status.FAIL:
        unseen = used_gib - sum(p["usedGpuMemory"] or 0 for p in processes) / GIB
        assert check.detail.startswith(
            f"{unseen:.1f} GiB in use by processes this node cannot see on GPU 0: "
        )
        assert "nvidia-smi on the host" in check.detail
        assert (check.value, check.unit, check.threshold) == (round(unseen, 1), "GiB", {"max": 7.0})


def test_a_listed_hog_and_unseen_memory_are_both_named(h200, root):
    occupy(h200, 0, 50 * GIB, [process(HOG, 20 * GIB)])
    check = foreign(h200, root)[0]
    assert check.detail.startswith(
        "pid 4321 (python3, user root, 20.0 GiB) and 30.0 GiB in use by processes this node cannot see "
        "on GPU 0"
    )


# --- accept: the health phase, then the benchmarks ----------------------------------------------------------


@dataclass
class OneRank:
    """The parts of gpuval.runtime.Runtime that accept uses, for one rank on node n1."""

    node_name: str = NODE
    rank: int = 0
    local_rank: int = 0
    is_main: bool = True
    launcher: str = "single"
    on_gpu: bool = True  # its benchmarks run on the GPU, as on the lent H100

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def world_info(self) -> dict[str, Any]:
        return {"size": 1, "nodes": 1, "backend": "gloo"}


@pytest.fixture
def replayed(h200, root, monkeypatch) -> dict:
    """Accept's health phase runs the processes family on the replayed H200 and the fake /proc; returns
    the recording to alter."""
    real_snapshot, real_health = nvml.snapshot, health_run.node_health

    def processes_only(*args: Any, **kwargs: Any) -> list:
        return real_health(*args, **{**kwargs, "exclude": others()}, root=root, kmsg=None)

    monkeypatch.setattr(nvml, "snapshot", lambda library=None: real_snapshot(ReplayNvml(h200)))
    monkeypatch.setattr(health_run, "node_health", processes_only)
    monkeypatch.setattr(accept, "node_inventory", lambda node: {"node": node})
    monkeypatch.setattr("gpuval.health.sdc.run_sdc", lambda runtime: [])
    return h200


@pytest.mark.parametrize("command, status", [("accept", Status.FAIL), ("health", Status.WARN)])
def test_health_phase_of_accept_fails_and_of_health_warns(replayed, command, status):
    occupy(replayed, 0, 70 * GIB, [process(HOG, 70 * GIB)])
    _, checks = accept.run_health_phase(OneRank(), profile(), command=command)
    [check] = [c for c in checks if c.name == "processes.foreign" and c.status is not Status.PASS]
    assert (check.status, check.scope) == (status, "gpu:n1/0")
    assert "pid 4321 (python3, user root, 70.0 GiB)" in check.detail


class OutOfMemoryError(RuntimeError):
    """Named as torch.OutOfMemoryError is: the name is what reaches the result."""


def _benchmarks(monkeypatch) -> None:
    """matmul measures both GPUs; train runs out of memory, as beside a 70 GiB hog."""

    def matmul(ctx, options):
        return [
            Measurement(name="matmul", scope=f"gpu:{NODE}/{i}", metrics={"bf16_tflops": 700.0})
            for i in (0, 1)
        ]

    def train(ctx, options):
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has 79.1 GiB in use")

    real = all_benchmarks()
    fakes = {
        name: SimpleNamespace(run=run, produces=real[name].produces, outlier_metrics=(), expected_s=None)
        for name, run in (("matmul", matmul), ("train", train))
    }
    monkeypatch.setattr(suite, "all_benchmarks", lambda: fakes)
    monkeypatch.setattr(accept, "all_benchmarks", lambda: fakes)


@pytest.mark.parametrize("checked", [True, False], ids=["train-checked", "train-only-run"])
def test_beside_a_memory_hog_no_benchmark_runs_and_the_fail_names_it(replayed, monkeypatch, checked):
    # train would run out of memory beside the 70 GiB hog (an ERROR): accept runs no benchmark at all.
    occupy(replayed, 0, 70 * GIB, [process(HOG, 70 * GIB)])
    checks = {"matmul.bf16_tflops": Threshold(min=650)}
    if checked:
        checks["train.tokens_per_s_per_gpu"] = Threshold(min=16800)
    run_profile = profile().model_copy(update={"checks": checks, "benchmarks": {"train": {}}})
    plan = plan_benchmarks(run_profile, quick=True, on_gpu=False)
    _benchmarks(monkeypatch)
    result = accept.run_accept(OneRank(), run_profile, plan, quick=True)

    assert result.verdict is Status.FAIL
    assert result.measurements == []
    assert [c.name for c in result.checks if c.status is Status.ERROR] == []
    [hog] = [c for c in result.checks if c.status is Status.FAIL]
    assert (hog.name, hog.scope) == ("processes.foreign", "gpu:n1/0")
    assert hog.detail.startswith("pid 4321 (python3, user root, 70.0 GiB) on GPU 0")
    judged = [c for c in result.checks if c.name.startswith(("train.", "matmul."))]
    assert [c.name for c in judged] == ["matmul.bf16_tflops"] + (
        ["train.tokens_per_s_per_gpu"] if checked else []
    )
    for check in judged:
        assert check.status is Status.SKIP
        assert (
            check.detail == "not run: another program holds GPUs of node(s) n1: gpu:n1/0: free them and rerun"
        )


def test_with_the_opt_out_benchmarks_run_beside_the_program_and_are_judged(replayed, monkeypatch):
    occupy(replayed, 0, 70 * GIB, [process(HOG, 70 * GIB)])
    run_profile = profile("health.foreign_processes=warn").model_copy(
        update={"checks": {"matmul.bf16_tflops": Threshold(min=800)}}
    )
    plan = plan_benchmarks(run_profile, quick=True, on_gpu=False)
    _benchmarks(monkeypatch)
    result = accept.run_accept(OneRank(), run_profile, plan, quick=True)
    [hog] = [c for c in result.checks if c.name == "processes.foreign" and c.scope == "gpu:n1/0"]
    assert hog.status is Status.WARN
    matmul = [c for c in result.checks if c.name == "matmul.bf16_tflops"]
    assert [c.status for c in matmul] == [Status.FAIL, Status.FAIL]  # 700 measured, 800 required
    assert result.verdict is Status.FAIL


def test_out_of_memory_on_a_healthy_node_stays_an_error(replayed, monkeypatch):
    run_profile = profile().model_copy(update={"checks": {"train.tokens_per_s_per_gpu": Threshold(min=1)}})
    plan = plan_benchmarks(run_profile, quick=True, on_gpu=False)
    _benchmarks(monkeypatch)
    result = accept.run_accept(OneRank(), run_profile, plan, quick=True)
    assert result.verdict is Status.ERROR
    [train] = [c for c in result.checks if c.name == "train.tokens_per_s_per_gpu"]
    assert train.status is Status.ERROR and train.detail.startswith(
        "train failed on rank 0: OutOfMemoryError"
    )


def test_only_errors_wholly_on_failed_nodes_are_blamed_on_them():
    outcome = suite.Outcome(
        not_run={
            "p2p": (Status.ERROR, "p2p failed on rank 8: OutOfMemoryError"),
            "train": (Status.ERROR, "x"),
        },
        error_nodes={"p2p": {"n1"}, "train": {"n1", "n2"}},
    )
    assert accept._blame_failed_nodes(outcome, {"n1": "processes.foreign on gpu:n1/0"}) == {"p2p"}
    assert outcome.not_run["p2p"][0] is Status.SKIP
    assert outcome.not_run["train"] == (Status.ERROR, "x")  # it also broke on n2, which passed health


# --- accept: a program that arrives while the benchmarks run (issue 34) -------------------------------------


def _arriving(
    monkeypatch,
    recording: dict,
    root: Path,
    arrive: str,
    leave: str | None = None,
    pid=HOG,
    own_rank_pid: int | None = os.getpid(),
) -> None:
    """matmul, membw (per GPU) and train (the cluster) that measure healthy figures; the rank (pid
    `own_rank_pid`, None: NVML lists it under a pid of another namespace) holds a context on GPU 0 from
    matmul on, and `pid` starts there with 12 GiB during `arrive` and ends during `leave`. NVML's process
    lists are the recording's, /proc is `root`'s."""
    real_lists, real_watch = arrivals.compute_processes, accept.ArrivalWatch
    monkeypatch.setattr(arrivals, "compute_processes", lambda library=None: real_lists(ReplayNvml(recording)))
    monkeypatch.setattr(accept, "ArrivalWatch", lambda node, on_gpu: real_watch(node, on_gpu, root))
    rank = [process(own_rank_pid or HOG + 100, GIB)]  # the rank's CUDA context, once it has one

    def bench(name: str, metric: str, value: float, scopes: tuple[str, ...]):
        def run(ctx, options):
            listed = recording["devices"][0]["nvmlDeviceGetComputeRunningProcesses"]
            listed = [p for p in listed if p["pid"] != own_rank_pid] + rank
            if name == arrive:
                listed.append(process(pid, 12 * GIB))
            if name == leave:
                listed = [p for p in listed if p["pid"] != pid]
            occupy(recording, 0, sum(p["usedGpuMemory"] for p in listed) + 600 * 2**20, listed)
            return [Measurement(name=name, scope=scope, metrics={metric: value}) for scope in scopes]

        return run

    gpus = (f"gpu:{NODE}/0", f"gpu:{NODE}/1")
    runs = {
        "matmul": bench("matmul", "bf16_tflops", 700.0, gpus),
        "membw": bench("membw", "copy_tbps", 4.2, gpus),
        "train": bench("train", "tokens_per_s_per_gpu", 17000.0, ("cluster",)),
    }
    real = all_benchmarks()
    fakes = {
        name: SimpleNamespace(run=run, produces=real[name].produces, outlier_metrics=(), expected_s=None)
        for name, run in runs.items()
    }
    monkeypatch.setattr(suite, "all_benchmarks", lambda: fakes)
    monkeypatch.setattr(accept, "all_benchmarks", lambda: fakes)


def _accept_three(monkeypatch, recording: dict, root: Path, *sets: str, **arriving: Any):
    """run_accept of matmul, membw and train, with a program arriving as `arriving` tells `_arriving`."""
    checks = {
        "matmul.bf16_tflops": Threshold(min=650),
        "membw.copy_tbps": Threshold(min=4.0),
        "train.tokens_per_s_per_gpu": Threshold(min=18000),  # FAILs, as in issue 34's run
    }
    run_profile = profile(*sets).model_copy(update={"checks": checks})
    plan = plan_benchmarks(run_profile, quick=True, on_gpu=False)
    assert list(plan) == ["matmul", "membw", "train"]
    _arriving(monkeypatch, recording, root, **arriving)
    return accept.run_accept(OneRank(), run_profile, plan, quick=True)


def _details(result) -> dict[tuple[str, str], str]:
    return {(c.name, c.scope): c.detail for c in result.checks}


def test_a_process_arriving_mid_run_fails_naming_pid_and_the_benchmarks_it_overlapped(
    replayed, monkeypatch, root
):
    result = _accept_three(monkeypatch, replayed, root, arrive="membw")

    assert result.verdict is Status.FAIL
    foreign_checks = [c for c in result.checks if c.name == "processes.foreign"]
    assert [(c.scope, c.status) for c in foreign_checks] == [
        ("gpu:n1/0", Status.FAIL),  # health's PASS for GPU 0, replaced: it said 'none' before the arrival
        ("gpu:n1/1", Status.PASS),
    ]
    hog = foreign_checks[0]
    assert (hog.value, hog.unit, hog.threshold) == (1, "processes", {"max": 0.0})
    assert hog.detail.startswith(
        "pid 4321 (python3, user root, 12.0 GiB) started during the benchmarks, beside membw, train on "
        "GPU 0: those benchmarks' figures on it measure the sharing; keep jobs off the node while it is "
        "tested (drain it in the scheduler) and rerun"
    )
    assert hog.detail.endswith("on a shared node set health.foreign_processes: warn")
    details = _details(result)
    beside = "measured beside pid 4321 (python3, user root, 12.0 GiB) on gpu:n1/0"
    # every check measured beside it names it, FAIL or not; none measured before it or on the other GPU
    assert details[("membw.copy_tbps", "gpu:n1/0")].endswith(f"; {beside}")
    assert details[("train.tokens_per_s_per_gpu", "cluster")].endswith(f"; {beside}")
    for key in [("matmul.bf16_tflops", "gpu:n1/0"), ("matmul.bf16_tflops", "gpu:n1/1")]:
        assert "pid 4321" not in details[key]
    assert "pid 4321" not in details[("membw.copy_tbps", "gpu:n1/1")]
    statuses = {(c.name, c.scope): c.status for c in result.checks}
    assert statuses[("membw.copy_tbps", "gpu:n1/0")] is Status.PASS
    assert statuses[("train.tokens_per_s_per_gpu", "cluster")] is Status.FAIL
    assert result.inventory["arrived_processes"] == [
        {
            "node": "n1",
            "gpu": 0,
            "pid": HOG,
            "described": "pid 4321 (python3, user root, 12.0 GiB)",
            "benchmarks": ["membw", "train"],
        }
    ]


def test_a_process_that_ended_mid_run_overlapped_the_benchmark_it_ended_in(replayed, monkeypatch, root):
    result = _accept_three(monkeypatch, replayed, root, arrive="matmul", leave="membw")
    [hog] = [c for c in result.checks if c.name == "processes.foreign" and c.scope == "gpu:n1/0"]
    assert hog.status is Status.FAIL
    assert "pid 4321 (python3, user root, 12.0 GiB) started during the benchmarks, beside matmul, membw " in (
        hog.detail
    )
    assert "pid 4321" in _details(result)[("membw.copy_tbps", "gpu:n1/0")]
    assert "pid 4321" not in _details(result)[("train.tokens_per_s_per_gpu", "cluster")]


def test_an_arrival_on_a_shared_node_warns_and_is_still_named(replayed, monkeypatch, root):
    result = _accept_three(monkeypatch, replayed, root, "health.foreign_processes=warn", arrive="matmul")
    [hog] = [c for c in result.checks if c.name == "processes.foreign" and c.scope == "gpu:n1/0"]
    assert hog.status is Status.WARN
    assert "health.foreign_processes: warn" not in hog.detail
    assert _details(result)[("matmul.bf16_tflops", "gpu:n1/0")].endswith(
        "; measured beside pid 4321 (python3, user root, 12.0 GiB) on gpu:n1/0"
    )


def test_an_unchanged_process_list_adds_nothing(replayed, monkeypatch, root):
    # the program health WARNed (opt-out) stays all run: it is health's, not an arrival
    occupy(replayed, 0, 13 * GIB, [process(HOG, 12 * GIB)])
    result = _accept_three(monkeypatch, replayed, root, "health.foreign_processes=warn", arrive="none")
    assert [c.status for c in result.checks if c.name == "processes.foreign"] == [Status.WARN, Status.PASS]
    assert "arrived_processes" not in result.inventory
    assert not any("measured beside" in c.detail for c in result.checks)


@pytest.mark.parametrize("whose", ["rank", "child-of-rank"])
def test_gpuvals_own_processes_never_arrive(replayed, monkeypatch, root, whose):
    pid = os.getpid()  # the one fake rank's pid, as run_health_phase gathers it
    if whose == "child-of-rank":  # a compile worker with its own CUDA context, started by the rank
        pid = HOG + 7
        proc = root / "proc" / str(pid)
        proc.mkdir(parents=True)
        (proc / "status").write_text(f"Name:\tcompile_worker\nPPid:\t{HOG + 8}\n")
        (root / "proc" / str(HOG + 8)).mkdir()
        (root / "proc" / str(HOG + 8) / "status").write_text(f"Name:\tsh\nPPid:\t{os.getpid()}\n")
    result = _accept_three(monkeypatch, replayed, root, arrive="matmul", pid=pid)
    assert [c.status for c in result.checks if c.name == "processes.foreign"] == [Status.PASS] * 2
    assert not any("measured beside" in c.detail for c in result.checks)


def test_with_processes_skipped_nothing_is_watched(replayed, monkeypatch, root):
    result = _accept_three(monkeypatch, replayed, root, "health.skip=[processes]", arrive="matmul")
    assert not any(c.name == "processes.foreign" for c in result.checks)
    assert not any("measured beside" in c.detail for c in result.checks)


def test_a_drift_check_of_a_figure_measured_beside_an_arrival_names_it():
    from gpuval.health.arrivals import Arrival, annotate
    from gpuval.results import Check

    arrived = [Arrival("n1", 0, HOG, "pid 4321 (python3, 12.0 GiB)", ["matmul"])]
    producers = {"matmul": "matmul", "membw": "membw"}
    checks = [
        Check(name="drift.matmul.bf16_tflops", status=Status.WARN, scope="gpu:n1/0", detail="9% worse"),
        Check(name="outliers.matmul_pct", status=Status.PASS, scope="node:n1", detail=""),
        Check(name="drift.matmul.bf16_tflops", status=Status.WARN, scope="gpu:n1/1", detail="9% worse"),
        Check(name="membw.copy_tbps", status=Status.PASS, scope="gpu:n1/0", detail="4.2"),
        Check(name="matmul.bf16_tflops", status=Status.PASS, scope="gpu:n2/0", detail="700"),
    ]
    assert [c.detail for c in annotate(checks, arrived, producers)] == [
        "9% worse; measured beside pid 4321 (python3, 12.0 GiB) on gpu:n1/0",
        "measured beside pid 4321 (python3, 12.0 GiB) on gpu:n1/0",
        "9% worse",
        "4.2",
        "700",
    ]


def test_where_nvml_lists_no_rank_under_its_pid_nothing_is_named_an_arrival(replayed, monkeypatch, root):
    # A driver that lists host pids in a container: the rank's context shows as pid 4421, not ours, and
    # a process that appears cannot be told from a rank: no arrival, rather than gpuval's own named as one.
    result = _accept_three(monkeypatch, replayed, root, arrive="membw", own_rank_pid=None)
    assert [c.status for c in result.checks if c.name == "processes.foreign"] == [Status.PASS] * 2
    assert not any("measured beside" in c.detail for c in result.checks)

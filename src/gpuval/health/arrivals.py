"""Programs that start on a node's GPUs while accept's benchmarks run (issue 34).

The processes family names what is on the GPUs when the run begins. A job that starts later shares its
GPU with every benchmark after that, whose numbers then measure the sharing, and nothing named it: the
verdict could only FAIL a figure and point at the node's earlier runs. So after each benchmark every
node's first rank reads NVML's process lists once (one nvmlDeviceGetComputeRunningProcesses per GPU) and
keeps each process the health phase did not see that is not gpuval's own: one of its ranks, or a process
started by one (a compile worker with a CUDA context of its own). Such a process makes processes.foreign
FAIL on its GPU, as a process found by the health phase does (WARN where health.foreign_processes says
so), naming the benchmarks it overlapped; every check measured beside it names it too.

One read per benchmark cannot see a process that starts and ends within one benchmark. Where NVML lists
processes by pids this container does not use (a driver that does not translate them into its PID
namespace), none of gpuval's ranks is listed under its pid although they run on the GPUs: there no
process can be told from a rank, and the watch stops rather than name gpuval's own ranks as arrivals.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuval import derived, nvml
from gpuval.checkref import DRIFT, CheckRef, family_of, member_of
from gpuval.health._common import gpu_scope
from gpuval.health.processes import OPT_OUT, describe
from gpuval.nvml import NvmlSnapshot, available
from gpuval.results import Check, Status
from gpuval.scope import read as read_scope

_ANCESTORS = 64  # parents followed to find a rank above a process: far more than any real nesting


@dataclass
class Arrival:
    """A process that started on a GPU during the benchmarks."""

    node: str
    gpu: int  # NVML's index on its node, as the health phase names GPUs
    pid: int
    described: str  # 'pid 1234 (python3, user alice, 12.3 GiB)', as it was first seen
    benchmarks: list[str] = field(default_factory=list)  # those it overlapped, in run order

    @property
    def scope(self) -> str:
        return gpu_scope(self.node, self.gpu)


class ArrivalWatch:
    """One node's watch, kept by its first rank (on the others `begin` is never called: nothing is read)."""

    def __init__(self, node: str, on_gpu: bool = True, root: Path = Path("/"), library: Any = None) -> None:
        self.node, self.on_gpu, self.root, self.library = node, on_gpu, root, library
        self.seen: set[tuple[int, int]] | None = None  # (GPU, pid) the health phase saw; None: not watching
        self.own_pids: set[int] = set()
        self.arrivals: dict[tuple[int, int], Arrival] = {}
        self.present: set[tuple[int, int]] = set()  # arrivals listed at the last read
        self._own: dict[int, bool] = {}

    def begin(self, snapshot: NvmlSnapshot, own_pids: set[int]) -> None:
        """Start watching from the health phase's snapshot: what it listed is not an arrival."""
        self.own_pids = set(own_pids)
        self.seen = {
            (gpu.index, process.get("pid"))
            for gpu in snapshot.gpus
            if isinstance(gpu.compute_processes, list)
            for process in gpu.compute_processes
        }

    def after(self, benchmark: str) -> None:
        """Read the process lists once, `benchmark` having just ended."""
        if self.seen is None:
            return
        lists = compute_processes(self.library)
        if not available(lists):
            return  # NVML that stopped answering is the health checks' to judge, not a process
        listed = {p.get("pid") for processes in lists if isinstance(processes, list) for p in processes}
        if self.on_gpu and listed and not listed & self.own_pids:
            self.seen = None  # ranks on the GPUs, none listed under its pid: pids not of this namespace
            return
        present, read = set(), set()
        for index, processes in enumerate(lists):
            if not isinstance(processes, list):
                continue
            read.add(index)
            for process in processes:
                pid = process.get("pid")
                if not isinstance(pid, int) or (index, pid) in self.seen or self._is_own(pid):
                    continue
                present.add((index, pid))
                arrival = self.arrivals.setdefault(
                    (index, pid), Arrival(self.node, index, pid, describe(process, self.root))
                )
                if benchmark not in arrival.benchmarks:
                    arrival.benchmarks.append(benchmark)
        for index, pid in self.present - present:
            if index in read and benchmark not in (gone := self.arrivals[(index, pid)]).benchmarks:
                gone.benchmarks.append(benchmark)  # listed when it began, gone now: it ended during it
        self.present = present

    def report(self) -> list[dict[str, Any]]:
        return [asdict(arrival) for arrival in self.arrivals.values()]

    def _is_own(self, pid: int) -> bool:
        """One of gpuval's ranks, or a process below one (read from ROOT/proc: a PID this container cannot
        see there is not gpuval's)."""
        if pid not in self._own:
            current, own = pid, False
            for _ in range(_ANCESTORS):
                if current in self.own_pids:
                    own = True
                    break
                parent = _parent(self.root / "proc" / str(current))
                if parent is None or parent <= 1:
                    break
                current = parent
            self._own[pid] = own
        return self._own[pid]


def _parent(proc: Path) -> int | None:
    try:
        lines = (proc / "status").read_text().splitlines()
    except OSError:
        return None
    value = next((line.split()[1:2] for line in lines if line.startswith("PPid:")), [])
    return int(value[0]) if value and value[0].isdigit() else None


def arrivals_of(gathered: list[Any]) -> list[Arrival]:
    """Every node's arrivals from what their first ranks reported (None from the other ranks)."""
    return [Arrival(**item) for part in gathered if part for item in part]


def arrival_checks(arrivals: list[Arrival], status: Status) -> list[Check]:
    """processes.foreign on each GPU a process arrived on, naming each and the benchmarks it overlapped."""
    by_gpu: dict[str, list[Arrival]] = {}
    for arrival in arrivals:
        by_gpu.setdefault(arrival.scope, []).append(arrival)
    checks = []
    for scope, arrived in by_gpu.items():
        named = "; ".join(
            f"{a.described} started during the benchmarks, beside {', '.join(a.benchmarks)}" for a in arrived
        )
        checks.append(
            Check(
                name="processes.foreign",
                status=status,
                value=float(len(arrived)),
                threshold={"max": 0.0},
                unit="processes",
                scope=scope,
                detail=f"{named} on GPU {arrived[0].gpu}: those benchmarks' figures on it measure the "
                "sharing; keep jobs off the node while it is tested (drain it in the scheduler) and rerun"
                + (OPT_OUT if status is Status.FAIL else ""),
            )
        )
    return checks


def with_arrival_checks(health: list[Check], added: list[Check]) -> list[Check]:
    """Health's checks with each arrival check in place of its GPU's processes.foreign PASS (which said
    'none' before the benchmarks began), or after them where health said something else there."""
    by_scope = {c.scope: c for c in added}
    out = []
    for check in health:
        if check.name == "processes.foreign" and check.status is Status.PASS and check.scope in by_scope:
            check = by_scope.pop(check.scope)
        out.append(check)
    return out + list(by_scope.values())


def annotate(checks: list[Check], arrivals: list[Arrival], producers: dict[str, str]) -> list[Check]:
    """Each check of a benchmark that ran beside an arrival, on a scope that holds its GPU, naming it."""
    out = []
    for check in checks:
        benchmark = _benchmark_of(check.name, producers)
        notes = [
            f"measured beside {a.described} on {a.scope}"
            for a in arrivals
            if benchmark in a.benchmarks and _holds(check.scope, a)
        ]
        if notes:
            detail = "; ".join([check.detail, *notes] if check.detail else notes)
            check = check.model_copy(update={"detail": detail})
        out.append(check)
    return out


def _benchmark_of(name: str, producers: dict[str, str]) -> str:
    """The benchmark behind a check: 'matmul.bf16_tflops' -> 'matmul', 'outliers.membw_pct' -> 'membw',
    'drift.X' -> X's, 'train.run' -> 'train'."""
    target, drifted = family_of(name), member_of(name, DRIFT)
    if drifted is not None:
        return _benchmark_of(drifted, producers)
    ref = CheckRef.read(name)
    kind = derived.get(ref.measurement) if ref is not None else None
    if ref is not None and kind is not None:
        return kind.source(ref) or target
    return producers.get(target, target)


def _holds(scope: str, arrival: Arrival) -> bool:
    """Whether what `scope` measured ran on the arrival's GPU: the cluster, its node, the GPU, a link with
    it at one end or a pair of nodes with it in; a scope of no known shape counts too."""
    parsed = read_scope(scope)
    if parsed is None or parsed.kind == "cluster":
        return True
    if parsed.kind == "gpu":
        return (parsed.node, parsed.gpu_index) == (arrival.node, arrival.gpu)
    if parsed.kind == "link":
        return parsed.node == arrival.node and f"gpu{arrival.gpu}" in (parsed.ends or ())
    return arrival.node in parsed.nodes


def compute_processes(library: Any = None) -> list[Any] | nvml.Unavailable:
    """Every GPU's compute processes by index (as GpuInfo.compute_processes), or Unavailable: the query
    the watch repeats between benchmarks, one NVML call per GPU where a snapshot makes dozens."""
    session = nvml.Nvml(library)
    if session.error is not None:
        return nvml.Unavailable(session.error)
    try:
        handles = session.handles()
        if not available(handles):
            return handles
        return [nvml.compute_processes_of(session, h) if available(h) else h for h in handles]
    finally:
        session.shutdown()

"""The health-check registry: a family name maps to one HealthCheck; duplicates are errors.

Node checks run once per node (on its first local rank) against that node's NVML snapshot, sysfs and
kernel log; each returns Check objects with a scope (`gpu:NODE/INDEX`, `node:NAME`, `link:...`) and a
one-line hint. An exception inside a family becomes one ERROR check naming it, never a silent pass.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpuval.checkref import in_family
from gpuval.config import Profile
from gpuval.errors import first_line
from gpuval.nvml import GpuInfo, NvmlSnapshot
from gpuval.results import Check, Status
from gpuval.scope import Scope

if TYPE_CHECKING:
    from gpuval.health.cuda import CudaView


@dataclass
class HealthContext:
    profile: Profile
    node: str
    snapshot: NvmlSnapshot
    inventory: dict[str, Any] = field(default_factory=dict)  # discover's node inventory
    root: Path = Path("/")  # where /sys and /proc are read from (a fake tree in tests)
    kmsg: Path | None = Path("/dev/kmsg")  # kernel log for XID lines; None: not readable here
    own_pids: set[int] = field(default_factory=set)  # gpuval's own ranks: not foreign processes
    library: Any = None  # the NVML library (pynvml, or a replay in tests) for event waits
    cuda: list[CudaView] | None = None  # CUDA's view from each of this node's ranks; None: read it here
    history: Path | None = None  # accept's history database, read-only: XIDs before a passing run don't count
    command: Literal["accept", "health"] = "health"  # what runs the checks: health.foreign_processes 'auto'
    # every GPU NVML lists where `snapshot` holds only the job's (gpuval.health.job): the PCI bus and the
    # kernel log are node-wide facts, judged against all of them; None: the snapshot holds every GPU
    node_gpus: list[GpuInfo] | None = None

    @property
    def all_gpus(self) -> list[GpuInfo]:
        """Every GPU NVML lists on the node, the job's or not."""
        return self.node_gpus if self.node_gpus is not None else self.snapshot.gpus


@dataclass(frozen=True)
class HealthCheck:
    name: str
    summary: str
    run: Callable[[HealthContext], list[Check]]
    waits: bool = False  # spends its time waiting (an event window), not computing: runs beside the rest


_REGISTRY: dict[str, HealthCheck] = {}
_LOADED = False
# no node family here (fleet: checks across nodes, run by accept; arrivals: accept's watch between benchmarks)
_NOT_CHECKS = {"registry", "run", "fleet", "arrivals"}


def register(check: HealthCheck) -> HealthCheck:
    if check.name in _REGISTRY:
        raise ValueError(f"health check '{check.name}' is registered twice")
    _REGISTRY[check.name] = check
    return check


def all_checks() -> dict[str, HealthCheck]:
    global _LOADED
    if not _LOADED:
        # the package's modules found by listing its folder (importing the package here would be a cycle)
        for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
            if module.name not in _NOT_CHECKS and not module.name.startswith("_"):
                importlib.import_module(f"{__package__}.{module.name}")
        _LOADED = True
    return dict(_REGISTRY)


def _run_family(ctx: HealthContext, family: HealthCheck) -> list[Check]:
    """One family's checks; a crash in it is that family's ERROR, never the end of the run."""
    try:
        return family.run(ctx)
    except Exception as exc:  # noqa: BLE001 - a broken checker is an ERROR of the run
        return [
            Check(
                name=in_family(family.name, "run"),
                status=Status.ERROR,
                scope=str(Scope.of_node(ctx.node)),
                detail=f"the {family.name} check crashed: {type(exc).__name__}: {first_line(exc)}",
            )
        ]


def run_health(ctx: HealthContext, only: set[str] | None = None) -> list[Check]:
    """Every registered family (or those in `only`) on this node, checks in registration order. Families
    that wait (the XID event window) run in a thread beside the others, so their wait costs no time."""
    from concurrent.futures import ThreadPoolExecutor

    chosen = [f for name, f in all_checks().items() if only is None or name in only]
    waiting = [f for f in chosen if f.waits]
    with ThreadPoolExecutor(max_workers=max(1, len(waiting))) as pool:
        pending = {f.name: pool.submit(_run_family, ctx, f) for f in waiting}
        done = {f.name: _run_family(ctx, f) for f in chosen if not f.waits}
        done.update({name: future.result() for name, future in pending.items()})
    return [check for f in chosen for check in done[f.name]]

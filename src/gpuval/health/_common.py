"""What the health families share: scopes, and what to say when NVML could not give a value.

Missing values follow one rule. A value NVML could not give (`gpuval.nvml.Unavailable`) makes its check
SKIP with NVML's reason: the GPU may simply not support it (retired pages on Hopper, NVLink on a PCIe
card). A family turns that into ERROR only where another answer proves the value must exist - e.g. ECC
is on, yet the uncorrectable-ECC counter does not answer - because then nothing was shown to be healthy.
A GPU the driver counts but NVML cannot open is FAILed once, by the gpu family; every other family SKIPs it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gpuval.checkref import family_of
from gpuval.health.registry import HealthContext
from gpuval.nvml import GpuInfo, NvmlSnapshot, Unavailable, available
from gpuval.results import Check, Status
from gpuval.scope import Scope


def gpu_scope(node: str, index: int) -> str:
    return str(Scope.gpu(node, index))


def node_scope(node: str) -> str:
    return str(Scope.of_node(node))


def link_scope(node: str, a: str, b: str) -> str:
    """`link:NODE/gpu0-nvlink5`, `link:NODE/mlx5_0-port1`."""
    return str(Scope.link(node, a, b))


_BUS = re.compile(r"([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)")


def bus_key(bus_id: Any) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI address as the kernel ('PCI:0000:00:06') or NVML
    ('00000000:00:06.0') writes it; None if it is neither."""
    match = _BUS.search(str(bus_id)) if bus_id else None
    if match is None:
        return None
    domain, bus, device = (int(part, 16) for part in match.groups())
    return domain, bus, device


def why_no_gpus(snapshot: NvmlSnapshot) -> str:
    """Why there is nothing to check, in words a person can act on."""
    if snapshot.error is None:
        return "NVML reports no GPU on this node"
    if "LibraryNotFound" in snapshot.error:
        return "no NVIDIA driver on this node (the NVML library is not installed)"
    if "DriverNotLoaded" in snapshot.error:
        return (
            "the NVIDIA driver is not loaded (NVML: DriverNotLoaded): load it (modprobe nvidia) or reinstall"
        )
    return f"NVML cannot be used on this node: {snapshot.error}"


def reachable(gpu: GpuInfo) -> bool:
    """NVML opened this GPU (a lost GPU carries only its index and, in `name`, why)."""
    return available(gpu.name)


def skip(name: str, scope: str, reason: str) -> Check:
    return Check(name=name, status=Status.SKIP, scope=scope, detail=reason)


def unavailable(name: str, scope: str, value: Any, what: str) -> Check:
    """SKIP: NVML could not give `what`, with NVML's reason."""
    reason = value.reason if isinstance(value, Unavailable) else "no answer"
    return skip(name, scope, f"NVML gave no {what} ({reason})")


def per_gpu(
    ctx: HealthContext, names: tuple[str, ...], judge: Callable[[GpuInfo, str], list[Check]]
) -> list[Check]:
    """`judge(gpu, scope)` for every GPU NVML can open; the checks `names` SKIP with the reason otherwise.

    With no GPU at all (no driver) the family gets one node-level SKIP, named after the family when it has
    several checks ('ecc'); a GPU NVML cannot open gets a SKIP per name, pointing at the gpu family's FAIL.
    """
    snapshot = ctx.snapshot
    if not snapshot.gpus:
        family = names[0] if len(names) == 1 else family_of(names[0])
        return [skip(family, node_scope(ctx.node), why_no_gpus(snapshot))]
    checks: list[Check] = []
    for gpu in snapshot.gpus:
        scope = gpu_scope(ctx.node, gpu.index)
        if not reachable(gpu):
            reason = gpu.name.reason if isinstance(gpu.name, Unavailable) else "no answer"
            checks += [
                skip(name, scope, f"NVML cannot open this GPU ({reason}): see gpu.reachable")
                for name in names
            ]
            continue
        checks += judge(gpu, scope)
    return checks


def at_least(
    name: str,
    scope: str,
    value: float,
    minimum: float,
    unit: str,
    passed: str,
    missed: str,
    below: Status = Status.FAIL,
) -> Check:
    """`value` against a lower bound: PASS saying `passed`, else `below` (FAIL, or WARN where a low value
    may be benign) saying `missed`, the line that tells a person what to do."""
    ok = value >= minimum
    return Check(
        name=name,
        status=Status.PASS if ok else below,
        value=value,
        threshold={"min": minimum},
        unit=unit,
        scope=scope,
        detail=passed if ok else missed,
    )


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"

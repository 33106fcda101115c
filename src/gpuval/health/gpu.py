"""GPU count, model and memory against the profile's `expect`, and GPUs the driver counts but cannot open.

`expect_checks` judges node inventories (what `gpuval accept` gathers through torch); the health family
judges the same things as NVML sees them, so a node without a driver still gets its count checked.
"""

from __future__ import annotations

import re
from typing import Any

from gpuval.config import Expect, Profile
from gpuval.discover.pci import PciGpu, nvidia_gpus
from gpuval.health._common import (
    at_least,
    bus_key,
    gpu_scope,
    node_scope,
    plural,
    reachable,
    unavailable,
    why_no_gpus,
)
from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.nvml import Unavailable, available
from gpuval.results import Check, Status

_FIND_MISSING = "check the driver sees all of them (nvidia-smi), then reseat or replace the missing GPU"


def _count_check(
    expect: Expect, node: str, found: int, why: str = "", action: str = _FIND_MISSING
) -> list[Check]:
    if expect.gpu_count is None:
        return []
    ok = found == expect.gpu_count
    if ok:
        detail = f"{found} GPUs" + (f" ({why})" if why and found == 0 else "")
    else:
        cause = f"{why}; " if why else ""
        detail = f"{found} GPUs visible, {expect.gpu_count} expected: {cause}{action}"
    return [
        Check(
            name="expect.gpu_count",
            status=Status.PASS if ok else Status.FAIL,
            value=found,
            threshold={"equal": expect.gpu_count},
            unit="GPUs",
            scope=node_scope(node),
            detail=detail,
        )
    ]


def _model_checks(expect: Expect, node: str, index: int, name: Any, memory_bytes: Any) -> list[Check]:
    scope = gpu_scope(node, index)
    checks: list[Check] = []
    if expect.gpu_name is not None:
        if not available(name):
            checks.append(
                Check(name="expect.gpu_name", status=Status.SKIP, scope=scope, detail=f"no name: {name!r}")
            )
        else:
            ok = re.fullmatch(expect.gpu_name, name) is not None
            checks.append(
                Check(
                    name="expect.gpu_name",
                    status=Status.PASS if ok else Status.FAIL,
                    scope=scope,
                    threshold={"match": expect.gpu_name},
                    detail=name
                    if ok
                    else f"'{name}' is not '{expect.gpu_name}': wrong profile "
                    f"for this node (pass --profile) or a different GPU model installed",
                )
            )
    if expect.gpu_memory_gib is not None:
        if not isinstance(memory_bytes, (int, float)):
            checks.append(unavailable("expect.gpu_memory_gib", scope, memory_bytes, "memory size"))
        else:
            gib = memory_bytes / 2**30
            checks.append(
                at_least(
                    "expect.gpu_memory_gib",
                    scope,
                    gib,
                    expect.gpu_memory_gib,
                    "GiB",
                    f"{gib:.1f} GiB",
                    f"{gib:.1f} GiB, {expect.gpu_memory_gib} expected: MIG "
                    "or a memory fault may hide memory (nvidia-smi -q -d MEMORY)",
                )
            )
    return checks


def expect_checks(profile: Profile, nodes: list[dict[str, Any]]) -> list[Check]:
    """GPU count, model and memory of every node inventory (`gpuval accept`) against `expect`."""
    checks: list[Check] = []
    for node in nodes:
        checks += _count_check(profile.expect, node["node"], node["gpu_count"])
        for gpu in node["gpus"]:
            checks += _model_checks(
                profile.expect, node["node"], gpu["index"], gpu["name"], gpu["memory_total_bytes"]
            )
    return checks


# NVML errors on opening a GPU that say the hardware is gone or unfit, rather than that this process
# may not look at it (NoPermission): those are a FAIL of the GPU.
_LOST = ("GpuIsLost", "Unknown", "InsufficientPower", "IrqIssue", "ResetRequired")


_OFF_THE_BUS = (
    "look for a dead or unloaded driver (load it: modprobe nvidia), a kernel module that does not match the "
    "kernel (reinstall the driver) or a GPU off the bus (dmesg: NVRM and Xid 79 lines; reboot, reseat it)"
)


def _pci_checks(ctx: HealthContext, pci: list[PciGpu]) -> list[Check]:
    """NVIDIA GPUs on the PCI bus against NVML's list: a GPU the hardware holds but NVML does not list
    (or NVML not starting at all) is a FAIL naming it, unless the job was given only some GPUs."""
    snapshot, scope = ctx.snapshot, node_scope(ctx.node)
    if not snapshot.gpus:
        nvml = snapshot.error or "lists no GPU"
        detail = f"{plural(len(pci), 'NVIDIA device')} on the PCI bus, NVML: {nvml}; {_OFF_THE_BUS}"
        return [
            Check(
                name="gpu.reachable",
                status=Status.FAIL,
                value=0,
                threshold={"equal": len(pci)},
                unit="GPUs",
                scope=scope,
                detail=detail,
            )
        ]
    listed = {bus_key(gpu.pci_bus_id) for gpu in ctx.all_gpus}  # the bus holds the node's GPUs, not the job's
    unlisted = [device for device in pci if bus_key(device.address) not in listed]
    lost = sum(1 for gpu in ctx.all_gpus if bus_key(gpu.pci_bus_id) is None)  # counted, no address
    if len(unlisted) <= lost or ctx.profile.health.allow_hidden_gpus:
        return []
    named = ", ".join(f"{device.address} (driver {device.driver or 'none'})" for device in unlisted)
    return [
        Check(
            name="gpu.reachable",
            status=Status.FAIL,
            value=len(ctx.all_gpus),
            threshold={"equal": len(pci)},
            unit="GPUs",
            scope=scope,
            detail=f"{plural(len(pci), 'NVIDIA GPU')} on the PCI bus, NVML lists {len(ctx.all_gpus)}; "
            f"not listed: {named}; {_OFF_THE_BUS}",
        )
    ]


def _reachable_checks(ctx: HealthContext) -> list[Check]:
    snapshot = ctx.snapshot
    pci = nvidia_gpus(ctx.root)
    checks = _pci_checks(ctx, pci) if pci else []
    if not snapshot.gpus:
        return checks or [
            Check(
                name="gpu.reachable",
                status=Status.SKIP,
                scope=node_scope(ctx.node),
                detail=why_no_gpus(snapshot),
            )
        ]
    lost = [gpu for gpu in snapshot.gpus if not reachable(gpu)]
    for gpu in lost:
        reason = gpu.name.reason if isinstance(gpu.name, Unavailable) else "no answer"
        hardware = any(word in reason for word in _LOST)
        checks.append(
            Check(
                name="gpu.reachable",
                status=Status.FAIL if hardware else Status.ERROR,
                scope=gpu_scope(ctx.node, gpu.index),
                detail=f"the driver counts GPU {gpu.index} but NVML cannot open it ({reason}): "
                + (
                    "drain the node, look for Xid 79 in the kernel log (dmesg), reboot, and reseat or "
                    "replace the GPU (check its power cables and PCIe slot) if it recurs"
                    if hardware
                    else "run gpuval health as a user allowed to query every GPU (root, or the video group)"
                ),
            )
        )
    if not checks:
        checks.append(
            Check(
                name="gpu.reachable",
                status=Status.PASS,
                scope=node_scope(ctx.node),
                detail=f"all {len(snapshot.gpus)} GPUs answer NVML",
            )
        )
    return checks


def run(ctx: HealthContext) -> list[Check]:
    snapshot = ctx.snapshot
    answering = [gpu for gpu in snapshot.gpus if reachable(gpu)]
    lost = len(snapshot.gpus) - len(answering)
    why, action = "", _FIND_MISSING
    if not snapshot.gpus:
        why = why_no_gpus(snapshot)
        if snapshot.error is not None:
            action = "install or load the NVIDIA driver, then check nvidia-smi lists every GPU"
    elif lost:
        why = f"{lost} more counted by the driver but not answering NVML (see gpu.reachable)"
    checks = _count_check(ctx.profile.expect, ctx.node, len(answering), why, action)
    checks += _reachable_checks(ctx)
    for gpu in answering:
        checks += _model_checks(ctx.profile.expect, ctx.node, gpu.index, gpu.name, gpu.memory_total_bytes)
    return checks


register(HealthCheck(name="gpu", summary="GPU count, model and memory vs the profile; lost GPUs", run=run))

"""The NVIDIA driver version against the profile's pin (`expect.driver_version`, a glob like '580.*')."""

from __future__ import annotations

from fnmatch import fnmatchcase

from gpuval.health._common import node_scope, why_no_gpus
from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.nvml import available
from gpuval.results import Check, Status


def run(ctx: HealthContext) -> list[Check]:
    pattern = ctx.profile.expect.driver_version
    if pattern is None:
        return []  # no pin: nothing to judge
    scope, threshold = node_scope(ctx.node), {"match": pattern}
    snapshot = ctx.snapshot
    if snapshot.driver_version is None or (not snapshot.ok and not snapshot.gpus):
        return [
            Check(
                name="driver.version",
                status=Status.FAIL,
                threshold=threshold,
                scope=scope,
                detail=f"the profile pins driver {pattern} but there is none to read: "
                f"{why_no_gpus(snapshot)}; install the pinned driver",
            )
        ]
    version = snapshot.driver_version
    if not available(version):
        return [
            Check(
                name="driver.version",
                status=Status.ERROR,
                threshold=threshold,
                scope=scope,
                detail=f"NVML gave no driver version ({version.reason}); check nvidia-smi",
            )
        ]
    ok = fnmatchcase(version, pattern)
    return [
        Check(
            name="driver.version",
            status=Status.PASS if ok else Status.FAIL,
            threshold=threshold,
            scope=scope,
            detail=version
            if ok
            else f"driver {version}, the profile pins {pattern}: install the pinned driver on this node "
            "(or change expect.driver_version if the fleet moved on)",
        )
    ]


register(HealthCheck(name="driver", summary="NVIDIA driver version vs the profile's pin", run=run))

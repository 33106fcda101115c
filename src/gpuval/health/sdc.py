"""Silent data corruption on this node's GPUs: the same seeded computation must give the same bytes on
every GPU of a model, and twice on each (gpuval.sdc). Across nodes, `gpuval accept` compares every rank."""

from __future__ import annotations

from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.health.smoke import cuda_targets, on_each_gpu
from gpuval.results import Check, Status
from gpuval.sdc import device_result, judge


def run(ctx: HealthContext) -> list[Check]:
    targets, checks = cuda_targets(ctx, "sdc.bitwise")
    results = []
    for scope, outcome in on_each_gpu(targets, lambda scope, device: device_result(device, scope)):
        if not isinstance(outcome, Exception):
            results.append(outcome)
        else:  # a device that cannot compute is judged by smoke.matmul
            exc = outcome
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            checks.append(
                Check(
                    name="sdc.bitwise",
                    status=Status.ERROR,
                    scope=scope,
                    detail=f"could not compute the fingerprint ({first}); see smoke.matmul",
                )
            )
    return checks + judge(results)


register(HealthCheck(name="sdc", summary="same seeded computation, bit-identical on every GPU", run=run))

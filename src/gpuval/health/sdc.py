"""Silent data corruption on this node's GPUs: the same seeded computation must give the same bytes on
every GPU of a model, and twice on each (gpuval.sdc). Across nodes, `gpuval accept` compares every rank."""

from __future__ import annotations

from gpuval.health._common import gpu_scope, node_scope, reachable, skip, why_no_gpus
from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.health.smoke import cuda_indices, why_no_cuda
from gpuval.results import Check, Status
from gpuval.sdc import device_result, judge


def run(ctx: HealthContext) -> list[Check]:
    gpus = [gpu for gpu in ctx.snapshot.gpus if reachable(gpu)]
    if not gpus:
        reason = (
            why_no_gpus(ctx.snapshot) if not ctx.snapshot.gpus else "no GPU answers NVML (see gpu.reachable)"
        )
        return [skip("sdc.bitwise", node_scope(ctx.node), reason)]
    import torch

    if not torch.cuda.is_available():
        status, reason = why_no_cuda(torch)
        return [Check(name="sdc.bitwise", status=status, scope=node_scope(ctx.node), detail=reason)]
    results, checks = [], []
    for gpu, index in cuda_indices(torch, gpus):
        scope = gpu_scope(ctx.node, gpu.index)
        if index is None:
            checks.append(skip("sdc.bitwise", scope, "CUDA cannot see this GPU (CUDA_VISIBLE_DEVICES?)"))
            continue
        try:
            results.append(device_result(torch.device("cuda", index), scope))
        except Exception as exc:  # noqa: BLE001 - a device that cannot compute is judged by smoke.matmul
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

"""Silent data corruption: the same seeded computation on every GPU must give bit-identical results.

Each rank builds the same inputs from one seed on the CPU, runs a chain of matrix products and
nonlinearities on its GPU twice, and hashes the bytes of the result. GPUs of one model running one
cuBLAS build choose the same kernels, so their results are identical to the bit (cuBLAS documents
bit-wise reproducibility on GPUs of the same architecture and SM count); a GPU whose bytes differ from
the majority of its peers, or from its own second run, computes wrongly without raising any error.

One family, two reaches: on one node it is the health check `sdc` (every GPU of the node); under
`gpuval accept` every rank computes and rank 0 judges them all together (`run_sdc`).
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter, defaultdict
from typing import Any

from gpuval.errors import first_line
from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.health.smoke import cuda_targets, on_each_gpu
from gpuval.results import Check, Status

SEED = 20261121


@functools.lru_cache(maxsize=2)
def _inputs(size: int) -> tuple[Any, Any]:
    """The seeded inputs, made once per process on the CPU: every GPU and both runs use these bytes.
    Drawing them is slow on a CPU, and drawn per GPU and run it added seconds to health on a multi-GPU
    node (docs/code-figures.md)."""
    import torch

    generator = torch.Generator().manual_seed(SEED)
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator) / size**0.5  # keeps the chain's values in range
    return a, b


def _fingerprint(device: Any, size: int, steps: int) -> str:
    import torch

    if device.type == "cpu":
        # One thread: a CPU BLAS may pick its thread count, and with it its blocking, from the machine's
        # load, so a busy CPU gave two runs that differed with nothing wrong (in CI: docs/code-figures.md).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return _chain(device, size, steps)
        finally:
            torch.set_num_threads(threads)
    return _chain(device, size, steps)


def _chain(device: Any, size: int, steps: int) -> str:
    import torch

    a, b = _inputs(size)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    x, w = a.to(device, dtype), b.to(device, dtype)
    for _ in range(steps):
        x = torch.tanh(x @ w) * 2.0  # tensor cores (bf16) and the vector units both take part
    total = (x.float() @ w.float().t()).sum(dim=0)  # an fp32 product too
    data = torch.cat([x.float().flatten(), total]).cpu().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def device_result(device: Any, scope: str, size: int | None = None, steps: int = 8) -> dict[str, Any]:
    """The fingerprint of one device, computed twice, with the model it is compared within."""
    if size is None:
        size = 4096 if device.type == "cuda" else 256
    first, second = _fingerprint(device, size, steps), _fingerprint(device, size, steps)
    if device.type == "cuda":
        import torch

        properties = torch.cuda.get_device_properties(device)
        model = f"{properties.name} ({properties.multi_processor_count} SMs)"
    else:
        import platform

        model = platform.processor() or platform.machine() or "cpu"
    return {"scope": scope, "model": model, "first": first, "second": second, "size": size, "steps": steps}


def local_result(runtime: Any) -> dict[str, Any]:
    """This rank's fingerprint on its own device."""
    return device_result(runtime.device, runtime.device_scope)


def judge(results: list[dict[str, Any]]) -> list[Check]:
    """One check per device: its result must equal its own rerun and the majority of its model's peers."""
    by_model: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        by_model[result["model"]].append(result)
    diagnose = "drain the node and run field diagnostics (dcgmi diag -r 3)"
    checks = []
    for model, peers in by_model.items():
        majority, votes = Counter(peer["first"] for peer in peers).most_common(1)[0]
        distinct = len({peer["first"] for peer in peers})
        contested = len(peers) > 1 and votes <= len(peers) / 2  # no strict majority: cannot say who is wrong
        for peer in peers:
            mine, rerun = peer["first"][:12], peer["second"][:12]
            if peer["first"] != peer["second"]:
                status = Status.FAIL
                detail = f"two runs of one computation differ here ({mine} vs {rerun}): {diagnose}"
            elif contested:  # a fault for sure, but no majority says where: every device is suspect
                status = Status.FAIL
                detail = (
                    f"no majority among {len(peers)} {model} devices ({distinct} different results), "
                    f"so this one is suspect: {diagnose} on each"
                )
            elif peer["first"] != majority:
                status = Status.FAIL
                detail = (
                    f"result differs from {votes} of {len(peers)} {model} devices ({mine} vs "
                    f"{majority[:12]}): silent data corruption; {diagnose}"
                )
            elif len(peers) > 1:
                status, detail = Status.PASS, f"bit-identical to {votes - 1} peer(s) and to its own rerun"
            else:
                status, detail = Status.PASS, "bit-identical to its own rerun (no peer of its model here)"
            checks.append(
                Check(
                    name="sdc.bitwise",
                    status=status,
                    scope=peer["scope"],
                    detail=detail,
                    threshold={"equal": "majority of same-model devices"},
                )
            )
    return checks


def run_sdc(runtime: Any) -> list[Check] | None:
    """Every rank computes; rank 0 gets the checks (None elsewhere)."""
    gathered = runtime.all_gather_object(local_result(runtime))
    return judge(gathered) if runtime.is_main else None


def run(ctx: HealthContext) -> list[Check]:
    targets, checks = cuda_targets(ctx, "sdc.bitwise")
    results = []
    for scope, outcome in on_each_gpu(targets, lambda scope, device: device_result(device, scope)):
        if not isinstance(outcome, Exception):
            results.append(outcome)
        else:  # a device that cannot compute is judged by smoke.matmul
            checks.append(
                Check(
                    name="sdc.bitwise",
                    status=Status.ERROR,
                    scope=scope,
                    detail=f"could not compute the fingerprint ({first_line(outcome)}); see smoke.matmul",
                )
            )
    return checks + judge(results)


register(HealthCheck(name="sdc", summary="same seeded computation, bit-identical on every GPU", run=run))

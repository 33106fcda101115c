"""CUDA smoke test per GPU: allocate, multiply, copy back, compare with the CPU.

The product is computed in float64 (no TF32 or reduced-precision path exists for it), into an output
poisoned with NaN first, so a kernel that silently does not run cannot pass. The CPU result is the
reference; float64 sums of 512 products of values in [-1, 1) differ between orderings by ~1e-13, so the
tolerance of 1e-9 catches any corrupted element while accepting a different summation order.

CUDA devices are matched to NVML's GPUs by UUID (CUDA numbers GPUs fastest-first unless
CUDA_DEVICE_ORDER=PCI_BUS_ID, and CUDA_VISIBLE_DEVICES may hide some), so the scope names NVML's index.
A GPU CUDA cannot use is a SKIP here that points at cuda.visible, which FAILs it once for the node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuval.health._common import bus_key, gpu_scope, node_scope, reachable, skip, why_no_gpus
from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.results import Check, Status

SIZE = 512
TOLERANCE = 1e-9  # absolute, on values of magnitude <= SIZE


def multiply(a: Any, b: Any, out: Any) -> None:
    """The device computation (a seam for tests that simulate a faulty GPU)."""
    import torch

    torch.matmul(a, b, out=out)


def smoke(device: Any, seed: int = 0) -> tuple[bool, str]:
    """(passed, what happened) for one torch device; raises what CUDA raises."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    a = torch.rand(SIZE, SIZE, dtype=torch.float64, generator=generator) * 2 - 1
    b = torch.rand(SIZE, SIZE, dtype=torch.float64, generator=generator) * 2 - 1
    expected = a @ b
    a_dev, b_dev = a.to(device), b.to(device)
    out = torch.full((SIZE, SIZE), float("nan"), dtype=torch.float64, device=device)
    multiply(a_dev, b_dev, out)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    got = out.cpu()
    unwritten = int(torch.isnan(got).sum())
    if unwritten:
        return False, f"{unwritten} of {SIZE * SIZE} output elements were never written"
    error = float((got - expected).abs().max())
    if error > TOLERANCE:
        wrong = int(((got - expected).abs() > TOLERANCE).sum())
        return False, f"{wrong} of {SIZE * SIZE} elements differ from the CPU result (max error {error:.3g})"
    return True, f"{SIZE}x{SIZE} float64 matmul matches the CPU (max error {error:.1g})"


def _cuda_devices(torch: Any) -> tuple[dict[str, int], dict[tuple[int, int, int], int]]:
    """CUDA device index by NVML-style UUID ('GPU-…') and by PCI (domain, bus, device), for the GPUs
    CUDA can see; torch prints UUIDs without NVML's 'GPU-' prefix, and older builds have no PCI ids."""
    by_uuid, by_bus = {}, {}
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        uuid = str(getattr(props, "uuid", "") or "")
        if uuid:
            by_uuid[uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"] = index
        pci = tuple(getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
        if all(isinstance(part, int) for part in pci):
            by_bus[pci] = index
    return by_uuid, by_bus


def cuda_indices(torch: Any, gpus: list[Any]) -> list[tuple[Any, int | None]]:
    """Each NVML GPU with its CUDA device index (None where CUDA cannot see it)."""
    by_uuid, by_bus = _cuda_devices(torch)
    pairs = []
    for gpu in gpus:
        index = by_uuid.get(str(gpu.uuid))
        pairs.append((gpu, index if index is not None else by_bus.get(bus_key(gpu.pci_bus_id))))
    return pairs


def why_no_cuda(torch: Any) -> str:
    """Why CUDA cannot run here, for a SKIP that points at cuda.visible (which judges it)."""
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is built without CUDA: see cuda.visible"
    try:
        torch.cuda.init()
    except Exception as exc:  # noqa: BLE001 - CUDA's own reason is the message
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    else:
        message = "CUDA sees no device"
    return f"CUDA cannot use the GPUs NVML lists ({message}): see cuda.visible"


def cuda_targets(ctx: HealthContext, name: str) -> tuple[list[tuple[str, Any]], list[Check]]:
    """The CUDA device of every GPU NVML answered for, with its scope, and the checks (named `name`)
    for what cannot run: no GPU, no CUDA, a GPU CUDA cannot see."""
    gpus = [gpu for gpu in ctx.snapshot.gpus if reachable(gpu)]
    if not gpus:
        reason = (
            why_no_gpus(ctx.snapshot) if not ctx.snapshot.gpus else "no GPU answers NVML (see gpu.reachable)"
        )
        return [], [skip(name, node_scope(ctx.node), reason)]
    import torch

    if not torch.cuda.is_available():
        return [], [skip(name, node_scope(ctx.node), why_no_cuda(torch))]
    targets, checks = [], []
    for gpu, index in cuda_indices(torch, gpus):
        scope = gpu_scope(ctx.node, gpu.index)
        if index is None:
            checks.append(skip(name, scope, "CUDA cannot see this GPU: see cuda.visible"))
        else:
            targets.append((scope, torch.device("cuda", index)))
    return targets, checks


def on_each_gpu(targets: list[tuple[str, Any]], work: Callable[[str, Any], Any]) -> list[tuple[str, Any]]:
    """[(scope, work(scope, device) or the exception it raised)] in target order, every GPU at once (a thread
    each: torch leaves the GIL while CUDA works). One after another, a node's health time would grow with
    its GPU count: CUDA context start-up and the computation, eight times on an HGX node."""
    from concurrent.futures import ThreadPoolExecutor

    def attempt(target: tuple[str, Any]) -> Any:
        try:
            return work(*target)
        except Exception as exc:  # noqa: BLE001 - the caller judges what this GPU raised
            return exc

    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        outcomes = list(pool.map(attempt, targets))
    return [(scope, outcome) for (scope, _), outcome in zip(targets, outcomes, strict=True)]


def run(ctx: HealthContext) -> list[Check]:
    targets, checks = cuda_targets(ctx, "smoke.matmul")
    if not targets:
        return checks
    import torch

    for scope, outcome in on_each_gpu(targets, lambda _, device: smoke(device)):
        if isinstance(outcome, torch.cuda.OutOfMemoryError):
            first = str(outcome).splitlines()[0]
            checks.append(
                Check(
                    name="smoke.matmul",
                    status=Status.ERROR,
                    scope=scope,
                    detail=f"no memory for the smoke test ({first}): see processes.foreign, rerun on an "
                    "idle GPU",
                )
            )
            continue
        if isinstance(outcome, Exception):  # a CUDA error on a device is a fault of that GPU
            first = str(outcome).strip().splitlines()[0] if str(outcome).strip() else type(outcome).__name__
            passed, detail = False, f"CUDA failed on this GPU ({first}): {_ACTION}"
        else:
            passed, detail = outcome
            detail = detail if passed else f"{detail}: the GPU computes wrong results; {_ACTION}"
        checks.append(
            Check(
                name="smoke.matmul", status=Status.PASS if passed else Status.FAIL, scope=scope, detail=detail
            )
        )
    return checks


_ACTION = "drain the node, reset the GPU (nvidia-smi -r) and run field diagnostics (dcgmi diag -r 3)"

register(
    HealthCheck(name="smoke", summary="CUDA smoke test: allocate, multiply, copy back, compare", run=run)
)

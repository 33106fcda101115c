"""Dense matrix-multiply throughput per GPU over a shape sweep, every local GPU at the same time.

One size is not enough: the best rate depends on the shape (tile quantisation, wave count), so the
sweep reports the best shape per dtype. FLOPs of C = A(m,k) @ B(k,n) are 2*m*n*k (one multiply and one
add per term). Inputs are random normal values: zero-filled inputs run faster and flatter the GPU.
"""

from __future__ import annotations

import contextlib
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, StrictInt

from gpuval.bench.registry import Benchmark, BenchmarkSkipped, Context, register
from gpuval.metrics import MeasurementDecl, Metric
from gpuval.results import Measurement
from gpuval.timing import CPU_TIMING, TimedOptions, expected_timed_s, measure_with

Dtype = Literal["bf16", "fp16", "fp8", "tf32", "fp32"]  # the order they are shown in
DTYPES: tuple[str, ...] = get_args(Dtype)

# Shapes (m, n, k): m = n from 2048 to 16384, k from 4096 to 16384, plus the cubes 4096^3, 6144^3 and
# 8192^3 that plain back-to-back loops (and most published figures) use. The best rate depends on the
# shape (tile quantisation, wave count), so no single one is trusted. fp32/tf32 run fewer shapes since
# they are 2-15x slower. Smaller shapes first: the GPU heats up as the sweep goes on.
_GPU_SHAPES = sorted(
    {(mn, mn, k) for mn in (2048, 4096, 6144, 8192, 12288, 16384) for k in (4096, 8192, 16384)}
    | {(mn, mn, mn) for mn in (4096, 6144, 8192)},
    key=lambda shape: shape[0] * shape[1] * shape[2],
)
_GPU_SHAPES_QUICK = [(4096, 4096, 4096), (6144, 6144, 6144), (4096, 4096, 16384), (8192, 8192, 8192)]
_SLOW_DTYPES = {
    "fp32": [(4096, 4096, 4096), (8192, 8192, 8192)],
    "tf32": [(4096, 4096, 4096), (8192, 8192, 8192)],
}
_CPU_SHAPES = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024)]
_CPU_SHAPES_QUICK = [(256, 256, 256), (512, 512, 512)]


# A side of a multiplied matrix: at least 1; past 2**20 it is a typo, not a shape anyone times
Dim = Annotated[StrictInt, Field(ge=1, le=2**20)]
Shape = tuple[Dim, Dim, Dim]


class MatmulOptions(TimedOptions):
    # none of them empty: an empty list measures nothing and would print an empty table
    dtypes: list[Dtype] = Field(
        min_length=1, description="precisions measured, of bf16, fp16, fp8, tf32, fp32"
    )
    shapes: list[Shape] = Field(min_length=1, description="(m, n, k) for bf16/fp16/fp8")
    slow_shapes: list[Shape] = Field(min_length=1, description="(m, n, k) for tf32/fp32")


def _defaults(quick: bool, on_gpu: bool) -> dict[str, Any]:
    if on_gpu:
        return {
            "dtypes": ["bf16", "fp16", "tf32", "fp32", "fp8"],
            "shapes": _GPU_SHAPES_QUICK if quick else _GPU_SHAPES,
            "slow_shapes": _SLOW_DTYPES["fp32"][1:] if quick else _SLOW_DTYPES["fp32"],
            "min_time_s": 0.1 if quick else 0.2,
        }
    return {
        "dtypes": ["fp32"],
        "shapes": _CPU_SHAPES_QUICK if quick else _CPU_SHAPES,
        "slow_shapes": _CPU_SHAPES_QUICK if quick else _CPU_SHAPES,
        "repeats": 3,
        **CPU_TIMING,
    }


# Pessimistic multiply rates for the phase's deadline (gpuval.deadline), keyed by "on a GPU": 10 TFLOP/s
# (below an H100's fp32 without tensor cores), 1 GFLOP/s (one loaded CPU core).
_PESSIMISTIC_FLOPS = {True: 1e13, False: 1e9}


def expected_s(options: MatmulOptions, runtime: Any) -> float:
    """Seconds the sweep takes at the pessimistic rate: every shape of every dtype, timed as measure_with."""
    rate = _PESSIMISTIC_FLOPS[bool(runtime.on_gpu)]
    total = 0.0
    for dtype in options.dtypes:
        shapes = options.slow_shapes if dtype in ("tf32", "fp32") else options.shapes
        total += sum(expected_timed_s(options, 2.0 * m * n * k / rate) for m, n, k in shapes)
    return total


def tflops(m: int, n: int, k: int, seconds: float) -> float:
    """2*m*n*k floating-point operations over the time, in 1e12/s."""
    return 2.0 * m * n * k / seconds / 1e12


def fp8_supported(device: Any) -> bool:
    import torch

    return (
        device.type == "cuda"
        and torch.cuda.get_device_capability(device) >= (8, 9)
        and hasattr(torch, "_scaled_mm")
    )


@contextlib.contextmanager
def _fp32_precision(tf32: bool):
    import torch

    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9
        before = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if tf32 else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = before
    else:
        before = matmul.allow_tf32
        matmul.allow_tf32 = tf32
        try:
            yield
        finally:
            matmul.allow_tf32 = before


def _product(dtype: str, m: int, n: int, k: int, device: Any):
    """A closure computing one product of random (m,k) x (k,n) operands in `dtype`."""
    import torch

    generator = torch.Generator(device=device).manual_seed(1234)
    if dtype == "fp8":
        a = torch.randn(m, k, device=device, generator=generator).to(torch.float8_e4m3fn)
        # _scaled_mm wants the second operand column-major: make (n,k) row-major and transpose it.
        b = torch.randn(n, k, device=device, generator=generator).to(torch.float8_e4m3fn).t()
        scale = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
    torch_dtype = {
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "tf32": torch.float32,
        "fp32": torch.float32,
    }[dtype]
    a = torch.randn(m, k, device=device, generator=generator, dtype=torch_dtype)
    b = torch.randn(k, n, device=device, generator=generator, dtype=torch_dtype)
    out = torch.empty(m, n, device=device, dtype=torch_dtype)
    return lambda: torch.matmul(a, b, out=out)


def run_matmul(ctx: Context, options: MatmulOptions) -> list[Measurement]:
    runtime = ctx.runtime
    device = runtime.device
    on_gpu = device.type == "cuda"
    scope = runtime.device_scope
    best: dict[str, float] = {}
    best_shape: dict[str, list[int]] = {}
    sweep: list[Measurement] = []
    for dtype in options.dtypes:
        if dtype == "fp8" and not fp8_supported(device):
            continue
        if dtype == "tf32" and not on_gpu:
            continue
        shapes = options.slow_shapes if dtype in ("tf32", "fp32") else options.shapes
        runtime.barrier()  # every GPU starts each dtype together: shared power and cooling, as in use
        with _fp32_precision(tf32=dtype == "tf32") if on_gpu else contextlib.nullcontext():
            for m, n, k in shapes:
                ctx.progress(f"matmul {dtype} {m}x{n}x{k}")
                product = _product(dtype, m, n, k, device)
                windows = measure_with(product, device, options)
                median_s = windows.median_s
                rate = tflops(m, n, k, median_s)
                sweep.append(
                    Measurement(
                        name="matmul_sweep",
                        scope=scope,
                        params={"dtype": dtype, "m": m, "n": n, "k": k, "calls_per_window": windows.calls},
                        metrics={
                            "tflops": rate,
                            "time_us": median_s * 1e6,
                            "tflops_min": tflops(m, n, k, max(windows.seconds)),
                            "tflops_max": tflops(m, n, k, min(windows.seconds)),
                        },
                        samples=len(windows.seconds),
                    )
                )
                if rate > best.get(dtype, 0.0):
                    best[dtype], best_shape[dtype] = rate, [m, n, k]
                del product
    if not sweep:  # every dtype asked for was left out above: an empty table is no measurement
        raise BenchmarkSkipped(
            f"none of dtypes {options.dtypes} runs here (fp8: compute capability 8.9+, tf32: a GPU)"
        )
    if on_gpu:
        import torch

        torch.cuda.empty_cache()
    summary = Measurement(
        name="matmul",
        scope=scope,
        params={"best_shape": best_shape},
        metrics={f"{dtype}_tflops": rate for dtype, rate in best.items()},
        samples=options.repeats,
    )
    return [summary, *sweep]


_HINT = "check clocks, power limit and throttle reasons (nvidia-smi -q -d PERFORMANCE,POWER)"
_PLOTTED = ("bf16", "fp8")

register(
    Benchmark(
        name="matmul",
        summary="bf16/fp16/tf32/fp32/fp8 matrix-multiply TFLOP/s per GPU, best over a shape sweep",
        options=MatmulOptions,
        defaults=_defaults,
        run=run_matmul,
        expected_s=expected_s,
        metrics=(
            MeasurementDecl(
                "matmul",
                tuple(
                    Metric(f"{d}_tflops", "TFLOP/s", +1, description=f"matmul {d}", plot=d in _PLOTTED)
                    for d in DTYPES
                ),
                hint=_HINT,
                view="per_gpu",
            ),
            MeasurementDecl(  # every shape of the sweep: in result.json, not shown
                "matmul_sweep",
                (
                    Metric("tflops", "TFLOP/s", +1, description="matmul at this shape"),
                    Metric("time_us", "us", -1, description="time per multiply"),
                ),
                identity=("dtype", "m", "n", "k"),
                hint=_HINT,
                view="none",
            ),
        ),
        outlier_metrics=("bf16_tflops", "fp32_tflops"),
    )
)

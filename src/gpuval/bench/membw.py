"""Memory bandwidth per GPU: device copy/read/write and pinned host<->device copies.

Bytes counted: copy = bytes read + bytes written (2 x buffer), read = buffer bytes read by a sum
reduction, write = buffer bytes written by a fill. Host<->device copies count the buffer once.
TB/s and GB/s are 1e12 and 1e9 bytes per second.
"""

from __future__ import annotations

import statistics
from typing import Any

from pydantic import Field

from gpuval.bench.registry import Benchmark, Context, register
from gpuval.config import ByteSize
from gpuval.results import Measurement
from gpuval.timing import CPU_TIMING, TimedOptions, measure_with


class MembwOptions(TimedOptions):
    device_bytes: ByteSize = Field(description="buffer size for device copy/read/write")
    host_bytes: ByteSize = Field(description="pinned host buffer for host<->device copies")


def _defaults(quick: bool, on_gpu: bool) -> dict[str, Any]:
    if on_gpu:
        return {
            "device_bytes": 2**30 if quick else 2**32,
            "host_bytes": 2**28 if quick else 2**30,
            "min_time_s": 0.1 if quick else 0.3,
        }
    return {
        "device_bytes": 2**25 if quick else 2**26,
        "host_bytes": 2**20,
        "repeats": 5,
        **CPU_TIMING,
    }


def run_membw(ctx: Context, options: MembwOptions) -> list[Measurement]:
    import torch

    runtime = ctx.runtime
    device = runtime.device
    on_gpu = device.type == "cuda"
    scope = runtime.device_scope
    count = options.device_bytes // 4
    nbytes = count * 4
    src = torch.rand(count, device=device) + 0.5  # random, non-zero
    dst = torch.empty_like(src)

    def rate(seconds: list[float], bytes_counted: int, scale: float) -> tuple[float, float, float]:
        return (
            bytes_counted / statistics.median(seconds) / scale,
            bytes_counted / max(seconds) / scale,
            bytes_counted / min(seconds) / scale,
        )

    runtime.barrier()
    results: dict[str, float] = {}
    spread: dict[str, float] = {}
    for label, fn, counted in (
        ("copy", lambda s=src, d=dst: d.copy_(s), 2 * nbytes),
        ("read", lambda s=src: s.sum(), nbytes),
        ("write", lambda d=dst: d.fill_(1.5), nbytes),
    ):
        ctx.progress(f"membw {label}")
        times = measure_with(fn, device, options)
        median, low, high = rate(times, counted, 1e12)
        results[f"{label}_tbps"], spread[f"{label}_tbps_min"], spread[f"{label}_tbps_max"] = median, low, high
    del src, dst, fn  # the last lambda holds a buffer too
    if on_gpu:
        host_count = options.host_bytes // 4
        host = torch.rand(host_count).add_(0.5).pin_memory()
        on_device = torch.empty(host_count, device=device)
        for label, fn in (
            ("h2d", lambda: on_device.copy_(host, non_blocking=True)),
            ("d2h", lambda: host.copy_(on_device, non_blocking=True)),
        ):
            ctx.progress(f"membw {label}")
            times = measure_with(fn, device, options)
            median, low, high = rate(times, host_count * 4, 1e9)
            results[f"{label}_gbps"], spread[f"{label}_gbps_min"], spread[f"{label}_gbps_max"] = (
                median,
                low,
                high,
            )
        del host, on_device
        torch.cuda.empty_cache()
    return [
        Measurement(
            name="membw",
            scope=scope,
            params={"device_bytes": nbytes, "host_bytes": options.host_bytes if on_gpu else 0},
            metrics={**results, **spread},
            samples=options.repeats,
        )
    ]


register(
    Benchmark(
        name="membw",
        summary="device copy/read/write TB/s and pinned host<->device GB/s per GPU",
        options=MembwOptions,
        defaults=_defaults,
        run=run_membw,
        produces=("membw",),
        outlier_metrics=("copy_tbps",),
    )
)

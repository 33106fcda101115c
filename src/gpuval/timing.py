"""Timing of device work: CUDA events on GPUs, a monotonic clock on CPUs; medians with spread."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


def measure(
    fn: Callable[[], Any],
    device: Any,
    *,
    warmup: int,
    repeats: int,
    inner: int = 1,
    before_each: Callable[[], None] | None = None,
    warmup_s: float = 0.0,
    min_time_s: float = 0.0,
    max_repeats: int = 10_000,
) -> list[float]:
    """Seconds per call of `fn`, one value per repetition of `inner` back-to-back calls.

    Warm-up calls run first so that kernel selection, allocator growth and lazy initialisation stay out of
    the numbers. On CUDA the region is bracketed by events on the current stream, so host-side launch
    cost only counts when the GPU actually waits for it. `before_each` (e.g. a barrier) runs outside
    the timed region.
    """
    import torch

    cuda = getattr(device, "type", "cpu") == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        fn()
    sync()
    began = time.perf_counter()
    while time.perf_counter() - began < warmup_s:
        fn()
        sync()
    times: list[float] = []
    while len(times) < max_repeats and (len(times) < repeats or sum(times) * inner < min_time_s):
        if before_each is not None:
            before_each()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / inner)
        else:
            began = time.perf_counter()
            for _ in range(inner):
                fn()
            times.append((time.perf_counter() - began) / inner)
    return times


def summarize(values: list[float]) -> dict[str, float]:
    """Median, extremes and the relative spread (max-min over median, %) of a list of samples."""
    if not values:
        raise ValueError("no samples to summarize")
    median = statistics.median(values)
    low, high = min(values), max(values)
    return {
        "median": median,
        "min": low,
        "max": high,
        "spread_pct": (high - low) / median * 100.0 if median else 0.0,
    }


class TimedOptions(BaseModel):
    """How long to warm up and time: the options every per-GPU benchmark shares."""

    model_config = ConfigDict(extra="forbid")

    warmup: int = Field(3, ge=0, description="untimed calls first")
    repeats: int = Field(10, ge=1, description="timed calls at least; the median is reported")
    warmup_s: float = Field(0.1, ge=0, description="seconds of warm-up at least (clocks settle under load)")
    min_time_s: float = Field(0.2, ge=0, description="seconds of timed calls at least")


# On CPUs (CI, laptops) the point is the code path, not a settled clock: few calls, no timed warm-up.
CPU_TIMING: dict[str, Any] = {"warmup": 1, "warmup_s": 0.0, "min_time_s": 0.0}


def measure_with(fn: Callable[[], Any], device: Any, options: TimedOptions) -> list[float]:
    return measure(
        fn,
        device,
        warmup=options.warmup,
        repeats=options.repeats,
        warmup_s=options.warmup_s,
        min_time_s=options.min_time_s,
    )

"""Timing of device work: CUDA events on GPUs, a monotonic clock on CPUs; medians with spread."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def measure(
    fn: Callable[[], Any], device: Any, *, warmup: int, repeats: int, inner: int = 1,
    before_each: Callable[[], None] | None = None,
) -> list[float]:
    """Seconds per call of `fn`, one value per repetition of `inner` back-to-back calls.

    Warm-up calls run first so that kernel selection, allocator growth and lazy initialisation stay out of
    the numbers. On CUDA the region is bracketed by events on the current stream, so host-side launch
    cost only counts when the GPU actually waits for it. `before_each` (e.g. a barrier) runs outside
    the timed region.
    """
    import torch

    for _ in range(warmup):
        fn()
    cuda = getattr(device, "type", "cpu") == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    times: list[float] = []
    for _ in range(repeats):
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

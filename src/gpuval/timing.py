"""Timing of device work: CUDA events on GPUs, a monotonic clock on CPUs; medians with spread."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from gpuval.config import Number

# What one timing may be asked for at most: more is a typo that would run for hours, not a measurement
MAX_CALLS = 10_000  # warm-up calls, timed windows or blocks, ops per block
MAX_SECONDS = 3600.0  # seconds of warm-up or of timed windows


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
    max_repeats: int = MAX_CALLS,
) -> list[float]:
    """Seconds per call of `fn`, one value per window of `inner` back-to-back calls.

    Warm-up calls run first so that kernel selection, allocator growth and lazy initialisation stay out of
    the numbers. On CUDA each window is bracketed by events on the current stream, so host-side launch
    cost only counts when the GPU actually waits for it. `before_each` (e.g. a barrier) runs outside
    the timed region.
    """
    _warm_up(fn, device, warmup, warmup_s)
    times: list[float] = []
    while len(times) < max_repeats and (len(times) < repeats or sum(times) * inner < min_time_s):
        if before_each is not None:
            before_each()
        times.append(_window(fn, device, inner) / inner)
    return times


def _sync(device: Any) -> None:
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _warm_up(fn: Callable[[], Any], device: Any, calls: int, seconds: float) -> None:
    for _ in range(calls):
        fn()
    _sync(device)
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        fn()
        _sync(device)


def _window(fn: Callable[[], Any], device: Any, calls: int) -> float:
    """Seconds taken by `calls` back-to-back calls: CUDA events on the device, a monotonic clock on CPUs."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - began


@dataclass(frozen=True)
class Windows:
    """Per-call seconds of each timed window, and how many back-to-back calls each window held."""

    seconds: list[float]
    calls: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)


def calls_per_window(fn: Callable[[], Any], device: Any, window_s: float) -> int:
    """How many back-to-back calls fill `window_s`, from one timed call (after warm-up).

    One call timed alone, with a sync after it, is what a benchmark loop sees, not what a job sees: the
    GPU idles between calls, its clocks settle differently, and another process time-sliced onto the GPU
    can fall between samples and never be seen. nccl-tests and the MAMF finder time many calls between
    two events; a window of ~20 ms makes launch and sync cost vanish and spans several time slices.
    """
    if window_s <= 0:
        return 1
    one = _window(fn, device, 1)
    return max(1, min(100_000, math.ceil(window_s / max(one, 1e-9))))


class TimedOptions(BaseModel):
    """How long to warm up and time: the options every per-GPU benchmark shares."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    warmup: StrictInt = Field(3, ge=0, le=MAX_CALLS, description="untimed calls first")
    repeats: StrictInt = Field(
        10, ge=1, le=MAX_CALLS, description="timed windows at least; the median window is reported"
    )
    warmup_s: Number = Field(
        0.1, ge=0, le=MAX_SECONDS, description="seconds of warm-up at least (clocks settle under load)"
    )
    min_time_s: Number = Field(0.2, ge=0, le=MAX_SECONDS, description="seconds of timed windows at least")
    window_s: Number = Field(
        0.02, ge=0, le=10, description="seconds of back-to-back calls per timed window (0: one call each)"
    )


# On CPUs (CI, laptops) the point is the code path, not a settled clock: few calls, no timed warm-up.
CPU_TIMING: dict[str, Any] = {"warmup": 1, "warmup_s": 0.0, "min_time_s": 0.0, "window_s": 0.005}


def expected_timed_s(options: TimedOptions, call_s: float) -> float:
    """The seconds measure_with takes for calls of `call_s` each (a pessimistic guess, for a phase's
    deadline): warm-up calls and seconds, a call to size the windows, and `repeats` windows of at least
    one call and `window_s` each, for `min_time_s` at least."""
    window_s = max(options.window_s, call_s)
    timed_s = max(options.min_time_s, options.repeats * window_s)
    return (options.warmup + 2) * call_s + options.warmup_s + timed_s


def measure_with(fn: Callable[[], Any], device: Any, options: TimedOptions) -> Windows:
    """Windows of back-to-back calls of `fn` after the options' warm-up: the rate a user's job sees."""
    _warm_up(fn, device, options.warmup, options.warmup_s)
    calls = calls_per_window(fn, device, options.window_s)
    seconds = measure(
        fn,
        device,
        warmup=0,
        repeats=options.repeats,
        inner=calls,
        min_time_s=options.min_time_s,
    )
    return Windows(seconds=seconds, calls=calls)

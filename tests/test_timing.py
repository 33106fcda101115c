"""Timing windows: what a user's job sees, not what one call timed alone sees."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from gpuval.timing import TimedOptions, calls_per_window, measure, measure_with

CPU = torch.device("cpu")
pytestmark = pytest.mark.serial  # calls per wall-clock window: no other test may share the CPU


def _busy(seconds: float) -> None:
    """Spin (not sleep) for `seconds`: a sleep may overshoot by a scheduler tick on a busy CI machine."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _sliced(call_s: float, every: int, stolen_s: float):
    """A call of `call_s`, where every `every`-th call also loses `stolen_s`: another process's time slice."""
    counter = itertools.count(1)

    def call() -> None:
        _busy(call_s + (stolen_s if next(counter) % every == 0 else 0.0))

    return call


def test_a_window_holds_enough_calls_to_fill_it():
    calls = calls_per_window(lambda: _busy(0.001), CPU, window_s=0.02)
    assert 12 <= calls <= 21  # 20 at 1.0 ms a call; fewer only if the calibration call ran long
    assert calls_per_window(lambda: _busy(0.001), CPU, window_s=0.0) == 1


def test_windows_see_time_slicing_that_single_calls_miss():
    # Every 10th call loses 10 ms to "another process": a job of back-to-back calls runs at
    # (9 x 1 + 11) / 10 = 2.0 ms a call. Calls timed one at a time have a median of 1 ms and never see it.
    single = measure(_sliced(0.001, 10, 0.010), CPU, warmup=0, repeats=40)
    assert sorted(single)[len(single) // 2] < 0.0015
    options = TimedOptions(warmup=0, repeats=6, warmup_s=0.0, min_time_s=0.0, window_s=0.02)
    windows = measure_with(_sliced(0.001, 10, 0.010), CPU, options)
    assert windows.calls >= 10
    assert 0.0016 < windows.median_s < 0.0035
    assert len(windows.seconds) == 6


def test_min_time_counts_whole_windows():
    options = TimedOptions(warmup=0, repeats=1, warmup_s=0.0, min_time_s=0.1, window_s=0.02)
    windows = measure_with(lambda: _busy(0.002), CPU, options)
    assert sum(windows.seconds) * windows.calls >= 0.1
    assert len(windows.seconds) <= 8  # ~5 windows of 20 ms, not 50 single calls

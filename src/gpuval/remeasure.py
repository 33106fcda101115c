"""Noisy metrics measured again once before they FAIL.

A noisy metric (metrics.Metric.noisy: the pinned host<->device copies, which ride on the host's memory and
PCIe root as much as on the GPU) can read low on a healthy GPU once. Where accept's check of one would
FAIL, every rank runs that benchmark once more, each on its own GPU as the first time, and each
measurement keeps the better of its two values of every noisy metric, both recorded in
params['remeasured'] so that the check's detail says so. Other metrics keep their first value: a second
run never rescues a device copy or a matmul.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuval import metrics
from gpuval.bench.registry import producers as benchmark_producers
from gpuval.bench.run import Outcome, run_benchmarks
from gpuval.checkref import CheckRef
from gpuval.checks import threshold_checks
from gpuval.config import Profile
from gpuval.metrics import SPREAD_SUFFIXES
from gpuval.results import Measurement, Status


def noisy_failures(
    profile: Profile, outcome: Outcome, producers: dict[str, str], gpus_per_node: int | None
) -> list[str]:
    """The benchmarks whose noisy metric's check FAILs on the measurements so far, in the order found."""
    found: list[str] = []
    for check in threshold_checks(profile, outcome.measurements, outcome.not_run, producers, gpus_per_node):
        ref = CheckRef.read(check.name)
        source = producers.get(ref.measurement) if ref else None
        if (
            check.status is Status.FAIL
            and ref
            and metrics.noisy(ref.measurement, ref.metric)
            and source
            and source not in found
        ):
            found.append(source)
    return found


def _key(measurement: Measurement) -> tuple[str, str, tuple[Any, ...]]:
    identity = metrics.identity(measurement.name) or tuple(sorted(measurement.params))
    return measurement.name, measurement.scope, tuple(repr(measurement.params.get(p)) for p in identity)


def keep_better(first: list[Measurement], second: list[Measurement]) -> list[Measurement]:
    """`first` with each noisy metric replaced by the better of its two values (its spread companions
    follow the value kept), and params['remeasured'] = {metric: [first, second]}."""
    again = {_key(m): m for m in second}
    merged = []
    for measurement in first:
        other = again.get(_key(measurement))
        values, remeasured = dict(measurement.metrics), {}
        for key, value in measurement.metrics.items():
            if other is None or not metrics.noisy(measurement.name, key) or key.endswith(SPREAD_SUFFIXES):
                continue
            later = other.metrics.get(key)
            if value is None or later is None:
                continue
            remeasured[key] = [value, later]
            if (later - value) * metrics.direction(measurement.name, key) > 0:
                for name in (key, *(key + suffix for suffix in SPREAD_SUFFIXES)):
                    if name in other.metrics:
                        values[name] = other.metrics[name]
        if remeasured:
            params = {**measurement.params, "remeasured": remeasured}
            measurement = measurement.model_copy(update={"metrics": values, "params": params})
        merged.append(measurement)
    return merged


def remeasure_noisy(
    runtime: Any,
    profile: Profile,
    plan: dict[str, Any],
    quick: bool,
    outcome: Outcome,
    gpus_per_node: int | None,
    progress: Callable[[str, str], None] = lambda bench, message: None,
) -> list[str]:
    """Run on every rank after the benchmarks: measures again, once, each benchmark with a noisy metric
    whose check would FAIL (rank 0 decides, every rank runs it), and keeps the better values in
    `outcome`. Returns the benchmarks measured again."""
    decided = (
        noisy_failures(profile, outcome, benchmark_producers(), gpus_per_node) if runtime.is_main else None
    )
    again = [name for name in runtime.all_gather_object(decided)[0] if name in plan]
    if not again:
        return []
    for name in again:
        progress(name, "a host-side check would FAIL: measuring it again once")
    second = run_benchmarks(runtime, {name: plan[name] for name in again}, quick, progress)
    # a second run that broke leaves the first values standing: they were measured and judged already
    outcome.measurements = keep_better(outcome.measurements, second.measurements)
    for name, seconds in second.durations_s.items():
        outcome.durations_s[name] = outcome.durations_s.get(name, 0.0) + seconds
    return again

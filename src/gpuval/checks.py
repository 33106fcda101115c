"""Measurements held against a profile's thresholds, plus the checks every run makes on its own:
exact collective results, and the slowest GPU or link against the median of its peers.

Units and hints come from the metric declarations (gpuval.metrics); the '.correct' check's metric is
declared here, the derived 'outliers' measurement in gpuval.metrics.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from gpuval import metrics
from gpuval.config import Profile, Threshold
from gpuval.metrics import Metric
from gpuval.results import Check, Measurement, Status
from gpuval.units import format_bytes

# The '<measurement>.correct' check: wrong elements summed over a measurement's sizes. A check of its own,
# judged exactly (any is a FAIL), so neither compared nor drift-checked.
CORRECT = Metric("correct", "elements", -1, compared=False, description="wrong elements over all sizes")


def gap_to_median_pct(values: list[float]) -> float:
    """How far the lowest value sits below the median, in % of the median (0 when all are equal)."""
    median = statistics.median(values)
    return (median - min(values)) / median * 100.0 if median else 0.0


def outlier_measurements(
    measurements: list[Measurement], outlier_metrics: dict[str, tuple[str, ...]]
) -> list[Measurement]:
    """One 'outliers' measurement per benchmark whose metric was measured on two or more GPUs or links.

    Metric `<benchmark>_pct` = slowest vs median in %; params name the slowest scope so a FAIL points at it.
    The first of a benchmark's candidate metrics that was measured is used.
    """
    derived = []
    for benchmark, candidates in outlier_metrics.items():
        measured = {key for m in measurements if m.name == benchmark for key in m.metrics}
        metric = next((c for c in candidates if c in measured), None)
        if metric is None:
            continue
        points = [
            (m.metrics[metric], m.scope)
            for m in measurements
            if m.name == benchmark and m.metrics.get(metric) is not None
        ]
        if len(points) < 2:
            continue
        values = [value for value, _ in points]
        slowest_value, slowest_scope = min(points)
        derived.append(
            Measurement(
                name="outliers",
                scope=slowest_scope,
                params={
                    "benchmark": benchmark,
                    "metric": metric,
                    "slowest": slowest_scope,
                    "slowest_value": slowest_value,
                    "median": statistics.median(values),
                    "count": len(values),
                },
                metrics={f"{benchmark}_pct": gap_to_median_pct(values)},
                samples=len(values),
            )
        )
    return derived


def _describe_bound(threshold: Threshold) -> str:
    parts = []
    if threshold.min is not None:
        parts.append(f">= {threshold.min:g}")
    if threshold.max is not None:
        parts.append(f"<= {threshold.max:g}")
    return " and ".join(parts) or "any value"


def _judge(name: str, measurement: Measurement, metric: str, threshold: Threshold) -> Check:
    value = measurement.metrics.get(metric)
    unit = metrics.unit(measurement.name, metric)
    bound = threshold.model_dump(exclude_none=True, exclude={"level"})
    where = f" at {format_bytes(threshold.bytes)}" if threshold.bytes is not None else ""
    if value is None or math.isnan(value):
        return Check(
            name=name,
            status=Status.ERROR,
            threshold=bound,
            unit=unit,
            scope=measurement.scope,
            detail=f"{name}{where}: the benchmark produced no value; rerun and read its log",
        )
    low = threshold.min is not None and value < threshold.min
    high = threshold.max is not None and value > threshold.max
    if not (low or high):
        status, detail = Status.PASS, f"{value:.4g} {unit}{where}, required {_describe_bound(threshold)}"
    else:
        status = Status.WARN if threshold.level == "warn" else Status.FAIL
        detail = (
            f"{value:.4g} {unit}{where} on {measurement.scope}, required {_describe_bound(threshold)}: "
            f"{metrics.hint(measurement.name, metric)}"
        )
        if measurement.name == "outliers":
            detail = (
                f"{measurement.params['slowest']} is {value:.1f}% below the median "
                f"{measurement.params['metric']} ({measurement.params['slowest_value']:.4g} vs "
                f"{measurement.params['median']:.4g}): "
                f"{metrics.hint(measurement.params['benchmark'], measurement.params['metric'])}"
            )
    return Check(
        name=name,
        status=status,
        value=value,
        threshold=bound,
        unit=unit,
        scope=measurement.scope,
        detail=detail,
    )


def threshold_checks(
    profile: Profile,
    measurements: list[Measurement],
    not_run: dict[str, tuple[Status, str]],
    producers: dict[str, str],
) -> list[Check]:
    """One check per (profile check, matching measurement); a check with nothing to judge is never a PASS.

    `not_run` maps a benchmark to (SKIP|ERROR, reason); `producers` maps a measurement name to its benchmark.
    """
    checks: list[Check] = []
    for name, threshold in profile.checks.items():
        target, metric = name.split(".", 1)
        matches = [
            m
            for m in measurements
            if m.name == target
            and metric in m.metrics
            and (threshold.bytes is None or m.params.get("bytes") == threshold.bytes)
        ]
        if matches:
            checks.extend(_judge(name, m, metric, threshold) for m in matches)
            continue
        source = producers.get(target)
        where = f" at {format_bytes(threshold.bytes)}" if threshold.bytes is not None else ""
        status, detail = (
            Status.ERROR,
            f"no '{target}' measurement with metric '{metric}'{where}: its benchmark did not measure it; "
            "fix the check name or the benchmark options",
        )
        if target == "outliers" and metric.endswith("_pct"):
            source = metric[: -len("_pct")]
            if source not in not_run:
                status, detail = Status.SKIP, "fewer than two GPUs or links measured: nothing to compare"
        if source in not_run:
            status, detail = not_run[source]
        checks.append(
            Check(
                name=name,
                status=status,
                threshold=threshold.model_dump(exclude_none=True, exclude={"level"}),
                unit=metrics.unit(target, metric),
                detail=detail,
            )
        )
    return checks


def correctness_checks(measurements: list[Measurement]) -> list[Check]:
    """Every collective result is compared exactly; any wrong element is a FAIL (silent data corruption)."""
    grouped: dict[tuple[str, str], list[Measurement]] = defaultdict(list)
    for m in measurements:
        if "wrong_elements" in m.metrics:
            grouped[(m.name, m.scope)].append(m)
    checks = []
    for (name, scope), items in grouped.items():
        if any(m.metrics["wrong_elements"] is None for m in items):
            checks.append(
                Check(
                    name=f"{name}.{CORRECT.key}",
                    status=Status.ERROR,
                    threshold={"max": 0},
                    unit=CORRECT.unit,
                    scope=scope,
                    detail="the result check produced no count: correctness unknown, rerun",
                )
            )
            continue
        bad = [m for m in items if (m.metrics["wrong_elements"] or 0) > 0]
        wrong = sum(m.metrics["wrong_elements"] or 0 for m in bad)
        if bad:
            sizes = ", ".join(format_bytes(m.params["bytes"]) for m in bad)
            detail = (
                f"{int(wrong)} wrong elements at {sizes}: results differ from the exact expected values; "
                "run it per node (--set scope=node) to isolate the node, then check NVLink/IB errors"
            )
        else:
            detail = f"exact at all {len(items)} sizes"
        checks.append(
            Check(
                name=f"{name}.{CORRECT.key}",
                status=Status.FAIL if bad else Status.PASS,
                value=wrong,
                threshold={"max": 0},
                unit=CORRECT.unit,
                scope=scope,
                detail=detail,
            )
        )
    return checks

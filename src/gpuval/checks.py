"""Measurements held against a profile's thresholds, plus the checks every run makes on its own:
exact collective results, the slowest GPU or link against the median of its peers, and, where
collectives ran node pair by node pair, the node or link those pairs blame (gpuval.pairs).

Units and hints come from the metric declarations (gpuval.metrics); the '.correct' check's metric is
declared here, the derived 'outliers' measurement in gpuval.metrics.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from gpuval import metrics
from gpuval.config import CountBound, Profile, Threshold
from gpuval.metrics import Metric
from gpuval.pairs import Suspect, attribute, describe
from gpuval.results import Check, Measurement, Status
from gpuval.scope import is_pair
from gpuval.units import format_bytes

# The '<measurement>.correct' check: wrong elements summed over a measurement's sizes. A check of its own,
# judged exactly (any is a FAIL), so neither compared nor drift-checked.
CORRECT = Metric("correct", "elements", -1, compared=False, description="wrong elements over all sizes")

# Checks made whenever their measurement exists, with this bound unless the profile sets its own: accept
# runs every pair of nodes on three or more nodes (collectives' also_pairs) whatever the profile lists,
# and a node or link whose pairs reach less than 80% of their peers' is a FAIL.
DEFAULT_CHECKS = {"outliers.collectives_pct": Threshold(max=20)}


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
        derived += pair_outliers(measurements, benchmark, candidates[0])
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


_PAIR_HINTS = {
    "node": "every pair with this node is slow: check its network adapters and ports (ibstat, port error "
    "counters), their PCIe links and NUMA placement, and what else runs there; --set scope=node tests its "
    "inside",
    "link": "only this pair is slow, both nodes are fine with the others: check the cables, switch ports "
    "and routes between the two (port error counters, ibdiagnet)",
}


def pair_outliers(measurements: list[Measurement], benchmark: str, metric: str) -> list[Measurement]:
    """'outliers' measurements from the measurements made across two nodes (scope 'pair:A+B', params
    'nodes'): one per node and per node's slowest pair, as gpuval.pairs.attribute blames them, worst first.

    Metric `<benchmark>_pct` = how far the node's or link's pairs sit below their peers, in %; params
    'finding' names it with its figures. Pairs are compared within one measured thing (name, bytes,
    dtype); a node or link blamed in several keeps its worst.
    """
    groups: dict[tuple[str, Any, Any], dict[tuple[str, str], float]] = defaultdict(dict)
    for m in measurements:
        nodes, value = m.params.get("nodes"), m.metrics.get(metric)
        if is_pair(m.scope) and isinstance(nodes, list) and len(nodes) == 2 and value is not None:
            measured = (m.name, m.params.get("bytes"), m.params.get("dtype"))
            groups[measured][(str(nodes[0]), str(nodes[1]))] = value
    worst: dict[str, tuple[Suspect, tuple[str, Any, Any]]] = {}
    for measured, figures in groups.items():
        for suspect in attribute(figures):
            if suspect.scope not in worst or suspect.gap_pct > worst[suspect.scope][0].gap_pct:
                worst[suspect.scope] = (suspect, measured)
    derived = []
    for scope, (suspect, (name, size, dtype)) in sorted(worst.items(), key=lambda item: -item[1][0].gap_pct):
        where = f", {format_bytes(size)}" if isinstance(size, int) else ""
        derived.append(
            Measurement(
                name="outliers",
                scope=scope,
                params={
                    "benchmark": benchmark,
                    "metric": metric,
                    "measurement": name,
                    "bytes": size,
                    "dtype": dtype,
                    "kind": suspect.kind,
                    "slowest": scope,
                    "slowest_value": suspect.value,
                    "median": suspect.reference,
                    "count": suspect.peers,
                    "finding": f"{describe(suspect, metrics.unit(name, metric))} ({name}{where})",
                    "hint": _PAIR_HINTS[suspect.kind],
                },
                metrics={f"{benchmark}_pct": suspect.gap_pct},
                samples=suspect.peers,
            )
        )
    return derived


def _describe_bound(threshold: Threshold | CountBound) -> str:
    parts = []
    if threshold.min is not None:
        parts.append(f">= {threshold.min:g}")
    if threshold.max is not None:
        parts.append(f"<= {threshold.max:g}")
    return " and ".join(parts) or "any value"


def gpu_count(measurement: Measurement, gpus_per_node: int | None) -> int | None:
    """How many GPUs a measurement spans, the key of Threshold.by_gpus: a collective's ranks, else the
    GPUs of the node (P2P copies run between the GPUs of one node)."""
    ranks = measurement.params.get("ranks")
    return ranks if isinstance(ranks, int) and not isinstance(ranks, bool) else gpus_per_node


def _bound_dict(threshold: Threshold, bound: CountBound | None, gpus: int | None) -> dict[str, Any]:
    """The threshold a check reports: the bound judged by, its size, and the GPU count that chose it."""
    shown: dict[str, Any] = {}
    if bound is not None:
        shown.update(bound.model_dump(exclude_none=True, exclude={"source"}))
    if threshold.bytes is not None:
        shown["bytes"] = threshold.bytes
    if not threshold.flat and gpus is not None:
        shown["gpus"] = gpus
    return shown


def _measured_twice(measurement: Measurement, metric: str, unit: str) -> str:
    """'; measured twice: ...' for a noisy metric that accept measured again (gpuval.remeasure), else ''."""
    both = (measurement.params.get("remeasured") or {}).get(metric)
    if not both:
        return ""
    return (
        f"; measured twice, the better judged ({both[0]:.4g} then {both[1]:.4g} {unit}): host-side copies "
        "vary with the host"
    )


def _judge(
    name: str, measurement: Measurement, metric: str, threshold: Threshold, gpus_per_node: int | None = None
) -> Check:
    value = measurement.metrics.get(metric)
    unit = metrics.unit(measurement.name, metric)
    gpus = gpu_count(measurement, gpus_per_node)
    bound = threshold.at(gpus)
    shown = _bound_dict(threshold, bound, gpus)
    where = f" at {format_bytes(threshold.bytes)}" if threshold.bytes is not None else ""
    if value is None or math.isnan(value):
        return Check(
            name=name,
            status=Status.ERROR,
            threshold=shown,
            unit=unit,
            scope=measurement.scope,
            detail=f"{name}{where}: the benchmark produced no value; rerun and read its log",
        )
    if bound is None:  # by_gpus names other GPU counts: another count's floor says nothing about this one
        counts = ", ".join(str(count) for count in sorted(threshold.by_gpus or {})) or "none"
        return Check(
            name=name,
            status=Status.WARN,
            value=value,
            threshold=shown,
            unit=unit,
            scope=measurement.scope,
            detail=f"not calibrated for {gpus} GPUs: measured {value:.4g} {unit}{where} (the profile bounds "
            f"it for {counts} GPUs; gpuval profiles derive makes a bound from clean runs)",
        )
    low = bound.min is not None and value < bound.min
    high = bound.max is not None and value > bound.max
    finding = measurement.params.get("finding")  # a derived measurement's own words for what it judged
    if not (low or high):
        status, detail = Status.PASS, f"{value:.4g} {unit}{where}, required {_describe_bound(bound)}"
        if finding:
            detail = f"{finding}: {detail}"
    else:
        status = Status.WARN if threshold.level == "warn" else Status.FAIL
        detail = (
            f"{value:.4g} {unit}{where} on {measurement.scope}, required {_describe_bound(bound)}: "
            f"{metrics.hint(measurement.name, metric)}"
        )
        if measurement.name == "outliers" and finding:
            detail = (
                f"{finding}: {value:.1f}% below, required {_describe_bound(bound)}: "
                f"{measurement.params.get('hint') or metrics.hint(measurement.name, metric)}"
            )
        elif measurement.name == "outliers":
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
        threshold=shown,
        unit=unit,
        scope=measurement.scope,
        detail=detail + _measured_twice(measurement, metric, unit),
    )


def threshold_checks(
    profile: Profile,
    measurements: list[Measurement],
    not_run: dict[str, tuple[Status, str]],
    producers: dict[str, str],
    gpus_per_node: int | None = None,
) -> list[Check]:
    """One check per (profile check, matching measurement); a check with nothing to judge is never a PASS.

    `not_run` maps a benchmark to (SKIP|ERROR, reason); `producers` maps a measurement name to its benchmark;
    `gpus_per_node` picks a `by_gpus` bound where a measurement does not say how many ranks it spans.
    """
    checks: list[Check] = []
    wanted = dict(profile.checks)
    for name, threshold in DEFAULT_CHECKS.items():
        target, metric = name.split(".", 1)
        if name not in wanted and any(m.name == target and metric in m.metrics for m in measurements):
            wanted[name] = threshold
    for name, threshold in wanted.items():
        target, metric = name.split(".", 1)
        matches = [
            m
            for m in measurements
            if m.name == target
            and metric in m.metrics
            and (threshold.bytes is None or m.params.get("bytes") == threshold.bytes)
        ]
        if matches:
            checks.extend(_judge(name, m, metric, threshold, gpus_per_node) for m in matches)
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
                threshold=_bound_dict(threshold, threshold.at(gpus_per_node), None),
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

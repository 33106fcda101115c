"""Measurements held against a profile's thresholds.

Units and hints come from the metric declarations (gpuval.metrics); what a derived measurement ('outliers',
'.correct') adds - its own checks, its words for a check past its bound, a check made whenever it exists -
comes from its module in gpuval.derived.
"""

from __future__ import annotations

import math
from typing import Any

from gpuval import derived, metrics
from gpuval.checkref import CheckRef
from gpuval.config import CountBound, Profile, Threshold, evidence
from gpuval.derived.correct import correctness_checks
from gpuval.derived.outliers import gap_to_median_pct, outlier_measurements, pair_outliers
from gpuval.results import Check, Measurement, Status

# made by gpuval.derived, imported from here by callers that judge a run
__all__ = [
    "correctness_checks",
    "gap_to_median_pct",
    "gpu_count",
    "outlier_measurements",
    "pair_outliers",
    "threshold_checks",
]


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
    """The threshold a check reports: the bound judged by, its size, the GPU count that chose it, and what
    stands behind it: the profile's `source` and, in a few words, its `evidence` (derive.evidence)."""
    shown: dict[str, Any] = {}
    if bound is not None:
        shown.update(bound.model_dump(exclude_none=True))
        if bound.source:
            shown["evidence"] = evidence(bound.source)
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
    ref: CheckRef, measurement: Measurement, threshold: Threshold, gpus_per_node: int | None = None
) -> Check:
    name, metric, where = ref.name, ref.metric, ref.where
    value = measurement.metrics.get(metric)
    unit = metrics.unit(measurement.name, metric)
    gpus = gpu_count(measurement, gpus_per_node)
    bound = threshold.at(gpus)
    shown = _bound_dict(threshold, bound, gpus)
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
    kind = derived.get(measurement.name)
    if not (low or high):
        status, detail = Status.PASS, f"{value:.4g} {unit}{where}, required {_describe_bound(bound)}"
        if finding:
            detail = f"{finding}: {detail}"
    else:
        status = Status.WARN if threshold.level == "warn" else Status.FAIL
        if kind is not None and kind.explain is not None:
            detail = kind.explain(measurement, metric, value, _describe_bound(bound))
        else:
            detail = (
                f"{value:.4g} {unit}{where} on {measurement.scope}, required {_describe_bound(bound)}: "
                f"{metrics.hint(measurement.name, metric)}"
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
    wanted = profile.check_refs()
    named = {ref.name for ref, _ in wanted}
    for ref, threshold in derived.default_checks():
        if ref.name not in named and any(ref.selects(m) for m in measurements):
            wanted.append((ref, threshold))
    for ref, threshold in wanted:
        matches = [m for m in measurements if ref.selects(m)]
        if matches:
            checks.extend(_judge(ref, m, threshold, gpus_per_node) for m in matches)
            continue
        kind = derived.get(ref.measurement)
        source = kind.source(ref) if kind is not None else producers.get(ref.measurement)
        status, detail = (
            Status.ERROR,
            f"no '{ref.measurement}' measurement with metric '{ref.metric}'{ref.where}: its benchmark did "
            "not measure it; fix the check name or the benchmark options",
        )
        if kind is not None and kind.nothing_derived and source is not None and source not in not_run:
            status, detail = Status.SKIP, kind.nothing_derived
        if source in not_run:
            status, detail = not_run[source]
        checks.append(
            Check(
                name=ref.name,
                status=status,
                threshold=_bound_dict(threshold, threshold.at(gpus_per_node), None),
                unit=metrics.unit(ref.measurement, ref.metric),
                detail=detail,
            )
        )
    return checks

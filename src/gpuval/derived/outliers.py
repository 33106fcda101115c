"""The 'outliers' measurement: the slowest GPU or link against the median of its peers, and where
collectives ran node pair by node pair, the node or link those pairs blame (gpuval.pairs).

Derived from each benchmark's `outlier_metrics` (gpuval.bench.registry); a profile bounds it as
'outliers.<benchmark>_pct'. Declared, computed and explained here.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from gpuval import metrics
from gpuval.checkref import CheckRef
from gpuval.config import Threshold
from gpuval.derived import Derived, register
from gpuval.errors import UsageError
from gpuval.metrics import MeasurementDecl, Metric
from gpuval.pairs import Suspect, attribute, describe
from gpuval.results import Measurement
from gpuval.scope import is_pair
from gpuval.units import format_bytes

NAME = "outliers"
SUFFIX = "_pct"  # its metric for benchmark X is 'X_pct'

DECL = MeasurementDecl(
    NAME,
    # one metric per compared benchmark: '<benchmark>_pct'
    (Metric(f"*{SUFFIX}", "%", -1, description="slowest GPU or link below the median of its peers"),),
    identity=("benchmark", "metric"),
)

# What to look at when a node pair's figures blame a node, or one link between two nodes.
PAIR_HINTS = {
    "node": "every pair with this node is slow: check its network adapters and ports (ibstat, port error "
    "counters), their PCIe links and NUMA placement, and what else runs there; --set scope=node tests its "
    "inside",
    "link": "only this pair is slow, both nodes are fine with the others: check the cables, switch ports "
    "and routes between the two (port error counters, ibdiagnet)",
}


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
                name=NAME,
                scope=slowest_scope,
                params={
                    "benchmark": benchmark,
                    "metric": metric,
                    "slowest": slowest_scope,
                    "slowest_value": slowest_value,
                    "median": statistics.median(values),
                    "count": len(values),
                },
                metrics={f"{benchmark}{SUFFIX}": gap_to_median_pct(values)},
                samples=len(values),
            )
        )
    return derived


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
                name=NAME,
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
                    "hint": PAIR_HINTS[suspect.kind],
                },
                metrics={f"{benchmark}{SUFFIX}": suspect.gap_pct},
                samples=suspect.peers,
            )
        )
    return derived


def hint(measurement: Measurement) -> str:
    """What to look at: a blamed node or link's own hint, else that of the metric compared."""
    kind = measurement.params.get("kind")
    if kind in PAIR_HINTS:
        return PAIR_HINTS[kind]
    return metrics.hint(str(measurement.params.get("benchmark")), str(measurement.params.get("metric")))


def explain(measurement: Measurement, metric: str, value: float, bound: str) -> str:
    """The detail of an 'outliers' check past its bound: who is slow, by how much, and what to look at."""
    finding = measurement.params.get("finding")
    if finding:
        return f"{finding}: {value:.1f}% below, required {bound}: {hint(measurement)}"
    params = measurement.params
    return (
        f"{params['slowest']} is {value:.1f}% below the median {params['metric']} "
        f"({params['slowest_value']:.4g} vs {params['median']:.4g}): {hint(measurement)}"
    )


def derive(measurements: list[Measurement], benchmarks: Mapping[str, Any]) -> list[Measurement]:
    """The 'outliers' measurements of every benchmark that ran and declares metrics to compare."""
    compared = {name: bench.outlier_metrics for name, bench in benchmarks.items() if bench.outlier_metrics}
    return outlier_measurements(measurements, compared)


def source(ref: CheckRef) -> str | None:
    """The benchmark 'outliers.X_pct' compares: X; None for a metric of another shape."""
    return ref.metric.removesuffix(SUFFIX) if ref.metric.endswith(SUFFIX) else None


def plan(ref: CheckRef, benchmarks: Mapping[str, Any], profile: str) -> str:
    """The benchmark a profile's 'outliers.X_pct' needs run; a check that compares none is a UsageError."""
    compared = source(ref)
    if compared not in benchmarks or not benchmarks[compared].outlier_metrics:
        known = [f"{NAME}.{n}{SUFFIX}" for n, b in benchmarks.items() if b.outlier_metrics]
        raise UsageError(
            f"profile '{profile}': check '{ref}' compares no benchmark; use one of: {', '.join(known)}"
        )
    return compared


register(
    Derived(
        NAME,
        decl=DECL,
        derive=derive,
        plan=plan,
        source=source,
        nothing_derived="fewer than two GPUs or links measured: nothing to compare",
        explain=explain,
        # accept runs every pair of nodes on three or more nodes (collectives' also_pairs) whatever the
        # profile lists, and a node or link whose pairs reach less than 80% of their peers' is a FAIL
        default_checks={f"{NAME}.collectives{SUFFIX}": Threshold(max=20)},
    )
)

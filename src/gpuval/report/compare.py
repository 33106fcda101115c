"""Before/after: every measurement two results share, side by side, with its change and whether it got
better or worse (`gpuval compare A.json B.json`).

A measurement is matched by its name, scope and identity parameters (a collective's size and dtype, a
training run's model, mode and sequence length), not by how it was run (iterations, kernels, CUDA graph),
so a tuning change compares against the run before it. The identity parameters, whether higher is better
and whether a metric is compared at all come from its declaration (gpuval.metrics); an undeclared metric
is shown and never judged.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from gpuval import metrics
from gpuval.results import Measurement, Result
from gpuval.units import format_bytes


@dataclass(frozen=True)
class Row:
    name: str
    scope: str
    identity: str  # "bytes=1048576 dtype=float32", or "" when the name and scope say it all
    metric: str
    before: float
    after: float
    change_pct: float | None  # (after - before) / before; None when before is 0
    better: bool | None  # None: unknown direction or no change


def _identity(measurement: Measurement) -> str:
    keys = metrics.identity(measurement.name)
    if keys is None:  # a measurement nothing declares: every plain parameter identifies it
        keys = tuple(k for k, v in sorted(measurement.params.items()) if isinstance(v, (str, int, float)))
    shown = {k: measurement.params[k] for k in keys if k in measurement.params}
    if isinstance(shown.get("bytes"), int):
        shown["bytes"] = format_bytes(shown["bytes"]).replace(" ", "")
    return " ".join(f"{key}={value}" for key, value in shown.items())


def _index(result: Result) -> dict[tuple[str, str, str, str], float]:
    values = {}
    for m in result.measurements:
        identity = _identity(m)
        for metric, value in m.metrics.items():
            declared = metrics.find(m.name, metric)
            if value is not None and (declared is None or declared.compared):
                values[(m.name, m.scope, identity, metric)] = float(value)
    return values


def compare(before: Result, after: Result) -> tuple[list[Row], dict[str, int]]:
    """Rows for every shared measurement metric, and how many were only in one of the two results."""
    a, b = _index(before), _index(after)
    rows = []
    for key in sorted(a.keys() & b.keys()):
        name, scope, identity, metric = key
        old, new = a[key], b[key]
        change = (new - old) / abs(old) * 100 if old else (0.0 if new == old else None)
        sign = metrics.direction(name, metric)
        better = None if sign == 0 or new == old else (new - old) * sign > 0
        rows.append(Row(name, scope, identity, metric, old, new, change, better))
    return rows, {"only_before": len(a.keys() - b.keys()), "only_after": len(b.keys() - a.keys())}


def regressions(rows: list[Row], threshold_pct: float) -> list[Row]:
    """Rows that got worse by more than `threshold_pct` percent (a worse value from 0 always counts)."""
    return [
        row
        for row in rows
        if row.better is False and (row.change_pct is None or abs(row.change_pct) > threshold_pct)
    ]


def to_json(rows: list[Row], unmatched: dict[str, int], worse: list[Row]) -> str:
    document: dict[str, Any] = {
        "rows": [asdict(row) for row in rows],
        "unmatched": unmatched,
        "regressions": [asdict(row) for row in worse],
    }
    return json.dumps(document, indent=2) + "\n"

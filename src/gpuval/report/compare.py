"""Before/after: every measurement two results share, side by side, with its change and whether it got
better or worse (`gpuval compare A.json B.json`).

Each metric compared is a Row; a measurement (one collective size, one GPU's matmul) is judged once, as a
whole, by its Summary: worse when any of its compared metrics got worse beyond the tolerance (algbw,
busbw and time of one collective are one regression, not three), better when none did and one got
better beyond it, the same otherwise. The summary shows one headline metric per measurement, chosen by
its declaration (MeasurementDecl.headline_keys).

A measurement is matched by its name, scope and identity parameters (a collective's size and dtype, a
training run's model, mode and sequence length), not by how it was run (iterations, kernels, CUDA graph),
so a tuning change compares against the run before it. The identity parameters, whether higher is better
and whether a metric is compared at all come from its declaration (gpuval.metrics); an undeclared metric
is shown and never judged. The declarations are read once per comparison (_Declared): gpuval.metrics
reads them afresh on every lookup, which a 1,000-node result's 200,000 lookups would make a minute.

What a comparison reads of a result is its Side: the verdict and every compared metric's value. `gpuval
compare` reads its two files at once (read_sides), the later one in a child process: reading and
validating a 1,000-node result is ~2 s of one core, and a machine has two.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuval import metrics
from gpuval.forked import in_child
from gpuval.inputs import collector_paused
from gpuval.metrics import MeasurementDecl, Metric
from gpuval.results import Measurement, Result, load_result
from gpuval.units import format_bytes


# Row and Summary are made by the hundred thousand for a large result: plain slotted dataclasses are
# built ~6x faster than frozen ones (0.03 s against 0.2 s for 139,000 rows). Nothing changes them.
@dataclass(slots=True)
class Row:
    name: str
    scope: str
    identity: str  # "bytes=1048576 dtype=float32", or "" when the name and scope say it all
    metric: str
    before: float
    after: float
    change_pct: float | None  # (after - before) / before; None when before is 0
    better: bool | None  # None: unknown direction or no change


@dataclass(slots=True)
class Summary:
    """One measurement of both results, judged as a whole, shown by its headline metric."""

    name: str
    scope: str
    identity: str
    metric: str  # the headline metric: before, after and change_pct are its
    before: float
    after: float
    change_pct: float | None
    verdict: str  # "better", "worse" or "same" (within the tolerance, or no direction)
    worse: tuple[str, ...]  # the compared metrics that got worse beyond the tolerance, the headline first
    better: tuple[str, ...]  # ... and those that got better beyond it


@dataclass
class _Declared:
    """The measurement declarations as they are now (gpuval.metrics.declared), and each metric looked up
    in them once."""

    by_name: dict[str, MeasurementDecl] = field(default_factory=metrics.declared)
    found: dict[tuple[str, str], Metric | None] = field(default_factory=dict)
    headlines: dict[tuple[str, tuple[str, ...]], int] = field(default_factory=dict)

    def metric(self, name: str, key: str) -> Metric | None:
        """metrics.find(name, key)."""
        found = self.found.get((name, key), _UNSEEN)
        if found is _UNSEEN:
            decl = self.by_name.get(name)
            found = self.found[(name, key)] = decl.find(key) if decl is not None else None
        return found  # type: ignore[return-value]

    def headline(self, name: str, keys: tuple[str, ...]) -> int:
        """Which of a measurement's compared metric `keys` is its headline: the first of its declaration's
        headline_keys it has (a key may be a '*' family), else the first. Once per name and keys."""
        chosen = self.headlines.get((name, keys))
        if chosen is None:
            decl = self.by_name.get(name)
            patterns = decl.headline_keys() if decl else []
            matches = (
                i for pattern in patterns for i, key in enumerate(keys) if fnmatch.fnmatchcase(key, pattern)
            )
            chosen = self.headlines[(name, keys)] = next(matches, 0)
        return chosen


_UNSEEN = object()


def _identity(measurement: Measurement, declared: _Declared) -> str:
    decl = declared.by_name.get(measurement.name)
    keys = decl.identity if decl is not None else None
    if keys is None:  # a measurement nothing declares: every plain parameter identifies it
        keys = tuple(k for k, v in sorted(measurement.params.items()) if isinstance(v, (str, int, float)))
    shown = {k: measurement.params[k] for k in keys if k in measurement.params}
    if isinstance(shown.get("bytes"), int):
        shown["bytes"] = format_bytes(shown["bytes"]).replace(" ", "")
    return " ".join(f"{key}={value}" for key, value in shown.items())


def _index(result: Result, declared: _Declared) -> dict[tuple[str, str, str, str], float]:
    values = {}
    for m in result.measurements:
        identity = _identity(m, declared)
        for metric, value in m.metrics.items():
            found = declared.metric(m.name, metric)
            if value is not None and (found is None or found.compared):
                values[(m.name, m.scope, identity, metric)] = float(value)
    return values


@dataclass(frozen=True)
class Side:
    """What a comparison reads of one result: its verdict, and every compared metric's value keyed by
    (measurement, scope, identity, metric), in the result's order."""

    verdict: str
    values: dict[tuple[str, str, str, str], float]


def _values(read: Result | Side) -> dict[tuple[str, str, str, str], float]:
    """The compared values of a result, or of what was read of one."""
    return (read if isinstance(read, Side) else side_of(read)).values


def side_of(result: Result) -> Side:
    return Side(result.verdict.value, _index(result, _Declared()))


def _read_side(path: Path) -> Side:
    """In the reading child, which ends when it has answered (no collection at exit to pay for)."""
    with collector_paused():
        return side_of(load_result(path))


def read_sides(before: Path, after: Path) -> tuple[Side, Side]:
    """Both files' sides (gpuval.results.load_result's one-line errors, the earlier file's first), the
    later one read in a child (gpuval.forked) while this process reads the earlier. For a command, which
    ends soon after: what it reads here is frozen out of the collector's sight."""
    with in_child(_read_side, after) as later:
        with collector_paused(freeze=True):  # a short command: gpuval.inputs says why
            earlier = side_of(load_result(before))
        return earlier, later.result()


def compare(before: Result | Side, after: Result | Side) -> tuple[list[Row], dict[str, int]]:
    """Rows for every metric of the measurements both results have, and how many measurements only one
    result has (`only_before`, `only_after`)."""
    declared = _Declared()
    a, b = _values(before), _values(after)
    measured_a, measured_b = {key[:3] for key in a}, {key[:3] for key in b}
    rows = []
    for key in a:  # in the earlier result's order, so a sweep stays ordered by size
        if key not in b:
            continue
        name, scope, identity, metric = key
        old, new = a[key], b[key]
        change = (new - old) / abs(old) * 100 if old else (0.0 if new == old else None)
        found = declared.metric(name, metric)
        sign = found.direction if found is not None else 0
        better = None if sign == 0 or new == old else (new - old) * sign > 0
        rows.append(Row(name, scope, identity, metric, old, new, change, better))
    return rows, {"only_before": len(measured_a - measured_b), "only_after": len(measured_b - measured_a)}


def lost_metrics(before: Result | Side, after: Result | Side) -> int:
    """Compared metrics of a measurement both results have that only the earlier one has a value of (a
    metric that became null, a NaN when measured, is lost, not unchanged)."""
    a, b = _values(before), _values(after)
    measured_b = {key[:3] for key in b}
    return sum(key[:3] in measured_b for key in a.keys() - b.keys())


def _beyond(row: Row, threshold_pct: float) -> bool:
    """The change is larger than `threshold_pct` percent (a change from 0 always is)."""
    return row.change_pct is None or abs(row.change_pct) > threshold_pct


def regressions(rows: list[Row], threshold_pct: float) -> list[Row]:
    """Rows that got worse by more than `threshold_pct` percent (a worse value from 0 always counts)."""
    return [row for row in rows if row.better is False and _beyond(row, threshold_pct)]


def summarize(rows: list[Row], threshold_pct: float) -> list[Summary]:
    """One Summary per measurement of `rows` (name, scope, identity), in the rows' order, shown by its
    headline metric (_Declared.headline)."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.name, row.scope, row.identity), []).append(row)
    summaries, declared = [], _Declared()
    for (name, scope, identity), group in groups.items():
        head = group[declared.headline(name, tuple(r.metric for r in group))]
        ordered = [head, *(r for r in group if r is not head)]  # the headline first, then as measured
        worse = tuple(r.metric for r in ordered if r.better is False and _beyond(r, threshold_pct))
        better = tuple(r.metric for r in ordered if r.better is True and _beyond(r, threshold_pct))
        verdict = "worse" if worse else "better" if better else "same"
        change = head.change_pct
        summary = Summary(
            name, scope, identity, head.metric, head.before, head.after, change, verdict, worse, better
        )
        summaries.append(summary)
    return summaries


def totals(summaries: list[Summary], unmatched: dict[str, int]) -> dict[str, int]:
    """How many measurements were compared, regressed, improved and stayed the same; how many only one
    result has."""
    count = {verdict: sum(s.verdict == verdict for s in summaries) for verdict in ("worse", "better", "same")}
    return {
        "compared": len(summaries),
        "regressions": count["worse"],
        "improvements": count["better"],
        "unchanged": count["same"],
        "only_before": unmatched["only_before"],
        "only_after": unmatched["only_after"],
    }


def to_json(rows: list[Row], unmatched: dict[str, int], summaries: list[Summary]) -> str:
    """Every metric row, and each measurement's summary; `regressions` lists the measurements that got
    worse (one entry per measurement, however many of its metrics did)."""
    document: dict[str, Any] = {
        "rows": [asdict(row) for row in rows],
        "unmatched": unmatched,
        "measurements": [asdict(summary) for summary in summaries],
        "totals": totals(summaries, unmatched),
        "regressions": [asdict(summary) for summary in summaries if summary.verdict == "worse"],
    }
    return json.dumps(document, indent=2) + "\n"

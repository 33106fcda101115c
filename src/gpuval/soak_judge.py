"""Judging a soak's iterations against each other (gpuval.soak runs them; docs/soak.md says why each rule).

Every rule reads only what each iteration's result.json holds, so a summary can be judged again from
iterations.jsonl:

- intermittent checks: a check bad (WARN/FAIL/ERROR) in some iterations and PASS (or not reported) in
  others: flapping, or a problem that appeared later, such as a clock throttle reason (clocks.event_reasons);
- drift: a benchmark check's value worse than its first iteration's by more than the tolerance, in the
  direction gpuval.metrics declares for that metric (the derived outliers gaps are bounded absolutely
  every iteration and left out: a relative change of a gap near zero says nothing);
- counters that must not grow, read from each iteration's NVML inventory per GPU, and the XIDs the xid
  checks found: any growth after the first iteration is a finding.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuval import derived, metrics
from gpuval.checkref import DRIFT, SOAK, CheckRef, family_of, in_family
from gpuval.results import Check, Result, Status
from gpuval.scope import Scope

_ORDER = {Status.FAIL: 0, Status.ERROR: 1, Status.WARN: 2, Status.PASS: 3, Status.SKIP: 4}
_BAD = (Status.FAIL, Status.ERROR, Status.WARN)


@dataclass(frozen=True)
class Counter:
    """An NVML counter of a GPU (a field of the inventory's GPU entry) that must not grow."""

    field: str
    name: str  # the soak check is 'soak.<name>'
    unit: str
    grows: Status  # what a growth is
    hint: str


_MEMORY = "drain the node and run field diagnostics (dcgmi diag -r 3); replace the GPU if errors recur"
_WATCH = "watch the node: a count that keeps creeping precedes uncorrectable errors (dcgmi health -s m)"
COUNTERS = (
    Counter("ecc_uncorrected_volatile", "ecc.uncorrected_volatile", "errors", Status.FAIL, _MEMORY),
    Counter("ecc_uncorrected_aggregate", "ecc.uncorrected_aggregate", "errors", Status.FAIL, _MEMORY),
    Counter("ecc_corrected_volatile", "ecc.corrected_volatile", "errors", Status.WARN, _WATCH),
    Counter("ecc_corrected_aggregate", "ecc.corrected_aggregate", "errors", Status.WARN, _WATCH),
    Counter("remapped_rows_uncorrectable", "ecc.remapped_rows_uncorrectable", "rows", Status.FAIL, _MEMORY),
    Counter("remapped_rows_correctable", "ecc.remapped_rows_correctable", "rows", Status.WARN, _WATCH),
    Counter("retired_pages_dbe", "ecc.retired_pages_dbe", "pages", Status.FAIL, _MEMORY),
    Counter("retired_pages_sbe", "ecc.retired_pages_sbe", "pages", Status.WARN, _WATCH),
    Counter(
        "pcie_replay_count",
        "pcie.replay_count",
        "replays",
        Status.WARN,
        "check the riser, slot and cable of this GPU: replays that keep growing end in a link trained down",
    ),
)
# per GPU, summed over its links (gpuval.nvml.NvLink)
NVLINK_COUNTERS = (
    Counter("replay_errors", "nvlink.replay_errors", "errors", Status.WARN, "check the NVLink/NVSwitch tray"),
    Counter(
        "recovery_errors", "nvlink.recovery_errors", "errors", Status.WARN, "check the NVLink/NVSwitch tray"
    ),
    Counter(
        "crc_flit_errors", "nvlink.crc_flit_errors", "errors", Status.WARN, "check the NVLink/NVSwitch tray"
    ),
)
_TIMES = re.compile(r"\b(\d+) times\b")  # xid.py's detail: "Xid 79 (…) on GPU 0 3 times in the kernel log …"


@dataclass
class Series:
    """One judged quantity over the iterations (index 0 = iteration 1), as the report plots it."""

    kind: str  # "metric" (a benchmark check's value) | "counter"
    name: str
    scope: str
    unit: str
    values: list[float | None]
    status: Status = Status.PASS
    first_bad: int | None = None  # 1-based
    baseline: float | None = None
    edge: float | None = None  # metric: the worst value within tolerance


@dataclass
class Judged:
    checks: list[Check] = field(default_factory=list)
    first_bad: dict[tuple[str, str], int] = field(default_factory=dict)  # (soak check, scope) -> iteration
    series: list[Series] = field(default_factory=list)

    def add(self, check: Check, first: int | None) -> None:
        """A soak check; a second one with the same name and scope is folded into the first (a check that
        both flapped and drifted is one finding with both reasons)."""
        for index, old in enumerate(self.checks):
            if (old.name, old.scope) == (check.name, check.scope):
                worse = check if _ORDER[check.status] < _ORDER[old.status] else old
                detail = f"{old.detail}; {check.detail}"
                self.checks[index] = worse.model_copy(update={"detail": detail})
                break
        else:
            self.checks.append(check)
        key = (check.name, check.scope)
        if first is not None and (key not in self.first_bad or first < self.first_bad[key]):
            self.first_bad[key] = first


def _hint(check_name: str) -> str:
    """What to look at when the figure of check `check_name` ('<measurement>.<metric>') gets worse."""
    ref = CheckRef.parse(check_name)
    return metrics.hint(ref.measurement, ref.metric)


def _keyed(result: Result) -> dict[tuple[str, str, int], Check]:
    """The checks of one iteration by (name, scope, n): n tells apart two findings of one check on one
    scope (two XIDs on a node)."""
    seen: dict[tuple[str, str], int] = {}
    keyed = {}
    for check in result.checks:
        n = seen.get((check.name, check.scope), 0)
        seen[(check.name, check.scope)] = n + 1
        keyed[(check.name, check.scope, n)] = check
    return keyed


def merge_checks(iterations: list[Result]) -> list[Check]:
    """Every check of every iteration once, at its worst iteration (the latest of equals); when its status
    changed between iterations, its detail starts with the iteration it comes from."""
    chosen: dict[tuple[str, str, int], tuple[int, Check]] = {}
    statuses: dict[tuple[str, str, int], set[Status]] = {}
    for k, result in enumerate(iterations, 1):
        for key, check in _keyed(result).items():
            statuses.setdefault(key, set()).add(check.status)
            if key not in chosen or _ORDER[check.status] <= _ORDER[chosen[key][1].status]:
                chosen[key] = (k, check)
    merged = []
    for key, (k, check) in chosen.items():
        if len(statuses[key]) > 1:
            check = check.model_copy(update={"detail": f"iteration {k}: {check.detail}".rstrip(": ")})
        merged.append(check)
    return merged


def _iterations(numbers: Iterable[int]) -> str:
    listed = list(numbers)
    return f"iteration{'s' if len(listed) > 1 else ''} {', '.join(map(str, listed))}"


def _intermittent(iterations: list[Result], judged: Judged) -> None:
    per_iteration = [_keyed(result) for result in iterations]
    keys = dict.fromkeys(key for keyed in per_iteration for key in keyed)
    for key in keys:
        name, scope, _ = key
        if family_of(name) in ("xid", DRIFT):  # XIDs are counted (_xids); drift is the history's
            continue
        found = [keyed.get(key) for keyed in per_iteration]
        bad = [k for k, c in enumerate(found, 1) if c is not None and c.status in _BAD]
        good = [k for k, c in enumerate(found, 1) if c is None or c.status is Status.PASS]
        if not bad or not good:
            continue
        worst = min((found[k - 1].status for k in bad), key=_ORDER.__getitem__)
        first = next(k for k in bad if found[k - 1].status is worst)
        shown = found[first - 1]
        absent = [k for k in good if found[k - 1] is None]
        passed = [k for k in good if found[k - 1] is not None]
        where = "; ".join(
            part
            for part in (
                f"PASS in {_iterations(passed)}" if passed else "",
                f"not reported in {_iterations(absent)}" if absent else "",
            )
            if part
        )
        judged.add(
            Check(
                name=in_family(SOAK, name),
                status=worst,
                value=shown.value,
                threshold=shown.threshold,
                unit=shown.unit,
                scope=scope,
                detail=f"{worst.value} first in iteration {first} ({where}): {shown.detail}",
            ),
            first if worst is Status.FAIL else None,
        )


def _drift(iterations: list[Result], tolerance_pct: float, judged: Judged) -> None:
    values: dict[tuple[str, str], list[float | None]] = {}
    units: dict[tuple[str, str], str] = {}
    for k, result in enumerate(iterations):
        for check in result.checks:
            metric = metrics.of_check(check.name)
            if check.value is None or metric is None or metric.direction == 0:
                continue
            if derived.of_check(check.name) is not None:  # peers compared, not a figure
                continue
            series = values.setdefault((check.name, check.scope), [None] * len(iterations))
            series[k] = check.value
            units[(check.name, check.scope)] = check.unit
    for (name, scope), series in values.items():
        sign = metrics.of_check(name).direction  # type: ignore[union-attr]
        start = next(k for k, v in enumerate(series) if v is not None)
        baseline = series[start]
        if not baseline:
            continue
        edge = baseline * (1 - sign * tolerance_pct / 100)
        worse = {
            k + 1: (v - baseline) / abs(baseline) * 100 * -sign
            for k, v in enumerate(series)
            if v is not None and k > start
        }
        over = [k for k, pct in worse.items() if pct > tolerance_pct]
        unit = units[(name, scope)]
        entry = Series("metric", name, scope, unit, series, baseline=baseline, edge=edge)
        judged.series.append(entry)
        if not worse:
            continue
        shown_at = max(worse, key=worse.__getitem__)
        said = f"{series[shown_at - 1]:.4g} {unit}".strip()
        base = f"iteration {start + 1}'s {baseline:.4g} {unit}".strip()
        direction = "below" if sign > 0 else "above"
        if over:
            entry.status, entry.first_bad = Status.FAIL, over[0]
            first_said = f"{series[over[0] - 1]:.4g} {unit}".strip()
            detail = (
                f"worse than {base} by more than {tolerance_pct:g}% first in iteration {over[0]} "
                f"({first_said}, {worse[over[0]]:.1f}% {direction}); worst {said} in iteration {shown_at}: "
                f"{_hint(name)}"
            )
        else:
            detail = (
                f"within {tolerance_pct:g}% of {base} over {len(series)} iterations (worst {said}, "
                f"{max(worse[shown_at], 0):.1f}% {direction}, in iteration {shown_at})"
            )
        judged.add(
            Check(
                name=in_family(SOAK, name),
                status=entry.status,
                value=series[shown_at - 1],
                threshold={"min" if sign > 0 else "max": edge, "baseline": baseline},
                unit=unit,
                scope=scope,
                detail=detail,
            ),
            entry.first_bad,
        )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _gpu_counters(result: Result) -> dict[tuple[Counter, str], float | None]:
    """(counter, 'gpu:NODE/INDEX') -> its reading in this iteration's inventory (None: not readable)."""
    found: dict[tuple[Counter, str], float | None] = {}
    for node in result.inventory.get("nodes") or []:
        if not isinstance(node, dict):
            continue
        for gpu in node.get("gpus") or []:
            if not isinstance(gpu, dict) or "index" not in gpu:
                continue
            scope = str(Scope.gpu(node.get("node"), gpu["index"]))
            for counter in COUNTERS:
                found[(counter, scope)] = _number(gpu.get(counter.field))
            links = [link for link in gpu.get("nvlinks") or [] if isinstance(link, dict)]
            for counter in NVLINK_COUNTERS:
                readings = [_number(link.get(counter.field)) for link in links]
                known = [r for r in readings if r is not None]
                found[(counter, scope)] = sum(known) if known else None
    return found


def _growth(series: list[float | None]) -> tuple[int | None, float, str]:
    """The first iteration (1-based) whose reading is above the one before it, the total growth, and that
    first step in words. A drop (a volatile counter reset by a driver reload) counts afresh from there."""
    first, total, before, step = None, 0.0, None, ""
    for k, value in enumerate(series, 1):
        if value is None:
            continue
        if before is not None and value > before:
            if first is None:
                first, step = k, f"{before:g} -> {value:g}"
            total += value - before
        before = value
    return first, total, step


def _counters(iterations: list[Result], judged: Judged) -> None:
    readings: dict[tuple[Counter, str], list[float | None]] = {}
    for k, result in enumerate(iterations):
        for key, value in _gpu_counters(result).items():
            readings.setdefault(key, [None] * len(iterations))[k] = value
    nodes: dict[str, list[str]] = {}
    for (counter, scope), series in readings.items():
        node = Scope.parse(scope).node
        if all(value is None for value in series):
            continue
        nodes.setdefault(node, [])
        first, total, step = _growth(series)
        entry = Series("counter", counter.name, scope, counter.unit, series)
        judged.series.append(entry)
        if first is None:
            continue
        entry.status, entry.first_bad = counter.grows, first
        nodes[node].append(f"{counter.name} on {scope}")
        known = [v for v in series if v is not None]
        # the check of the same name may have said what to do already (ecc.uncorrected_* flapped to FAIL)
        said = any((c.name, c.scope) == (in_family(SOAK, counter.name), scope) for c in judged.checks)
        judged.add(
            Check(
                name=in_family(SOAK, counter.name),
                status=counter.grows,
                value=total,
                threshold={"max": 0},
                unit=counter.unit,
                scope=scope,
                detail=f"grew by {total:g} first in iteration {first} ({step}; {known[0]:g} at the start, "
                f"{known[-1]:g} at the end)" + ("" if said else f": {counter.hint}"),
            ),
            first if counter.grows is Status.FAIL else None,
        )
    for node, grown in nodes.items():
        if not grown:
            judged.add(
                Check(
                    name=in_family(SOAK, "counters"),
                    status=Status.PASS,
                    scope=str(Scope.of_node(node)),
                    detail=f"no error counter grew over {len(iterations)} iterations (ECC, remapped rows, "
                    "retired pages, PCIe replays, NVLink errors)",
                ),
                None,
            )


def _xids(iterations: list[Result], judged: Judged) -> None:
    counts: dict[str, list[float]] = {}
    critical: dict[tuple[str, int], bool] = {}
    for k, result in enumerate(iterations):
        for check in result.checks:
            if not check.name.startswith("xid.") or check.status not in (Status.FAIL, Status.WARN):
                continue
            if check.value is None:  # a finding names its XID as the value
                continue
            times = _TIMES.search(check.detail)
            series = counts.setdefault(check.scope, [0.0] * len(iterations))
            series[k] += int(times.group(1)) if times else 1
            critical[(check.scope, k)] = critical.get((check.scope, k), False) or check.status is Status.FAIL
    for scope, series in counts.items():
        first, total, _ = _growth(list(series))
        entry = Series("counter", "xid.count", scope, "XIDs", list(series))
        judged.series.append(entry)
        if first is None:
            continue
        status = Status.FAIL if critical.get((scope, first - 1)) else Status.WARN
        entry.status, entry.first_bad = status, first
        judged.add(
            Check(
                name=in_family(SOAK, "xid.count"),
                status=status,
                value=total,
                threshold={"max": 0},
                unit="XIDs",
                scope=scope,
                detail=f"{total:g} new XID report(s), first in iteration {first}: see that iteration's "
                "xid checks in iterations.jsonl for which XID and what to do",
            ),
            first if status is Status.FAIL else None,
        )


def judge(iterations: list[Result], tolerance_pct: float) -> Judged:
    """The soak checks and every judged series of these iterations (nothing to judge with fewer than two)."""
    judged = Judged()
    if len(iterations) < 2:
        return judged
    _intermittent(iterations, judged)
    _drift(iterations, tolerance_pct, judged)
    _counters(iterations, judged)
    _xids(iterations, judged)
    return judged


def series_json(series: list[Series]) -> list[dict[str, Any]]:
    return [
        {
            "kind": s.kind,
            "name": s.name,
            "scope": s.scope,
            "unit": s.unit,
            "values": s.values,
            "status": s.status.value,
            "first_bad": s.first_bad,
            "baseline": s.baseline,
            "edge": s.edge,
        }
        for s in series
    ]

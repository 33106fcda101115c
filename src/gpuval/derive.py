"""Profile bounds derived from clean runs of healthy nodes (`gpuval profiles derive`).

The rule (docs/thresholds.md), per check and per group of values. A per-GPU metric (matmul, membw, train)
pools every GPU of every run into one group, whatever the runs' GPU counts; a measurement whose figure
depends on how many GPUs take part (metrics.MeasurementDecl.by_gpu_count: collectives, P2P) makes one
group per GPU count, written to the check's `by_gpus`.

1. Outliers are left out, each named: values far on the bad side of the group's median (modified z-score
   past 3.5 and at least 20 % from it: gpuval.robust); fewer than 4 values are not judged. A run none of
   whose values in a group is kept does not count towards that group's runs.
2. With sd the sample standard deviation (n - 1) of the values kept:
       higher is better:  floor   = min - max(k * sd, margin * min), rounded down to 3 significant digits
       lower is better:   ceiling = max + max(k * sd, margin * max), rounded up
   so a floor is never above the worst clean value, nor a ceiling below it. The relative margin (3 % unless
   set) keeps a bound off values that agree more closely than machines do: three runs in one call spread
   0.1 % (4-GPU alltoall), one collective on two lent machines differed by up to 2.5 % (2-GPU all_gather).
3. A bound that would let a GPU at half speed pass is refused: a floor at or below half the median (any
   floor <= 0), a ceiling at or above twice it (a gap in %, outliers.*: at or above 50 %). The base's bound
   stays, and the output says so; in strict mode (the manifest) only a hand-set one.

A group needs values from `min_runs` runs (files); with fewer, a bound whose source starts 'hand-set'
stays, anything else is a usage error naming the check. Every bound derived names in its `source` the runs
and nodes it came from, their spread and how many values were left out (config.evidence reads it back for
a verdict). Runs are read and vetted by gpuval.derive_runs: a FAIL against a floor is no reason to refuse one.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuval import metrics, robust
from gpuval.checkref import CheckRef
from gpuval.config import (
    DERIVED,
    HAND_SET,
    CountBound,
    Profile,
    Threshold,
    hand_set,
    resolve_profile_path,
    validate_model,
)
from gpuval.derive_runs import Run, Value, values_by_group
from gpuval.errors import UsageError

DEFAULT_K = 3.0
DEFAULT_MIN_RUNS = 3
DEFAULT_MARGIN = 0.03  # the least distance between a bound and the worst clean value, as a fraction of it
HALF_SPEED_GAP_PCT = 50.0  # what a gap to the peers' median (outliers.*_pct) reads for a GPU at half speed
_WIDTH = 110  # the longest line a profile gets


@dataclass(frozen=True)
class Rule:
    k: float = DEFAULT_K  # how many standard deviations below the worst clean value a floor sits
    min_runs: int = DEFAULT_MIN_RUNS  # runs (files) a group needs before a bound is derived from it
    margin: float = DEFAULT_MARGIN  # the least gap between bound and worst value, relative to the value
    z_limit: float = robust.Z_LIMIT  # modified z-score past which a value on the bad side is an outlier
    least_gap: float = robust.LEAST_GAP  # and its least distance from the median, relative to the median
    least_values: int = robust.LEAST_VALUES  # a group of fewer values is not judged for outliers

    def __post_init__(self) -> None:
        # an infinite k turns a spread of 0 into NaN (inf x 0) and any other into a floor of 0 (--k, manifest)
        if not (math.isfinite(self.k) and self.k >= 0):
            raise UsageError(f"--k {self.k}: give a finite number of standard deviations, 0 or more (e.g. 3)")
        if not (math.isfinite(self.margin) and 0 <= self.margin < 1):
            raise UsageError(
                f"--margin {self.margin}: give a fraction of the worst value, 0 to 0.99 (e.g. 0.03)"
            )


def round_loose(value: float, down: bool) -> float:
    """`value` to 3 significant digits, rounded towards the looser bound (down for a floor); a bound past
    the largest float (a huge k) stays infinite, for _bound to refuse."""
    if value <= 0:
        return 0.0
    if math.isinf(value):
        return value
    step = 10.0 ** (math.floor(math.log10(value)) - 2)
    steps = math.floor(value / step + 1e-9) if down else math.ceil(value / step - 1e-9)
    return float(f"{steps * step:.10g}")


def derive_bound(
    values: list[float], direction: int, k: float, margin: float = DEFAULT_MARGIN
) -> tuple[float, float, float]:
    """(bound, worst value, sd): the rule for one group, as the module says."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    if direction > 0:
        worst = min(values)
        gap = max(k * sd, margin * abs(worst))
        return min(worst, round_loose(max(0.0, worst - gap), down=True)), worst, sd
    worst = max(values)
    gap = max(k * sd, margin * abs(worst))
    return max(worst, round_loose(worst + gap, down=False)), worst, sd


def half_speed_limit(median: float, direction: int, gap_pct: bool = False) -> float | None:
    """The loosest bound that still fails a GPU at half speed (a check fails below a floor, above a
    ceiling): half the median for a floor, twice it for a ceiling, 50 for a gap in % to the peers' median
    (outliers.*_pct); None where there is none. A bound at the limit or looser is refused."""
    if direction > 0:
        return median / 2
    if gap_pct:
        return HALF_SPEED_GAP_PCT
    return 2 * median if median > 0 else None


@dataclass(frozen=True)
class Group:
    """One group's values, judged for outliers: the values kept and how many were left out."""

    kept: list[Value]
    left_out: int
    judged: bool  # False: too few values to judge any

    @property
    def labels(self) -> list[str]:
        return list(dict.fromkeys(value.run.label for value in self.kept))


def _judge(
    name: str, where: str, found: list[Value], direction: int, rule: Rule, unit: str, notes: list[str]
) -> Group:
    """The group with its outliers left out, each named in `notes` (and a group too small to judge)."""
    values = [v.value for v in found]
    judged = robust.judge(values, direction, rule.z_limit, rule.least_gap, rule.least_values)
    if found and not judged.judged:
        notes.append(
            f"{name}{where}: {len(found)} value(s), fewer than {rule.least_values}: no outlier judged"
        )
    for outlier in judged.outliers:
        value = found[outlier.index]
        notes.append(
            f"left out: {name}{where}: {value.run.label} {value.scope} {value.value:.4g}{unit}, median "
            f"{judged.median:.4g}{unit}: {outlier.why(rule.z_limit)}"
        )
    out = {outlier.index for outlier in judged.outliers}
    return Group([v for index, v in enumerate(found) if index not in out], len(out), judged.judged)


def _where(count: int | None) -> str:
    return f" on {count} GPUs" if count is not None else ""


def _edge(direction: int, rule: Rule, worst: float, sd: float) -> str:
    gap = (
        f"{rule.k:g} x sd {sd:.3g}"
        if rule.k * sd >= rule.margin * abs(worst)
        else f"{rule.margin:.0%} of it (> {rule.k:g} x sd {sd:.3g})"
    )
    return f"min {worst:.5g} - {gap}" if direction > 0 else f"max {worst:.5g} + {gap}"


def _spread(values: list[float], sd: float) -> str:
    """sd / median in %, as a source and a refusal say it."""
    median = statistics.median(values)
    return f"{100 * sd / abs(median):.2g} %" if median else "n/a (median 0)"


def _source(group: Group, direction: int, rule: Rule, worst: float, sd: float) -> str:
    labels = group.labels
    nodes = len({node for v in group.kept for node in v.run.nodes or (f"run {v.run.label}",)})
    if group.left_out:
        left = f"{group.left_out} left out"
    else:
        left = "none left out" if group.judged else "too few to judge outliers"
    spread = _spread([v.value for v in group.kept], sd)
    return (
        f"{DERIVED} from {len(labels)} runs on {nodes} node{'' if nodes == 1 else 's'}, {len(group.kept)} "
        f"values (spread {spread}, {left}): {_edge(direction, rule, worst, sd)}; {', '.join(labels)}"
    )


def _keepable(source: str | None, strict: bool) -> bool:
    """Whether a bound of the base stays where no run measured its group: a hand-set one always; a derived
    one only outside strict mode (the manifest's: there every derived bound must follow from its runs)."""
    return hand_set(source) or (not strict and bool(source))


def _bound(
    name: str, where: str, group: Group, direction: int, rule: Rule, gap_pct: bool
) -> tuple[CountBound | None, str]:
    """(the group's bound, '') or, where the bound would let a GPU at half speed pass, (None, why)."""
    values = [v.value for v in group.kept]
    value, worst, sd = derive_bound(values, direction, rule.k, rule.margin)
    limit = half_speed_limit(statistics.median(values), direction, gap_pct)
    loose = limit is not None and (value <= limit if direction > 0 else value >= limit)
    if loose or (direction > 0 and value <= 0) or math.isinf(value):
        gap = max(rule.k * sd, rule.margin * abs(worst))
        side, raw = ("floor", worst - gap) if direction > 0 else ("ceiling", worst + gap)
        if math.isinf(value):  # a ceiling where the median gives no limit (0), k x sd past the floats
            edge = "past any number a profile holds"
        elif direction > 0:
            edge = f"at or below half the median ({limit:.4g})"
        else:
            edge = f"at or above {limit:g} %" if gap_pct else f"at or above twice the median ({limit:.4g})"
        return None, (
            f"{name}{where}: spread {_spread(values, sd)} (sd/median), the rule gives a {side} of {raw:.3g} "
            f"({_edge(direction, rule, worst, sd)}), {edge}: a GPU at half speed would pass"
        )
    side = {"min": _number(value)} if direction > 0 else {"max": _number(value)}
    return CountBound(**side, source=_source(group, direction, rule, worst, sd)), ""


def _shown(bound: CountBound | Threshold) -> str:
    sides = {"min": bound.min, "max": bound.max}
    return " and ".join(f"{side} {value:g}" for side, value in sides.items() if value is not None)


def _refused(why: str, strict: bool) -> UsageError:
    if not strict:  # a check the base bounds neither way
        return UsageError(f"{why}; the base has no bound of it to keep: set one in the base profile")
    return UsageError(
        f"{why}; in the manifest every bound follows from its runs: leave the runs that spread it out, or "
        f"keep a bound set by hand with source: '{HAND_SET}: why'"
    )


def _too_few(name: str, where: str, group: Group | None, rule: Rule) -> UsageError:
    labels = group.labels if group else []
    listed = f" ({', '.join(labels)})" if labels else ""
    left = f" once {group.left_out} outlier value(s) were left out" if group and group.left_out else ""
    return UsageError(
        f"{name}{where}: {len(labels)} clean run(s) measured it{listed}{left}, the rule needs "
        f"{rule.min_runs}: add runs, or keep a bound set by hand with source: '{HAND_SET}: why'"
    )


def derive_check(
    name: str,
    threshold: Threshold,
    runs: list[Run],
    rule: Rule,
    strict: bool = False,
    notes: list[str] | None = None,
) -> Threshold:
    """The check's threshold derived from `runs`, over the base's `threshold` (its size, level, and the
    bounds it keeps where runs are too few or too spread). What was left out or refused goes to `notes`,
    one line each."""
    notes = [] if notes is None else notes
    ref = CheckRef.parse(name, threshold.bytes)
    direction = metrics.direction(ref.measurement, ref.metric)
    kept = {"bytes": threshold.bytes, "level": threshold.level}
    if direction == 0:
        if hand_set(threshold.source):
            return threshold
        raise UsageError(f"{name}: neither higher nor lower is better: not derivable; set it by hand")
    unit = metrics.unit(ref.measurement, ref.metric)
    gap_pct = direction < 0 and unit == "%"  # a gap to the peers' median, 0 at best: outliers.*_pct
    shown_unit = f" {unit}" if unit and unit != "%" else unit
    groups = {
        count: _judge(name, _where(count), found, direction, rule, shown_unit, notes)
        for count, found in values_by_group(name, threshold, runs).items()
    }
    if not metrics.by_gpu_count(ref.measurement):
        group = groups.get(None)
        if group and len(group.labels) >= rule.min_runs:
            bound, why = _bound(name, "", group, direction, rule, gap_pct)
            if bound is not None:
                return Threshold(min=bound.min, max=bound.max, source=bound.source, **kept)
            if threshold.flat and (not strict or hand_set(threshold.source)):
                notes.append(f"refused: {why}; the base's bound stays ({_shown(threshold)})")
                return threshold
            raise _refused(why, strict)
        if threshold.flat and (
            hand_set(threshold.source) or (not group and _keepable(threshold.source, strict))
        ):
            return threshold
        raise _too_few(name, "", group, rule)
    base = dict(threshold.by_gpus or {})
    flat = (
        CountBound(min=threshold.min, max=threshold.max, source=threshold.source) if threshold.flat else None
    )
    entries: dict[int, CountBound] = {}
    for count in sorted({c for c in groups if c is not None} | set(base)):
        group, old, where = groups.get(count), base.get(count), _where(count)
        if group and len(group.labels) >= rule.min_runs:
            bound, why = _bound(name, where, group, direction, rule, gap_pct)
            stays = old if old is not None else flat
            if bound is not None:
                entries[count] = bound
            elif stays is not None and (not strict or hand_set(stays.source)):
                entries[count] = stays
                notes.append(f"refused: {why}; the base's bound stays ({_shown(stays)})")
            elif stays is None and not strict:
                notes.append(f"refused: {why}; the base has no bound for {count} GPUs: none written")
            else:
                raise _refused(why, strict)
        elif old is not None and (hand_set(old.source) or (not group and _keepable(old.source, strict))):
            entries[count] = old
        elif group or old is not None:
            raise _too_few(name, where, group, rule)
    if any(entry is not flat for entry in entries.values()):  # one count's figure says nothing of another's
        return Threshold(by_gpus=entries, **kept)
    if threshold.flat and (entries or _keepable(threshold.source, strict)):  # refused at every count
        return threshold
    raise _too_few(name, " at any GPU count", None, rule)


def derive_checks(
    base: Profile, runs: list[Run], rule: Rule, strict: bool = False, notes: list[str] | None = None
) -> dict[str, Threshold]:
    """Every check of the base profile, derived from the runs (in the base's order)."""
    return {
        name: derive_check(name, threshold, runs, rule, strict, notes)
        for name, threshold in base.checks.items()
    }


# --- writing the profile -------------------------------------------------------------------------------


# Below it every whole float is an int exactly: written as one; past it as a float (1.0e+20), so that no
# bound becomes an integer of more digits than the profile loader takes (gpuval.inputs.MAX_INT)
_EXACT_INTEGERS = 2**53


def _number(value: float) -> float | int:
    return int(value) if abs(value) < _EXACT_INTEGERS and value == int(value) else value


def _yaml_float(value: float) -> str:
    """A float as YAML 1.1 reads a float: 1.0e+20 and 5.0e-05, as yaml.safe_dump writes them, where Python
    writes 1e+20 and 5e-05, which PyYAML reads as text (its floats need a '.')."""
    text = repr(value)
    return text.replace("e", ".0e", 1) if "e" in text and "." not in text else text


def _size(count: int) -> str | int:
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= factor and count % factor == 0:
            return f"{count // factor}{unit}"
    return count


def _scalar(key: str, value: Any, indent: int) -> list[str]:
    """`key: value` as YAML lines; a long text folded (`>-`) at spaces so that it reads back the same."""
    pad = " " * indent
    if not isinstance(value, str):
        return [f"{pad}{key}: {_yaml_float(value) if isinstance(value, float) else value}"]
    line = f"{pad}{key}: {json.dumps(value, ensure_ascii=False)}"
    if len(line) <= _WIDTH or "  " in value or value != value.strip():
        return [line]
    wrapped = textwrap.wrap(value, _WIDTH - indent - 2, break_long_words=False, break_on_hyphens=False)
    return [f"{pad}{key}: >-", *(f"{pad}  {part}" for part in wrapped)]


def _bound_lines(bound: CountBound | Threshold, indent: int) -> list[str]:
    return [
        line
        for side in ("min", "max")
        if getattr(bound, side) is not None
        for line in _scalar(side, _number(getattr(bound, side)), indent)
    ]


def _check_lines(name: str, threshold: Threshold) -> list[str]:
    lines = [f"  {name}:"]
    if threshold.bytes is not None:
        lines += _scalar("bytes", _size(threshold.bytes), 4)
    lines += _bound_lines(threshold, 4)
    if threshold.level != "fail":
        lines += _scalar("level", threshold.level, 4)
    if threshold.by_gpus:
        lines.append("    by_gpus:")
        for count, bound in sorted(threshold.by_gpus.items()):
            lines += [f"      {count}:", *_bound_lines(bound, 8)]
            lines += _scalar("source", bound.source, 8) if bound.source else []
    if threshold.source:
        lines += _scalar("source", threshold.source, 4)
    return lines


def checks_yaml(checks: dict[str, Threshold]) -> str:
    """The `checks:` section of a profile, block style, each bound's source as data."""
    text = (
        "\n".join(["checks:", *(line for name, t in checks.items() for line in _check_lines(name, t))]) + "\n"
    )
    read = validate_model(Profile, {"name": "x", **yaml.safe_load(text)}, "the derived checks")
    if read.checks != checks:  # never write what would read back as other bounds
        raise AssertionError(f"the derived checks do not read back as derived:\n{text}")
    return text


def render(base_text: str, checks: dict[str, Threshold]) -> str:
    """The base profile's text with its top-level `checks:` section replaced (its comments elsewhere kept)."""
    lines = base_text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if re.match(r"checks:\s*(#.*)?$", line)), None)
    if start is None:
        return base_text.rstrip("\n") + "\n" + checks_yaml(checks)
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"[A-Za-z_]", lines[i])), len(lines))
    return "".join(lines[:start]) + checks_yaml(checks) + "".join(lines[end:])


def derive_profile(
    base_path: Path, runs: list[Run], rule: Rule, strict: bool = False, notes: list[str] | None = None
) -> tuple[str, Profile, Profile]:
    """(the derived profile's text, the base, the derived profile as it loads); what was left out or
    refused goes to `notes`, one line each."""
    from gpuval.config import read_yaml

    base = validate_model(Profile, read_yaml(base_path), f"profile '{base_path}'")
    if not runs:
        raise UsageError("no runs given: pass the result.json files of clean runs")
    checks = derive_checks(base, runs, rule, strict, notes)
    text = render(base_path.read_text(encoding="utf-8"), checks)
    derived = validate_model(Profile, yaml.safe_load(text), f"the profile derived from '{base_path}'")
    return text, base, derived


def base_for(runs: list[Run], base: str | None) -> Path:
    """The base profile's file: --base; else the profile the runs were judged by, where they name one (a
    bench document names none); else the built-in profile matching the runs' GPUs (as accept picks it)."""
    from gpuval.config import pick_profile

    if base is not None:
        return resolve_profile_path(base)
    named = Counter(run.profile for run in runs if run.profile)
    if len(named) > 1:
        listed = ", ".join(f"{name} ({count} runs)" for name, count in named.items())
        raise UsageError(f"the runs were judged by different profiles: {listed}; pass --base PROFILE")
    if named:
        (name,) = named
        try:
            return resolve_profile_path(name)
        except UsageError:
            raise UsageError(
                f"the runs were judged by profile '{name}', which is no built-in profile: pass --base FILE"
            ) from None
    names = sorted({name for run in runs for name in run.gpu_names})
    if not names:
        raise UsageError("the runs name no GPU: pass --base PROFILE")
    return resolve_profile_path(pick_profile(names))


# --- the manifest: which committed runs each shipped profile comes from ----------------------------------

"""Profile bounds derived from clean runs of healthy nodes (`gpuval profiles derive`).

The rule (docs/thresholds.md), per check and per group of values. A per-GPU metric (matmul, membw, train)
pools every GPU of every run into one group, whatever the runs' GPU counts; a measurement whose figure
depends on how many GPUs take part (metrics.MeasurementDecl.by_gpu_count: collectives, P2P) makes one
group per GPU count, written to the check's `by_gpus`. With sd the sample standard deviation (n - 1) of
the group's values:

    higher is better:  floor   = min(values) - max(k * sd, margin * min(values)), rounded down to 3
                       significant digits
    lower is better:   ceiling = max(values) + max(k * sd, margin * max(values)), rounded up

so a floor is never above the worst clean value, nor a ceiling below it. The relative margin (3 % unless
set) keeps a bound from sitting on the values when the runs agree more closely than machines do: three
runs in one call spread 0.1 % (4-GPU alltoall), while one collective on two lent machines differed by up
to 2.5 % (2-GPU all_gather). A group needs values from `min_runs` runs (files); with fewer, a bound whose
source starts 'hand-set' stays, anything else is a usage error naming the check. Every bound derived
names the runs it came from in its `source`.

Runs are result.json files (gpuval.result/v1) and `gpuval bench --output` documents (gpuval.bench/v1).
A run whose verdict is ERROR, whose health FAILed (any FAIL of a check that is not a threshold on a
declared metric: a health family, a wrong collective result) or whose benchmark did not run is refused:
it is no evidence of a healthy node. A FAIL against a profile's floor is not a reason: the values count.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import statistics
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuval import metrics
from gpuval.checkref import CheckRef
from gpuval.checks import gpu_count
from gpuval.config import HAND_SET, CountBound, Profile, Threshold, resolve_profile_path, validate_model
from gpuval.errors import UsageError
from gpuval.results import BENCH_SCHEMA_ID, SCHEMA_ID, BenchDocument, Measurement, Result, Status
from gpuval.scope import is_pair

DEFAULT_K = 3.0
DEFAULT_MIN_RUNS = 3
DEFAULT_MARGIN = 0.03  # the least distance between a bound and the worst clean value, as a fraction of it
_WIDTH = 110  # the longest line a profile gets
_DERIVED = "derived"


@dataclass(frozen=True)
class Rule:
    k: float = DEFAULT_K  # how many standard deviations below the worst clean value a floor sits
    min_runs: int = DEFAULT_MIN_RUNS  # runs (files) a group needs before a bound is derived from it
    margin: float = DEFAULT_MARGIN  # the least gap between bound and worst value, relative to the value


@dataclass(frozen=True)
class Run:
    """One clean run: where it came from, its GPUs per node and its measurements."""

    label: str  # how a bound's source names it
    gpus_per_node: int
    gpu_names: tuple[str, ...]
    measurements: tuple[Measurement, ...]
    skip: frozenset[str] = field(default_factory=frozenset)  # checks (globs) not taken from it (manifest)


def load_run(path: Path, label: str | None = None, skip: frozenset[str] = frozenset()) -> Run:
    """A run read and vetted; anything that is no evidence of a healthy node is a one-line UsageError."""
    from gpuval.inputs import load_json

    shown = label or str(path)
    data = load_json(path, "result file")
    schema = data.get("schema") if isinstance(data, dict) else None
    try:
        if schema == SCHEMA_ID:
            result = Result.model_validate(data)
            if result.verdict is Status.ERROR:
                raise UsageError(f"{shown}: its verdict is ERROR: a run that did not complete is no evidence")
            failed = [
                c for c in result.checks if c.status is Status.FAIL and metrics.of_check(c.name) is None
            ]
            if failed:
                raise UsageError(
                    f"{shown}: {failed[0].name} FAILed on {failed[0].scope}: not a healthy node's run; "
                    "leave it out"
                )
            world, nodes, measurements = result.world, result.inventory.get("nodes", []), result.measurements
        elif schema == BENCH_SCHEMA_ID:
            document = BenchDocument.model_validate(data)
            if document.status != "OK":
                raise UsageError(f"{shown}: its benchmark did not run ({document.status}: {document.detail})")
            world, nodes, measurements = document.world, document.inventory.nodes, document.measurements
        else:
            raise UsageError(
                f"{shown}: not a gpuval result.json or bench document (schema: {schema!r}); pass what "
                "gpuval accept or gpuval bench --output wrote"
            )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "the document"
        raise UsageError(f"{shown}: not a valid gpuval document ({where}: {first.get('msg')})") from None
    if not measurements:
        raise UsageError(f"{shown}: it holds no measurement to derive from")
    names = tuple(str(gpu.get("name")) for node in nodes for gpu in node.get("gpus") or [] if gpu.get("name"))
    return Run(shown, max(1, world.size // max(1, world.nodes)), names, tuple(measurements), skip)


def _values(name: str, threshold: Threshold, runs: list[Run]) -> dict[int | None, list[tuple[float, Run]]]:
    """The check's clean values by group: GPU count where the measurement is bounded per count, else None."""
    ref = CheckRef.parse(name, threshold.bytes)
    per_count = metrics.by_gpu_count(ref.measurement)
    groups: dict[int | None, list[tuple[float, Run]]] = {}
    for run in runs:
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in run.skip):
            continue
        for m in run.measurements:
            if not ref.selects(m) or is_pair(m.scope):  # a pair of nodes is not the whole measured
                continue
            value = m.metrics.get(ref.metric)
            if value is None or not math.isfinite(value):
                continue
            groups.setdefault(gpu_count(m, run.gpus_per_node) if per_count else None, []).append((value, run))
    return groups


def round_loose(value: float, down: bool) -> float:
    """`value` to 3 significant digits, rounded towards the looser bound (down for a floor)."""
    if value <= 0:
        return 0.0
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


def _labels(found: list[tuple[float, Run]]) -> list[str]:
    return list(dict.fromkeys(run.label for _, run in found))


def _source(found: list[tuple[float, Run]], direction: int, rule: Rule, worst: float, sd: float) -> str:
    labels = _labels(found)
    gap = (
        f"{rule.k:g} x sd {sd:.3g}"
        if rule.k * sd >= rule.margin * abs(worst)
        else f"{rule.margin:.0%} of it (> {rule.k:g} x sd {sd:.3g})"
    )
    edge = f"min {worst:.5g} - {gap}" if direction > 0 else f"max {worst:.5g} + {gap}"
    return f"{_DERIVED} from {len(labels)} runs, {len(found)} values: {edge}; {', '.join(labels)}"


def _hand_set(source: str | None) -> bool:
    return bool(source) and str(source).startswith(HAND_SET)


def _keepable(source: str | None, strict: bool) -> bool:
    """Whether a bound of the base stays where no run measured its group: a hand-set one always; a derived
    one only outside strict mode (the manifest's: there every derived bound must follow from its runs)."""
    return _hand_set(source) or (not strict and bool(source))


def _bound(found: list[tuple[float, Run]], direction: int, rule: Rule) -> CountBound:
    value, worst, sd = derive_bound([v for v, _ in found], direction, rule.k, rule.margin)
    number = int(value) if value == int(value) else value
    side = {"min": number} if direction > 0 else {"max": number}
    return CountBound(**side, source=_source(found, direction, rule, worst, sd))


def _too_few(name: str, where: str, found: list[tuple[float, Run]], rule: Rule) -> UsageError:
    labels = _labels(found)
    listed = f" ({', '.join(labels)})" if labels else ""
    return UsageError(
        f"{name}{where}: {len(labels)} clean run(s) measured it{listed}, the rule needs {rule.min_runs}: add "
        f"runs, or keep a bound set by hand with source: '{HAND_SET}: why'"
    )


def derive_check(
    name: str, threshold: Threshold, runs: list[Run], rule: Rule, strict: bool = False
) -> Threshold:
    """The check's threshold derived from `runs`, over the base's `threshold` (its size, level, and the
    bounds it keeps where runs are too few)."""
    ref = CheckRef.parse(name, threshold.bytes)
    direction = metrics.direction(ref.measurement, ref.metric)
    groups = _values(name, threshold, runs)
    kept = {"bytes": threshold.bytes, "level": threshold.level}
    if direction == 0:
        if _hand_set(threshold.source):
            return threshold
        raise UsageError(f"{name}: neither higher nor lower is better: not derivable; set it by hand")
    if not metrics.by_gpu_count(ref.measurement):
        found = groups.get(None, [])
        if len(_labels(found)) >= rule.min_runs:
            bound = _bound(found, direction, rule)
            return Threshold(min=bound.min, max=bound.max, source=bound.source, **kept)
        if threshold.flat and (
            _hand_set(threshold.source) or (not found and _keepable(threshold.source, strict))
        ):
            return threshold
        raise _too_few(name, "", found, rule)
    base = {count: bound for count, bound in (threshold.by_gpus or {}).items()}
    entries: dict[int, CountBound] = {}
    for count in sorted({c for c in groups if c is not None} | set(base)):
        found = groups.get(count, [])
        old = base.get(count)
        if len(_labels(found)) >= rule.min_runs:
            entries[count] = _bound(found, direction, rule)
        elif old is not None and (_hand_set(old.source) or (not found and _keepable(old.source, strict))):
            entries[count] = old
        elif found or old is not None:
            raise _too_few(name, f" on {count} GPUs", found, rule)
    if entries:  # the flat bound gives way: one count's figure says nothing about another's
        return Threshold(by_gpus=entries, **kept)
    if threshold.flat and _keepable(threshold.source, strict):
        return threshold
    raise _too_few(name, " at any GPU count", [], rule)


def derive_checks(base: Profile, runs: list[Run], rule: Rule, strict: bool = False) -> dict[str, Threshold]:
    """Every check of the base profile, derived from the runs (in the base's order)."""
    return {
        name: derive_check(name, threshold, runs, rule, strict) for name, threshold in base.checks.items()
    }


# --- writing the profile -------------------------------------------------------------------------------


def _number(value: float) -> float | int:
    return int(value) if value == int(value) else value


def _size(count: int) -> str | int:
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= factor and count % factor == 0:
            return f"{count // factor}{unit}"
    return count


def _scalar(key: str, value: Any, indent: int) -> list[str]:
    """`key: value` as YAML lines; a long text folded (`>-`) at spaces so that it reads back the same."""
    pad = " " * indent
    if not isinstance(value, str):
        return [f"{pad}{key}: {value}"]
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
    base_path: Path, runs: list[Run], rule: Rule, strict: bool = False
) -> tuple[str, Profile, Profile]:
    """(the derived profile's text, the base, the derived profile as it loads)."""
    from gpuval.config import read_yaml

    base = validate_model(Profile, read_yaml(base_path), f"profile '{base_path}'")
    if not runs:
        raise UsageError("no runs given: pass the result.json files of clean runs")
    checks = derive_checks(base, runs, rule, strict)
    text = render(base_path.read_text(encoding="utf-8"), checks)
    derived = validate_model(Profile, yaml.safe_load(text), f"the profile derived from '{base_path}'")
    return text, base, derived


def base_for(runs: list[Run], base: str | None) -> Path:
    """The base profile's file: --base, else the built-in profile matching the runs' GPUs (as accept
    picks it)."""
    from gpuval.config import pick_profile

    if base is not None:
        return resolve_profile_path(base)
    names = sorted({name for run in runs for name in run.gpu_names})
    if not names:
        raise UsageError("the runs name no GPU: pass --base PROFILE")
    return resolve_profile_path(pick_profile(names))


# --- the manifest: which committed runs each shipped profile comes from ----------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ManifestRun(_Strict):
    path: str
    skip: list[str] = Field(default_factory=list, description="checks not taken from this run (globs)")
    why: str = Field("", description="why those checks are skipped")


class ManifestProfile(_Strict):
    profile: str = Field(description="the profile file: the base, and where the derived profile is written")
    keep: list[str] = Field(
        default_factory=list,
        description="checks (globs) not derived from any run: their hand-set bounds stay",
    )
    runs: list[str | ManifestRun]


class Manifest(_Strict):
    root: str = Field(".", description="the folder profile paths are relative to, from the manifest's folder")
    results: str = Field("benchmarks/results", description="the folder run paths are relative to, from root")
    k: float = Field(DEFAULT_K, ge=0)
    min_runs: int = Field(DEFAULT_MIN_RUNS, ge=2)
    margin: float = Field(DEFAULT_MARGIN, ge=0, lt=1)
    profiles: dict[str, ManifestProfile]


@dataclass(frozen=True)
class Derived:
    name: str
    path: Path
    text: str
    base: Profile
    profile: Profile


def from_manifest(manifest_path: Path, only: list[str] | None = None) -> list[Derived]:
    """Every profile the manifest lists (or those in `only`), derived in strict mode; nothing written."""
    from gpuval.config import read_yaml

    manifest = validate_model(Manifest, read_yaml(manifest_path, "manifest"), f"manifest '{manifest_path}'")
    root = (manifest_path.parent / manifest.root).resolve()
    rule = Rule(k=manifest.k, min_runs=manifest.min_runs, margin=manifest.margin)
    unknown = [name for name in only or [] if name not in manifest.profiles]
    if unknown:
        raise UsageError(
            f"manifest '{manifest_path}' lists no profile '{unknown[0]}': {', '.join(manifest.profiles)}"
        )
    derived = []
    for name, entry in manifest.profiles.items():
        if only and name not in only:
            continue
        runs = []
        for item in entry.runs:
            run = item if isinstance(item, ManifestRun) else ManifestRun(path=item)
            skip = frozenset([*run.skip, *entry.keep])
            runs.append(load_run(root / manifest.results / run.path, label=run.path, skip=skip))
        path = root / entry.profile
        text, base, profile = derive_profile(path, runs, rule, strict=True)
        derived.append(Derived(name, path, text, base, profile))
    return derived


def drifted(derived: Derived) -> list[str]:
    """The checks whose bounds in the profile file differ from what its runs give now."""
    shipped, now = derived.base.checks, derived.profile.checks
    return [name for name in dict.fromkeys([*shipped, *now]) if shipped.get(name) != now.get(name)]

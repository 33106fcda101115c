"""Profiles: thresholds per hardware, as YAML parsed into strict models.

Unknown keys are errors that name the key (with a suggestion); `--set key.path=value` overrides any
field before validation, so a wrong type is reported like a wrong YAML value.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from gpuval.checkref import CheckRef
from gpuval.errors import UsageError
from gpuval.units import parse_bytes

ByteSize = Annotated[int, BeforeValidator(parse_bytes)]
# What gpuval sends, allocates or selects: at least one byte (a size sweep from 0 never grows, and a
# buffer of none times nothing)
PositiveByteSize = Annotated[ByteSize, Field(gt=0)]


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, not true or false")
    return value


# A float option: text that reads as a number is taken (YAML 1.1 leaves '1e-3', an exponent without a dot,
# as text), a boolean is not (pydantic's lax float reads true as 1.0)
Number = Annotated[float, BeforeValidator(_not_bool)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# A bound's source starting with this was set by a person, not derived from runs (docs/thresholds.md):
# `gpuval profiles derive` keeps such a bound where its runs are too few to derive one.
HAND_SET = "hand-set"
DERIVED = "derived"  # how a source written by gpuval profiles derive starts


_SOURCE = re.compile(
    rf"{DERIVED} from (?P<runs>\d+) runs? on (?P<nodes>\d+) nodes?, \d+ values "
    r"\(spread (?P<spread>[^,]+), (?P<left>[^)]+)\)"
)


def hand_set(source: str | None) -> bool:
    """Whether a bound's source says a person set it."""
    return bool(source) and str(source).startswith(HAND_SET)


def evidence(source: str | None) -> str | None:
    """What stands behind a bound, in a few words, from its `source` (as gpuval.derive writes it): '5 runs
    on 4 nodes, spread 1.4 %' (', 1 left out' where derive left values out), 'hand-set' for a bound set by
    hand, a source in another form as it is; None without a source."""
    if not source:
        return None
    if hand_set(source):
        return HAND_SET
    match = _SOURCE.match(source)
    if match is None:
        return " ".join(source.split())
    nodes = int(match["nodes"])
    said = f"{match['runs']} runs on {nodes} node{'' if nodes == 1 else 's'}, spread {match['spread']}"
    return said + (f", {match['left']}" if match["left"][0].isdigit() else "")


def _ordered(low: float | None, high: float | None) -> None:
    if low is not None and high is not None and low > high:
        raise ValueError(f"min {low:g} is above max {high:g}: swap them")


class CountBound(_Strict):
    """The bound of a check at one GPU count (`by_gpus`)."""

    min: float | None = None
    max: float | None = None
    source: str | None = Field(
        None, description="the runs it was derived from, or 'hand-set: why' (gpuval profiles derive)"
    )

    @model_validator(mode="after")
    def _bounded(self) -> CountBound:
        if self.min is None and self.max is None:
            raise ValueError("a GPU count's bound needs min or max")
        _ordered(self.min, self.max)
        return self


class Threshold(_Strict):
    """Bounds for one check. `bytes` selects the measurement at that message size (collectives).

    A check whose figure depends on how many GPUs take part (collectives, P2P: metrics.MeasurementDecl's
    `by_gpu_count`) may give its bounds per GPU count in `by_gpus`; a count not listed there is not
    calibrated (WARN). A flat min/max applies at every count and wins over `by_gpus` (what
    `--set checks.X.min=V` gives)."""

    min: float | None = None
    max: float | None = None
    bytes: PositiveByteSize | None = None
    level: Literal["fail", "warn"] = Field("fail", description="what crossing the bound gives")
    by_gpus: dict[Annotated[int, Field(ge=1)], CountBound] | None = Field(
        None, description="bounds per GPU count of the measurement, e.g. {2: {min: 305}, 4: {min: 330}}"
    )
    source: str | None = Field(
        None, description="the runs the bound was derived from, or 'hand-set: why' (gpuval profiles derive)"
    )

    @model_validator(mode="after")
    def _bounded(self) -> Threshold:
        if self.min is None and self.max is None and not self.by_gpus:
            raise ValueError("a check needs a bound: give min or max (or by_gpus)")
        _ordered(self.min, self.max)
        return self

    @property
    def flat(self) -> bool:
        """Whether one bound holds at every GPU count."""
        return self.min is not None or self.max is not None

    def at(self, gpus: int | None) -> CountBound | None:
        """The bound at `gpus` GPUs: the flat one, else by_gpus' entry; None where not calibrated."""
        if self.flat:
            return CountBound(min=self.min, max=self.max, source=self.source)
        return (self.by_gpus or {}).get(gpus) if gpus is not None else None


class Expect(_Strict):
    gpu_count: StrictInt | None = Field(None, ge=0, description="GPUs per node")
    gpu_name: str | None = Field(None, description="regular expression matching the whole GPU name")
    gpu_memory_gib: float | None = Field(None, gt=0, description="minimum GiB per GPU")
    pci_ids: list[Annotated[str, Field(pattern=r"^[0-9a-f]{4}:[0-9a-f]{4}$")]] = Field(
        default_factory=list,
        description="PCI vendor:device ids of this GPU model as lspci -nn prints them (pci.ids), e.g. "
        "'10de:2330': how the profile is picked when NVML cannot name the GPUs; not a check",
    )
    driver_version: str | None = Field(
        None, description="NVIDIA driver version as a glob, e.g. '580.*' (fnmatch); unset: not checked"
    )
    nvlinks_per_gpu: StrictInt | None = Field(
        None, ge=0, description="NVLinks every GPU must have up (18 on HGX H100/H200); unset: all reported"
    )
    ib_ports: StrictInt | None = Field(None, ge=0, description="InfiniBand ports per node (link layer IB)")
    ib_rate_gbps: float | None = Field(None, gt=0, description="minimum rate of every InfiniBand port, Gb/s")


class HealthSettings(_Strict):
    xid_window_s: float = Field(
        1.0, ge=0, le=60, description="seconds to wait for XID events through NVML (0: kernel log only)"
    )
    skip: list[str] = Field(
        default_factory=list, description="health families not to run, e.g. [smoke, xid] (gpuval health)"
    )
    shared_dir: Path | None = Field(
        None, description="a directory every node must see as one file system (gpuval accept, many nodes)"
    )
    allow_hidden_gpus: bool = Field(
        False,
        description="true for a job deliberately given only some of a shared node's GPUs: NVIDIA GPUs on the "
        "PCI bus that NVML does not list, and GPUs NVML lists that CUDA cannot see (CUDA_VISIBLE_DEVICES), "
        "are then not a FAIL; NVML and CUDA must still see at least one GPU without an error. Default "
        "false: every GPU of the node must be usable",
    )
    xid_since: datetime | None = Field(
        None,
        description="count kernel-log XIDs only from this ISO-8601 time with its zone, e.g. the time of a "
        "GPU reset: 2026-11-24T10:00:00Z (unset: since boot or the node's last passing accept run)",
    )
    foreign_processes: Literal["auto", "fail", "warn"] = Field(
        "auto",
        description="another program's compute process on a tested GPU, or GPU memory held by processes "
        "this node cannot see: fail, warn, or auto = FAIL in gpuval accept (its benchmarks would be skewed "
        "or run out of memory), WARN in gpuval health (it also runs beside user jobs as a Slurm health "
        "check); warn suits shared nodes",
    )

    @field_validator("xid_since", mode="before")
    @classmethod
    def _aware_time(cls, value: Any) -> Any:
        """An ISO-8601 string (YAML may already have made it a datetime) that names its zone: a time without
        one would be read in whatever zone the node runs, and move the window by hours."""
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value.strip())
            except ValueError:
                raise ValueError("expected an ISO-8601 time such as 2026-11-24T10:00:00Z") from None
        if value is None or (isinstance(value, datetime) and value.tzinfo is not None):
            return value
        if isinstance(value, datetime):
            raise ValueError("give the time zone, e.g. 2026-11-24T10:00:00Z or +01:00")
        # a bare date (YAML reads 2026-11-24 as one) or a number, which pydantic would take as epoch seconds
        raise ValueError("expected an ISO-8601 time with the time of day, e.g. 2026-11-24T10:00:00Z")


class HistorySettings(_Strict):
    """Drift: each check against the median of the node's own last runs (gpuval.history).

    A median of fewer runs cannot tell noise from drift: over one past run it is that run, so a run that
    happened to be fast makes every later one "worse"; the median of five is still right with two of them
    off. Drift is therefore judged from a full window of five past runs (profiles of noisier machines ask
    for more, cpu.yaml for ten) and, until then, a SKIP check says how many there are.
    """

    window: StrictInt = Field(5, ge=1, description="a node's last runs whose median is its baseline")
    min_runs: StrictInt = Field(
        5, ge=1, description="past runs needed before drift is judged (at most the window)"
    )
    tolerance_pct: float = Field(10.0, ge=0, description="how much worse than the baseline is drift, in %")
    fail: bool = Field(False, description="drift FAILs instead of WARNs")

    @model_validator(mode="after")
    def _reachable(self) -> HistorySettings:
        if self.min_runs > self.window:  # the baseline holds `window` runs at most: drift would never come
            raise ValueError(
                f"min_runs ({self.min_runs}) is more than window ({self.window}): raise window to "
                f"{self.min_runs} or lower min_runs"
            )
        return self


class RuntimeSettings(_Strict):
    timeout_s: float = Field(
        300.0,
        gt=0,
        description="timeout of a collective outside any phase; inside one, the phase's deadline sets it "
        "(docs/deadlines.md)",
    )


class Profile(_Strict):
    name: str
    description: str = ""
    expect: Expect = Field(default_factory=Expect)
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    history: HistorySettings = Field(default_factory=HistorySettings)
    checks: dict[str, Threshold] = Field(default_factory=dict)
    benchmarks: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="options per benchmark; listing one runs it even with no check"
    )

    # every check's name and size parsed once, when the profile is validated (check_refs)
    _refs: dict[str, CheckRef] = PrivateAttr(default_factory=dict)

    @field_validator("checks")
    @classmethod
    def _check_names(cls, checks: dict[str, Threshold]) -> dict[str, Threshold]:
        for key in checks:
            CheckRef.parse(key)
        return checks

    @model_validator(mode="after")
    def _parse_refs(self) -> Profile:
        self._refs = {name: CheckRef.parse(name, threshold.bytes) for name, threshold in self.checks.items()}
        return self

    def check_refs(self) -> list[tuple[CheckRef, Threshold]]:
        """Every check as (its reference, its threshold), in the profile's order."""
        return [
            (self._refs.get(name) or CheckRef.parse(name, threshold.bytes), threshold)
            for name, threshold in self.checks.items()
        ]


def profile_dir() -> Path:
    return Path(str(resources.files("gpuval").joinpath("profiles")))


def builtin_profiles() -> list[str]:
    return sorted(path.stem for path in profile_dir().glob("*.yaml"))


def read_yaml(path: Path, kind: str = "profile") -> dict[str, Any]:
    """A YAML file holding a mapping, through the input gate (gpuval.inputs): every problem is one
    UsageError line naming the `kind` of file."""
    from gpuval.inputs import load_yaml_mapping

    return load_yaml_mapping(path, kind)


def resolve_profile_path(name_or_path: str) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists() or "/" in name_or_path:
        if not candidate.exists():
            raise UsageError(f"profile file '{name_or_path}' does not exist; check the path")
        return candidate
    builtin = profile_dir() / f"{name_or_path}.yaml"
    if builtin.exists():
        return builtin
    names = builtin_profiles()
    close = difflib.get_close_matches(name_or_path, names, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise UsageError(f"unknown profile '{name_or_path}'{hint}; built-in profiles: {', '.join(names)}")


def parse_set(assignment: str) -> tuple[list[str], Any]:
    """'expect.gpu_count=8' -> (['expect', 'gpu_count'], 8); the value is read as a YAML scalar."""
    if "=" not in assignment:
        raise UsageError(f"--set '{assignment}': write it as key.path=value")
    key, raw = assignment.split("=", 1)
    parts = [part for part in key.strip().split(".") if part]
    if not parts:
        raise UsageError(f"--set '{assignment}': the key is empty")
    from gpuval.inputs import parse_yaml

    value = parse_yaml(raw, f"--set '{key.strip()}'", lenient=True) if raw.strip() else ""
    return parts, value


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` laid over it, section by section: a mapping in both merges key by key (so
    overriding `step.compile` keeps `base`'s other `step` keys); anything else in `overrides` replaces.
    Neither argument is changed."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def apply_sets(
    data: dict[str, Any], assignments: list[str], dotted_maps: tuple[str, ...] = ("checks",)
) -> None:
    """Apply --set overrides in place. Keys of `dotted_maps` hold one dot ('all_reduce.busbw_gbps')."""
    for assignment in assignments:
        parts, value = parse_set(assignment)
        if parts[0] in dotted_maps and len(parts) >= 3:
            parts = [parts[0], f"{parts[1]}.{parts[2]}", *parts[3:]]
        node = data
        for part in parts[:-1]:
            key = _existing_key(node, part)
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                raise UsageError(f"--set '{assignment}': '{part}' is a value, not a section")
            node = child
        node[_existing_key(node, parts[-1])] = value


def _existing_key(node: dict[Any, Any], part: str) -> Any:
    """The key `part` names in `node`: YAML reads `2:` as the number 2 (by_gpus), --set gives text."""
    return int(part) if part.isdigit() and int(part) in node else part


def _describe(error: ValidationError, source: str, model: type[BaseModel]) -> str:
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    if first["type"] == "extra_forbidden":
        key = str(first["loc"][-1])
        section = _model_at(model, first["loc"][:-1])
        known = sorted(section.model_fields) if section is not None else []
        moved = getattr(section, "moved_keys", {}).get(key)  # a key a section took over
        close = difflib.get_close_matches(key, known, n=1)
        where = "".join(f"{part}." for part in first["loc"][:-1])  # the section's path, with its dot
        hint = (
            f" ({where}{key} moved to {where}{moved})"
            if moved
            else f" (did you mean '{close[0]}'?)"
            if close
            else f" (known keys: {', '.join(known)})"
            if known
            else ""
        )
        return f"{source}: unknown key '{location}'{hint}"
    if first["type"] == "missing":
        return f"{source}: missing key '{location}'"
    given = first.get("input")
    shown = "" if isinstance(given, (dict, list)) else f" (got {given!r})"
    return f"{source}: '{location}': {first['msg']}{shown}"


def _model_at(model: type[BaseModel], location: tuple[Any, ...]) -> Any:
    """The model class of the section at `location` (for 'did you mean'); steps over the keys of dict
    fields; None where there is none."""
    current: Any = model
    parts = list(location)
    while parts and current is not None:
        part = parts.pop(0)
        field = current.model_fields.get(part)
        if field is None:
            return None
        annotation = field.annotation
        # an optional mapping (by_gpus) is a mapping too
        annotation = next((a for a in get_args(annotation) if get_origin(a) is dict), annotation)
        if get_origin(annotation) is dict:
            if parts:
                parts.pop(0)  # the dict's own key, e.g. a check name
            current = _model_of(get_args(annotation)[1])
        else:
            current = _model_of(annotation)
    return current


def _model_of(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def validate_model(model: type[BaseModel], data: dict[str, Any], source: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise UsageError(_describe(exc, source, model)) from None


def load_profile(name_or_path: str, assignments: list[str] | None = None) -> Profile:
    path = resolve_profile_path(name_or_path)
    data = read_yaml(path)
    apply_sets(data, assignments or [])
    source = f"profile '{path.name if path.parent == profile_dir() else path}'"
    return validate_model(Profile, data, source)


def pick_profile(gpu_names: list[str], pci_ids: list[str] | None = None) -> str:
    """The built-in profile matching the local GPUs: by the names NVML gives, else (NVML cannot name them:
    no driver loaded) by the PCI ids of the NVIDIA GPUs on the bus against expect.pci_ids; 'cpu' only
    when there is no NVIDIA GPU at all."""
    if gpu_names:
        for name in builtin_profiles():
            pattern = load_profile(name).expect.gpu_name
            if pattern and all(re.fullmatch(pattern, gpu) for gpu in gpu_names):
                return name
        raise UsageError(
            f"no built-in profile matches the GPUs here ({gpu_names[0]}); pass --profile FILE "
            f"(start from one of: {', '.join(builtin_profiles())})"
        )
    if not pci_ids:
        return "cpu"
    for name in builtin_profiles():
        known = load_profile(name).expect.pci_ids
        if known and all(pci_id.lower() in known for pci_id in pci_ids):
            return name
    found = ", ".join(f"{count}x {pci_id}" for pci_id, count in sorted(Counter(pci_ids).items()))
    raise UsageError(
        f"NVML cannot name the GPUs here and no built-in profile matches their PCI ids ({found}); pass "
        f"--profile NAME or FILE (built-in: {', '.join(builtin_profiles())})"
    )

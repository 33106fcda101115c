"""The runs a profile is derived from (`gpuval profiles derive`): read, vetted, and their values of a check
grouped as the rule takes them (gpuval.derive, docs/thresholds.md).

A run is a result.json (gpuval.result/v1) or a `gpuval bench --output` document (gpuval.bench/v1). One
that is no evidence of a healthy node is refused, naming the file: a verdict of ERROR, a FAIL of a check
that is not a threshold on a declared metric (a health family, a wrong collective result), a benchmark
that did not run. A FAIL against a profile's floor is no reason: the values count. What gpuval could not
have written is refused too, naming the file and the field: an inventory of another shape, a rank count
below 1, a metric value that is no number or of a size no measurement has, a name (its path) that the
derived profile could not list the run by.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from gpuval import metrics
from gpuval.checkref import CheckRef
from gpuval.checks import gpu_count
from gpuval.config import Threshold
from gpuval.errors import UsageError
from gpuval.results import BENCH_SCHEMA_ID, SCHEMA_ID, BenchDocument, Measurement, Result, Status
from gpuval.scope import is_pair


@dataclass(frozen=True)
class Run:
    """One clean run: where it came from, its GPUs per node and its measurements."""

    label: str  # how a bound's source names it
    gpus_per_node: int
    gpu_names: tuple[str, ...]
    measurements: tuple[Measurement, ...]
    skip: frozenset[str] = field(default_factory=frozenset)  # checks (globs) not taken from it (manifest)
    profile: str | None = None  # the profile it was judged by (result.json); a bench document names none
    nodes: tuple[str, ...] = ()  # the nodes that ran it (node_name); none known: the run counts as one


# The least and the largest size of a value other than 0 that a run may hold. No metric comes within 90
# orders of magnitude of either (the committed runs span 0.012 to 51,109: TB/s of a CPU to tokens/s); past
# them a value is a broken file, and the rule's arithmetic (sums in a median, 3 significant digits of a
# subnormal) would leave the floats. JSON refuses NaN and infinities already (gpuval.inputs).
LEAST_VALUE, LARGEST_VALUE = 1e-100, 1e100
# What a bound's source, which lists its runs, cannot hold and read back from the profile: what breaks or
# ends a line (control characters, U+2028/9) and what YAML refuses (lone surrogates, which undecodable
# bytes of a path become, and the noncharacters U+FFFE/F)
_UNNAMEABLE = ("Cc", "Cs", "Zl", "Zp")
_NONCHARACTERS = "\ufffe\uffff"
_FIX = "fix the file or leave the run out"


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Gpu(_Open):
    name: StrictStr | None = None
    uuid: StrictStr | None = None


class _Host(_Open):
    hostname: StrictStr | None = None


class _Node(_Open):
    node: StrictStr | None = None
    host: _Host | None = None
    gpus: list[_Gpu] | None = None


class _Inventory(_Open):
    nodes: list[_Node] | None = None


class _Inventoried(_Open):
    """The parts of a run's inventory read here (node_name, the GPUs' names), in the shape gpuval discover
    writes them: a result.json's inventory is a free mapping in its schema."""

    inventory: _Inventory = Field(default_factory=_Inventory)


def node_name(node: dict[str, Any]) -> str | None:
    """A node of an inventory as one name: its host name and its GPUs' UUIDs, since lent machines all call
    themselves 'vm' (a node whose GPUs were replaced counts as another one). None when it says neither."""
    host = node.get("host")
    hostname = node.get("node") or (host.get("hostname") if isinstance(host, dict) else None)
    gpus = [gpu for gpu in node.get("gpus") or [] if isinstance(gpu, dict) and gpu.get("uuid")]
    uuids = sorted(str(gpu["uuid"]).removeprefix("GPU-") for gpu in gpus)
    if uuids:
        return f"{hostname or '?'}[{' '.join(uuids)}]"
    return str(hostname) if hostname else None


def _nameable(label: str) -> None:
    """Refuse a run whose name a bound's source could not carry into the profile (a newline in its path)."""
    bad = next(
        (char for char in label if unicodedata.category(char) in _UNNAMEABLE or char in _NONCHARACTERS), None
    )
    if bad is not None:
        shown = label.encode("utf-8", "backslashreplace").decode("utf-8")
        raise UsageError(
            f"run '{shown}': its name holds {ascii(bad)}, which the sources of the derived bounds (they list "
            "their runs) cannot hold: rename or move the file"
        )


def _vetted_measurements(shown: str, measurements: list[Measurement]) -> None:
    """Refuse what no gpuval benchmark writes in the fields the rule reads: a rank count below 1 (a
    collective's GPU count), a value past the sizes any measurement has."""
    for index, m in enumerate(measurements):
        where = f"{shown}: measurements.{index}"
        ranks = m.params.get("ranks", 1)
        if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
            raise UsageError(
                f"{where}.params.ranks is {json.dumps(ranks)[:40]}, not a count of ranks (1 or more): {_FIX}"
            )
        for key, value in m.metrics.items():
            if value and not LEAST_VALUE <= abs(value) <= LARGEST_VALUE:
                raise UsageError(
                    f"{where}.metrics.{key} is {value:.4g}, which no measurement gives (a value other than 0 "
                    f"is between {LEAST_VALUE:g} and {LARGEST_VALUE:g} in size): {_FIX}"
                )


def load_run(path: Path, label: str | None = None, skip: frozenset[str] = frozenset()) -> Run:
    """A run read and vetted; anything that is no evidence of a healthy node is a one-line UsageError."""
    from gpuval.inputs import load_json

    shown = label or str(path)
    _nameable(shown)
    data = load_json(path, "result file")
    schema = data.get("schema") if isinstance(data, dict) else None
    profile = None
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
            world, measurements = result.world, result.measurements
            profile = result.profile or None
        elif schema == BENCH_SCHEMA_ID:
            document = BenchDocument.model_validate(data)
            if document.status != "OK":
                raise UsageError(f"{shown}: its benchmark did not run ({document.status}: {document.detail})")
            world, measurements = document.world, document.measurements
        else:
            raise UsageError(
                f"{shown}: not a gpuval result.json or bench document (schema: {schema!r}); pass what "
                "gpuval accept or gpuval bench --output wrote"
            )
        _Inventoried.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "the document"
        said = re.sub(r" or instance of \w+", "", str(first.get("msg")))  # not our class names
        raise UsageError(f"{shown}: not a valid gpuval document ({where}: {said}): {_FIX}") from None
    if not measurements:
        raise UsageError(f"{shown}: it holds no measurement to derive from")
    _vetted_measurements(shown, measurements)
    nodes = data.get("inventory", {}).get("nodes") or []
    names = tuple(gpu["name"] for node in nodes for gpu in node.get("gpus") or [] if gpu.get("name"))
    named = tuple(dict.fromkeys(name for name in map(node_name, nodes) if name))
    per_node = max(1, world.size // max(1, world.nodes))
    return Run(shown, per_node, names, tuple(measurements), skip, profile, named)


@dataclass(frozen=True)
class Value:
    """One clean value of a check: its run and what it measured (a GPU, a collective's ranks)."""

    value: float
    run: Run
    scope: str


def values_by_group(name: str, threshold: Threshold, runs: list[Run]) -> dict[int | None, list[Value]]:
    """The check's clean values by group: GPU count where the measurement is bounded per count, else None."""
    ref = CheckRef.parse(name, threshold.bytes)
    per_count = metrics.by_gpu_count(ref.measurement)
    groups: dict[int | None, list[Value]] = {}
    for run in runs:
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in run.skip):
            continue
        for m in run.measurements:
            if not ref.selects(m) or is_pair(m.scope):  # a pair of nodes is not the whole measured
                continue
            value = m.metrics.get(ref.metric)
            if value is None or not math.isfinite(value):
                continue
            count = gpu_count(m, run.gpus_per_node) if per_count else None
            groups.setdefault(count, []).append(Value(value, run, m.scope))
    return groups

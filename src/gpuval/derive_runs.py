"""The runs a profile is derived from (`gpuval profiles derive`): read, vetted, and their values of a check
grouped as the rule takes them (gpuval.derive, docs/thresholds.md).

A run is a result.json (gpuval.result/v1) or a `gpuval bench --output` document (gpuval.bench/v1). One
that is no evidence of a healthy node is refused, naming the file: a verdict of ERROR, a FAIL of a check
that is not a threshold on a declared metric (a health family, a wrong collective result), a benchmark
that did not run. A FAIL against a profile's floor is no reason: the values count.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

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


def load_run(path: Path, label: str | None = None, skip: frozenset[str] = frozenset()) -> Run:
    """A run read and vetted; anything that is no evidence of a healthy node is a one-line UsageError."""
    from gpuval.inputs import load_json

    shown = label or str(path)
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
            world, nodes, measurements = result.world, result.inventory.get("nodes", []), result.measurements
            profile = result.profile or None
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
    nodes = [node for node in nodes if isinstance(node, dict)]
    names = tuple(str(gpu.get("name")) for node in nodes for gpu in node.get("gpus") or [] if gpu.get("name"))
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

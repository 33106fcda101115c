"""The runs a fleet summary is made of: result.json files read, vetted, and cut down per node to what the
summary needs (the checks that did not pass, and the values its robust rule compares).

A result names its nodes in its inventory (`inventory.nodes[].node`, the name `gpuval accept` gave the node:
GPUVAL_NODE_NAME, else Slurm's SLURMD_NODENAME, else the host name) and in its checks' scopes; a run across
several nodes gives each of them a record. A check bears on the nodes its scope names (a pair of nodes on
both); a cluster-scoped check on every node of the run, since nothing in it says which node made it so.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, ValidationError, create_model

from gpuval import metrics
from gpuval.errors import UsageError
from gpuval.fleet.hostlist import name_problem
from gpuval.results import BENCH_SCHEMA_ID, SCHEMA_ID, Check, Result, Status, load_result
from gpuval.scope import read as read_scope

FLEET_SCHEMA_ID = "gpuval.fleet/v1"
# what a check that did not pass is listed for: a SKIP never changes a verdict, and every node has some
LISTED = (Status.FAIL, Status.ERROR, Status.WARN)
# a value the fleet compares was judged against its bound (a SKIP's value was not: its node failed health)
COMPARED = (Status.PASS, Status.WARN, Status.FAIL)


@dataclass(frozen=True, slots=True)
class Reading:
    """One value of a check on a declared metric, as the fleet's robust rule compares it with its peers."""

    check: str
    scope: str
    value: float
    status: Status
    unit: str
    bound: float | None  # its floor (a ceiling where lower is better), None where its profile sets none
    group: tuple[Any, ...]  # the values of one group are compared with each other (fleet.judge)
    direction: int  # +1: higher is better, -1: lower is
    owners: tuple[str, ...]  # the nodes it bears on
    source: str  # the file: a run's value counts once however many nodes it bears on


@dataclass(frozen=True, slots=True)
class NodeRun:
    """One node's part of one result file."""

    name: str
    source: str
    started_at: datetime
    started_text: str
    profile: str
    run_verdict: Status
    checks: tuple[Check, ...]  # those that bear on this node and did not pass (LISTED)
    verdict: Status  # this node's, from every check that bears on it (gpuval.results.verdict)
    readings: tuple[Reading, ...]  # the values the fleet compares that bear on this node
    run_nodes: int  # nodes in its run


def read_runs(paths: Iterable[Path]) -> list[NodeRun]:
    """Every node of every file, in file order; a file that is no gpuval result is a one-line UsageError."""
    runs: list[NodeRun] = []
    for path in paths:
        runs.extend(node_runs(load(path), str(path)))
    return runs


_READ = ("verdict", "started_at", "profile", "world", "inventory", "checks")  # what the fleet uses
# The fields of a result.json (gpuval.result/v1) the fleet reads, validated as gpuval.results.Result declares
# them; the rest (measurements, settings: two thirds of a file) is skipped unread by the JSON parser.
ResultView = create_model(
    "ResultView",
    __config__=ConfigDict(extra="ignore", populate_by_name=True),
    schema_=(str, Field(alias="schema")),  # required here: a document that names no schema is no result
    **{name: (Result.model_fields[name].annotation, Result.model_fields[name]) for name in _READ},
)


def load(path: Path) -> Any:
    """A result.json parsed and validated in one pass by pydantic's JSON parser, reading only what the fleet
    uses (a thousand files of eight GPUs in seconds); a file it refuses goes through
    gpuval.results.load_result's gate, which says in one line what is wrong, or what the file is when it is
    another gpuval document."""
    from gpuval.inputs import read_input_text

    text = read_input_text(path, "result file")
    try:
        view = ResultView.model_validate_json(text)
    except ValidationError:
        view = None
    if view is not None and view.schema_ == SCHEMA_ID:
        return view
    _refuse_other_documents(path)
    result = load_result(path)  # raises its own one-line UsageError, or reads what the fast parser would not
    return ResultView.model_validate(result.model_dump(by_alias=True))


def _refuse_other_documents(path: Path) -> None:
    """A gpuval document of another kind, named for what it is: a bench document or a fleet summary mixed
    in with the results is the likeliest wrong file in a folder of runs."""
    from gpuval.inputs import load_json

    data = load_json(path, "result file")
    found = data.get("schema") if isinstance(data, dict) else None
    if found == BENCH_SCHEMA_ID:
        raise UsageError(
            f"{path} is a {BENCH_SCHEMA_ID} document (what gpuval bench --output writes), not a result.json: "
            "two schemas mixed; gpuval fleet reads the result.json of gpuval accept or health"
        )
    if found == FLEET_SCHEMA_ID:
        raise UsageError(
            f"{path} is a {FLEET_SCHEMA_ID} summary (what gpuval fleet writes), not a result.json: two "
            "schemas mixed; pass the result.json files of the nodes"
        )


def node_runs(result: Any, source: str) -> list[NodeRun]:
    """One record per node the result names."""
    from gpuval.results import verdict

    inventory = _inventory_nodes(result)
    names = list(inventory)
    scopes = {text: read_scope(text) for text in dict.fromkeys(check.scope for check in result.checks)}
    for scope in scopes.values():
        names += [name for name in (scope.nodes if scope is not None else ()) if name not in names]
    if not names:
        raise UsageError(
            f"{source}: names no node (no inventory.nodes[].node and no node in a check's scope): pass the "
            "result.json that gpuval accept or health wrote"
        )
    for name in names:
        if (problem := name_problem(name)) is not None:
            raise UsageError(f"{source}: {problem}: it cannot be written into a Slurm hostlist")
    started = _started(result.started_at, source)
    owners = {text: tuple(_owners(scope, names)) for text, scope in scopes.items()}
    bearing: dict[str, list[Check]] = {name: [] for name in names}
    for check in result.checks:
        for name in owners[check.scope]:
            bearing[name].append(check)
    readings = _readings(result, scopes, owners, inventory, source)
    records = []
    for name in names:
        checks = bearing[name]
        judged = verdict(checks) if checks else Status.ERROR
        if result.verdict is Status.ERROR and judged is Status.PASS:
            judged = Status.ERROR  # the run says it did not complete: never PASS what it did not show
        records.append(
            NodeRun(
                name=name,
                source=source,
                started_at=started,
                started_text=result.started_at,
                profile=result.profile,
                run_verdict=result.verdict,
                checks=tuple(check for check in checks if check.status in LISTED),
                verdict=judged,
                readings=tuple(reading for reading in readings if name in reading.owners),
                run_nodes=len(names),
            )
        )
    return records


def _inventory_nodes(result: Any) -> dict[str, list[dict[str, Any]]]:
    """Node name -> its GPUs (dicts with index and name), from the result's inventory."""
    found: dict[str, list[dict[str, Any]]] = {}
    nodes = result.inventory.get("nodes")
    for node in nodes if isinstance(nodes, list) else []:
        if not isinstance(node, dict):
            continue
        host = node.get("host")
        name = node.get("node") or (host.get("hostname") if isinstance(host, dict) else None)
        if isinstance(name, str) and name:
            gpus = node.get("gpus")
            found[name] = [gpu for gpu in gpus if isinstance(gpu, dict)] if isinstance(gpus, list) else []
    return found


def _started(text: str, source: str) -> datetime:
    try:
        started = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{source}: started_at {text[:40]!r} is not an ISO-8601 time; pass the result.json gpuval wrote"
        ) from None
    return started if started.tzinfo else started.replace(tzinfo=timezone.utc)


def _owners(scope: Any, names: list[str]) -> list[str]:
    """The nodes a check bears on: its scope's, else (the cluster, a scope of no known shape) every node."""
    if scope is None or not scope.nodes:
        return names
    return [name for name in scope.nodes if name in names] or names


@functools.cache
def direction(check_name: str) -> int:
    """+1 or -1 for a check on a benchmark's declared metric whose values the fleet compares; 0 for every
    other check: a health check, a derived gap (`outliers.*_pct` compares a node's own GPUs already)."""
    from gpuval import derived

    if derived.of_check(check_name) is not None:
        return 0
    metric = metrics.of_check(check_name)
    return metric.direction if metric is not None else 0


def _bound(threshold: dict[str, Any], better: int) -> float | None:
    bound = threshold.get("min" if better > 0 else "max")
    number = isinstance(bound, (int, float)) and not isinstance(bound, bool) and math.isfinite(bound)
    return float(bound) if number else None


def _models(gpus: list[dict[str, Any]]) -> tuple[dict[Any, str], str]:
    """The GPU model of each GPU by index, and the most common one (of a GPU not listed, or a whole node)."""
    by_index = {gpu.get("index"): str(gpu["name"]) for gpu in gpus if gpu.get("name")}
    counted = Counter(str(gpu["name"]) for gpu in gpus if gpu.get("name"))
    return by_index, counted.most_common(1)[0][0] if counted else "no GPU named"


def _readings(
    result: Any,
    scopes: dict[str, Any],
    owners: dict[str, tuple[str, ...]],
    inventory: dict[str, list[dict[str, Any]]],
    source: str,
) -> list[Reading]:
    """The values of this run the fleet compares, each with the group it is compared within: the check (and
    the size it selects), the GPU model, and what the value is of — a GPU; a node or a link by the node's
    GPU count; the whole run by its GPU and node counts (collectives and P2P scale with them)."""
    world = result.world
    every_gpu = [gpu for gpus in inventory.values() for gpu in gpus]
    per_node = len(every_gpu) // max(1, len(inventory)) if every_gpu else world.size // max(1, world.nodes)
    whole_run = _models(every_gpu)
    models = {name: _models(gpus) for name, gpus in inventory.items()}
    found = []
    for check in result.checks:
        value = check.value
        if check.status not in COMPARED or value is None or not math.isfinite(value):
            continue
        better = direction(check.name)
        scope = scopes[check.scope]
        if not better or scope is None or scope.kind == "pair":  # a pair's figure is two nodes' at once
            continue
        size = check.threshold.get("bytes")
        by_index, common = models.get(scope.node or "", whole_run)
        if scope.kind in ("gpu", "cpu"):
            group: tuple[Any, ...] = (check.name, size, by_index.get(scope.index, common), scope.kind)
        elif scope.kind == "cluster":
            group = (check.name, size, whole_run[1], scope.kind, world.size, world.nodes)
        else:
            gpus = len(inventory.get(scope.node or "", ())) or per_node
            group = (check.name, size, common, scope.kind, gpus)
        found.append(
            Reading(
                check.name,
                check.scope,
                float(value),
                check.status,
                check.unit,
                _bound(check.threshold, better),
                group,
                better,
                owners[check.scope],
                source,
            )
        )
    return found


def read_expected(value: str) -> list[str]:
    """The nodes --expect names: a Slurm hostlist (`node[001-200]`, `$SLURM_JOB_NODELIST`), or `@FILE` or
    the path of a file with one name or hostlist a line (blank lines and `#` comments skipped)."""
    from gpuval.fleet.hostlist import HostlistError, parse
    from gpuval.inputs import read_input_text

    path = Path(value[1:]) if value.startswith("@") else Path(value)
    if value.startswith("@") or ("[" not in value and "," not in value and path.is_file()):
        lines = read_input_text(path, "--expect file").splitlines()
        names: list[str] = []
        for number, line in enumerate(lines, 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                names += parse(text)
            except HostlistError as exc:
                raise UsageError(f"--expect file '{path}', line {number}: {exc}") from None
        if not names:
            raise UsageError(f"--expect file '{path}' names no node: write one node name a line")
        return list(dict.fromkeys(names))
    try:
        return parse(value)
    except HostlistError as exc:
        raise UsageError(f"--expect: {exc}") from None

"""Every accept run per node in SQLite, and drift: a node measured worse than its own recent past.

What is stored is what was judged: each check's value with its name and scope. A check scoped to a GPU,
a link or a node belongs to that node; a cluster check (a collective) belongs to the set of nodes that
ran it ("n1+n2"). A run's drift checks compare each judged value with the median of the same check on the
same node(s), same profile, over the last `history.window` runs that did not end in ERROR: worse by more
than `history.tolerance_pct` is a WARN (a FAIL where `history.fail` is set) named `drift.<check>`.
Which checks are kept, and whether worse means lower or higher, comes from the judged metric's
declaration (gpuval.metrics): a check of an undeclared or uncompared metric is not kept. A check on a
derived measurement (the outliers gap) is kept for `gpuval history` but never judged for drift: it
compares a run's figures with each other (gpuval.derived.of_check says why that rules drift out).

Drift is judged only against at least `history.min_runs` past runs (config.HistorySettings says why);
while a check has fewer, the run gets one SKIP check `drift` saying how many there are and from which run
drift is judged: a SKIP never changes the verdict.

A check scoped to one GPU ('gpu:n1/3') is also keyed by that GPU's UUID, read from the run's inventory
(each node's `gpus[]` index and uuid): a GPU moved to another slot or node keeps its history, and a new
GPU in the same slot starts its own. A check with no UUID known (a cluster, node or link check, a CPU
rank, an inventory without UUIDs, every row of a schema-1 file) is keyed by node and scope, as before.

The file itself (its schema, migrating an older one, refusing one gpuval did not write) is
gpuval.history_db's: every reader here reads through it and checks each row it reads.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
from contextlib import closing, nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuval import derived, metrics
from gpuval.checkref import DRIFT, family_of, in_family
from gpuval.errors import UsageError
from gpuval.history_db import as_written, check_every_row, connect, reading
from gpuval.results import Check, Result, Status
from gpuval.scope import Scope, node_of
from gpuval.units import format_number

# the last runs of one check, newest first: of one GPU (by UUID), or of one node and scope
_PAST = (
    "SELECT v.value FROM values_ v JOIN runs r ON r.id = v.run_id WHERE {subject} AND v.name = ? "
    "AND r.profile = ? AND r.verdict != 'ERROR' ORDER BY r.started_at DESC, r.id DESC LIMIT ?"
)
_BY_GPU = "v.gpu_uuid = ?"
_BY_SCOPE = "v.gpu_uuid IS NULL AND v.node = ? AND v.scope = ?"
OFF = "none"


def history_path_from(option: str | None) -> Path | None:
    """--history, else GPUVAL_HISTORY, else $XDG_DATA_HOME/gpuval/history.sqlite; 'none' turns it off."""
    chosen = option or os.environ.get("GPUVAL_HISTORY")
    if chosen:
        return None if chosen == OFF else Path(chosen)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpuval" / "history.sqlite"


def open_history(path: Path) -> None:
    """Create the database (and its folder) if needed, prove that what it holds is gpuval's (its tables,
    every page readable, every row of the types gpuval writes) and that a run can be recorded there: a
    row is written and rolled back. So a read-only file, a folder where SQLite cannot create its journal,
    a file that is not SQLite or not gpuval's is a UsageError naming the path before any work, not a
    traceback or a half-judged run after it."""
    with reading(path) as db:
        check_every_row(db, path)
        db.execute("BEGIN IMMEDIATE")
        db.execute(
            "INSERT INTO runs (started_at, profile, verdict, nodes, gpuval_version, command) "
            "VALUES ('', '', '', '', '', '')"
        )
        db.rollback()


def _owner(scope: str, group: str) -> str:
    """The node a check belongs to: 'gpu:n1/3' -> 'n1', 'cluster' -> the run's node group."""
    return node_of(scope) or group


def _amount(value: float, unit: str) -> str:
    return f"{format_number(value)} {unit}".strip()


def gpu_uuids(result: Result) -> dict[str, str]:
    """The run's GPU scopes ('gpu:n1/0') -> each GPU's UUID in NVML's spelling ('GPU-…'), from the node
    inventory's `gpus[]` (index and uuid); a GPU listed without a UUID is left out."""
    found = {}
    for node in result.inventory.get("nodes", []):
        gpus = node.get("gpus") if isinstance(node, dict) else None
        for gpu in gpus if isinstance(gpus, list) else []:
            index, uuid = (gpu.get("index"), gpu.get("uuid")) if isinstance(gpu, dict) else (None, None)
            if isinstance(index, int) and not isinstance(index, bool) and isinstance(uuid, str) and uuid:
                # torch spells CUDA's UUID without NVML's prefix (inventories without NVML)
                found[str(Scope.gpu(node.get("node"), index))] = (
                    uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
                )
    return found


def short_uuid(uuid: str) -> str:
    """'GPU-454e97b1-c38b-…' -> 'GPU-454e97b1': the prefix and the first group, enough to tell GPUs apart."""
    return "-".join(uuid.split("-")[:2])


def _group(result: Result) -> str:
    names = sorted(str(node.get("node")) for node in result.inventory.get("nodes", []) if node.get("node"))
    return "+".join(names) or "unknown"


def _judged(result: Result) -> list[Check]:
    """Checks worth a trend: a number, and a direction that says which way is worse."""
    return [
        c
        for c in result.checks
        if c.value is not None and family_of(c.name) != DRIFT and _direction(c.name) != 0
    ]


def _direction(check_name: str) -> int:
    """+1 when a higher value of the metric this check judges is better, -1 when lower, 0: not kept."""
    judged = metrics.of_check(check_name)
    return judged.direction if judged else 0


def drift_checks(path: Path, result: Result, settings: Any) -> list[Check]:
    """This run's checks against the node's own recent past: a `drift.<check>` for each worse beyond the
    tolerance, and one SKIP check `drift` while some have too few past runs to be judged."""
    group, uuids = _group(result), gpu_uuids(result)
    judged = [check for check in _judged(result) if derived.of_check(check.name) is None]
    checks, too_few = [], []
    with reading(path) if path.exists() else nullcontext() as db:
        for check in judged:
            node, uuid = _owner(check.scope, group), uuids.get(check.scope)
            subject = (uuid,) if uuid else (node, check.scope)
            rows = (
                as_written(
                    path,
                    "values_",
                    ("value",),
                    db.execute(
                        _PAST.format(subject=_BY_GPU if uuid else _BY_SCOPE),
                        (*subject, check.name, result.profile, settings.window),
                    ),
                )
                if db is not None
                else []
            )
            if len(rows) < settings.min_runs:
                too_few.append((check, len(rows)))
                continue
            median = statistics.median(value for (value,) in rows)
            if median == 0:
                continue
            sign = _direction(check.name)  # +1: higher is better
            worse_pct = (check.value - median) / abs(median) * 100 * -sign
            if worse_pct <= settings.tolerance_pct:
                continue
            edge = median * (1 - sign * settings.tolerance_pct / 100)
            whose = f"this GPU's ({short_uuid(uuid)})" if uuid else "this node's"
            checks.append(
                Check(
                    name=in_family(DRIFT, check.name),
                    status=Status.FAIL if settings.fail else Status.WARN,
                    value=check.value,
                    threshold={"min" if sign > 0 else "max": edge, "median": median, "runs": len(rows)},
                    unit=check.unit,
                    scope=check.scope,
                    detail=(
                        f"{_amount(check.value, check.unit)} is {worse_pct:.1f}% worse than {whose} "
                        f"median {_amount(median, check.unit)} over its last {_runs(len(rows))} (tolerance "
                        f"{settings.tolerance_pct:g}%): see `gpuval history --node {node}` and what changed "
                        "(driver, clocks, cooling, firmware)"
                    ),
                )
            )
    if too_few:
        checks.append(_not_judged_yet(too_few, len(judged), settings.min_runs, result))
    return checks


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


def _not_judged_yet(too_few: list[tuple[Check, int]], judged: int, needed: int, result: Result) -> Check:
    """One SKIP check for every check that has fewer than `needed` past runs: how many there are, and from
    which run on drift is judged (a check of every run has as many past runs as the node; one of a new
    GPU, or new to the profile, has fewer)."""
    nodes = _group(result).split("+")
    past = "past run" if needed == 1 else "past runs"
    if len(too_few) == judged:
        most = max(runs for _, runs in too_few)
        detail = (
            f"drift not judged yet: {most or 'none'} of the {needed} {past} it needs here "
            f"(history.min_runs); judged from run {needed + 1} on"
        )
    else:
        check = too_few[0][0]
        detail = (
            f"drift not judged for {len(too_few)} of {judged} checks, new here (such as {check.name} on "
            f"{check.scope}): fewer than the {needed} {past} each needs (history.min_runs)"
        )
    scope = Scope.of_node(nodes[0]) if len(nodes) == 1 else Scope.cluster()
    return Check(name=DRIFT, status=Status.SKIP, scope=str(scope), detail=detail)


def record(path: Path, result: Result) -> int:
    """Store the run and its judged values (a GPU's with its UUID); returns the run's id."""
    import json

    group, uuids = _group(result), gpu_uuids(result)
    with closing(connect(path)) as db, db:
        cursor = db.execute(
            "INSERT INTO runs (started_at, profile, verdict, nodes, gpuval_version, command) "
            "VALUES (?,?,?,?,?,?)",
            (
                result.started_at,
                result.profile,
                result.verdict.value,
                group,
                result.gpuval_version,
                json.dumps(result.command),
            ),
        )
        run_id = int(cursor.lastrowid or 0)
        db.executemany(
            "INSERT INTO values_ (run_id, node, name, scope, value, unit, gpu_uuid) VALUES (?,?,?,?,?,?,?)",
            [
                (
                    run_id,
                    _owner(c.scope, group),
                    c.name,
                    c.scope,
                    float(c.value or 0.0),
                    c.unit,
                    uuids.get(c.scope),
                )
                for c in _judged(result)
            ],
        )
    return run_id


def recorded_runs(path: Path, result: Result) -> tuple[str, int]:
    """The node (or node group, 'n1+n2') of `result` and how many runs of it the history holds."""
    group = _group(result)
    with reading(path) as db:
        (count,) = db.execute("SELECT COUNT(*) FROM runs WHERE nodes = ?", (group,)).fetchone()
    return group, int(count)


def runs(path: Path, node: str | None = None, last: int = 20) -> list[dict[str, Any]]:
    """The latest runs (newest first), of one node (or node group containing it) when `node` is given.
    What `gpuval history` reads first: the whole file is checked as accept checks it (open_history), so
    a file accept refuses is refused here too, whichever of its rows the listing shows."""
    if not path.exists():
        raise UsageError(f"no history at {path}: gpuval accept records there (or pass --history PATH)")
    with reading(path) as db:
        check_every_row(db, path)
        rows = db.execute(
            "SELECT id, started_at, profile, verdict, nodes FROM runs ORDER BY started_at DESC, id DESC"
        ).fetchall()
    found = [
        {"id": r[0], "started_at": r[1], "profile": r[2], "verdict": r[3], "nodes": r[4]}
        for r in rows
        if node is None or node in r[4].split("+")
    ]
    return found[:last]


def last_passing_run(path: Path, node: str) -> datetime | None:
    """When the newest run that PASSed on `node` (alone or in a node group) started; None when there is
    none. Read-only (health must never create or change a database), and a missing or unreadable database
    is no passing run rather than an error: it only narrows which XIDs count."""
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5)) as db:
            rows = db.execute("SELECT started_at, nodes FROM runs WHERE verdict = 'PASS'").fetchall()
    except (OSError, sqlite3.Error):
        return None
    times = []
    for started_at, nodes in rows:
        try:
            started = datetime.fromisoformat(started_at)
        except (TypeError, ValueError):
            continue  # a row not written by gpuval says nothing about this node
        if node in str(nodes).split("+") and started.tzinfo is not None:
            times.append(started)
    return max(times, default=None)


def trends(path: Path, node: str, last: int = 10) -> list[dict[str, Any]]:
    """Per check on `node`: its values over the last runs (oldest first), their median, latest vs median.

    A GPU's check is one series per GPU (UUID), with its values from every slot and node it was in, shown
    under the node and scope it was last measured in (a GPU since moved to another node is that node's);
    any other check is one series per scope."""
    with reading(path) as db:
        rows = as_written(
            path,
            "values_",
            ("name", "scope", "node", "gpu_uuid", "value", "unit"),
            db.execute(
                "SELECT v.name, v.scope, v.node, v.gpu_uuid, v.value, v.unit FROM values_ v "
                "JOIN runs r ON r.id = v.run_id WHERE v.node = ? OR r.nodes = ? OR v.gpu_uuid IN "
                "(SELECT gpu_uuid FROM values_ WHERE node = ? AND gpu_uuid IS NOT NULL) "
                "ORDER BY r.started_at, r.id",
                (node, node, node),
            ),
        )
    series: dict[tuple[str, str, str], dict[str, Any]] = {}
    for name, scope, owner, uuid, value, unit in rows:
        item = series.setdefault((name, uuid or "", "" if uuid else scope), {"values": []})
        item["values"].append(value)
        item.update(name=name, scope=scope, node=owner, gpu_uuid=uuid, unit=unit)  # the latest row's
    out = []
    for item in sorted(series.values(), key=lambda i: (i["name"], i["scope"], i["gpu_uuid"] or "")):
        if item["gpu_uuid"] and item["node"] != node:
            continue  # the GPU was last measured on another node
        recent = item["values"][-last:]
        median = statistics.median(recent)
        out.append(
            {
                "name": item["name"],
                "scope": item["scope"],
                "node": item["node"],
                "gpu_uuid": item["gpu_uuid"],
                "unit": item["unit"],
                "values": recent,
                "median": median,
                "latest_vs_median_pct": (recent[-1] - median) / abs(median) * 100 if median else None,
            }
        )
    return out

"""Every accept run per node in SQLite, and drift: a node measured worse than its own recent past.

What is stored is what was judged: each check's value with its name and scope. A check scoped to a GPU,
a link or a node belongs to that node; a cluster check (a collective) belongs to the set of nodes that
ran it ("n1+n2"). A run's drift checks compare each judged value with the median of the same check on the
same node(s), same profile, over the last `history.window` runs that did not end in ERROR: worse by more
than `history.tolerance_pct` is a WARN (a FAIL where `history.fail` is set) named `drift.<check>`.
Which checks are kept, and whether worse means lower or higher, comes from the judged metric's
declaration (gpuval.metrics): a check of an undeclared or uncompared metric is not kept.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuval import metrics
from gpuval.errors import UsageError
from gpuval.results import Check, Result, Status, node_of

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    started_at TEXT NOT NULL,
    profile TEXT NOT NULL,
    verdict TEXT NOT NULL,
    nodes TEXT NOT NULL,
    gpuval_version TEXT NOT NULL,
    command TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS values_ (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    node TEXT NOT NULL,
    name TEXT NOT NULL,
    scope TEXT NOT NULL,
    value REAL NOT NULL,
    unit TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS values_by_check ON values_(node, name, scope);
"""
OFF = "none"


def history_path_from(option: str | None) -> Path | None:
    """--history, else GPUVAL_HISTORY, else $XDG_DATA_HOME/gpuval/history.sqlite; 'none' turns it off."""
    chosen = option or os.environ.get("GPUVAL_HISTORY")
    if chosen:
        return None if chosen == OFF else Path(chosen)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpuval" / "history.sqlite"


def _connect(path: Path) -> sqlite3.Connection:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(path, timeout=30)
        connection.executescript(SCHEMA)
    except (OSError, sqlite3.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(f"history database {path}: {reason}: pass --history PATH (or none)") from None
    return connection


def open_history(path: Path) -> None:
    """Create the database (and its folder) if needed, and prove a run can be recorded there: a row is
    written and rolled back, so a read-only file, a folder where SQLite cannot create its journal, or a
    file that is not SQLite is a UsageError naming the path before any work, not a traceback after it."""
    with closing(_connect(path)) as db:
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT INTO runs (started_at, profile, verdict, nodes, gpuval_version, command) "
                "VALUES ('', '', '', '', '', '')"
            )
            db.rollback()
        except sqlite3.Error as exc:
            raise UsageError(f"history database {path}: {exc}: pass --history PATH (or none)") from None


def _owner(scope: str, group: str) -> str:
    """The node a check belongs to: 'gpu:n1/3' -> 'n1', 'cluster' -> the run's node group."""
    return node_of(scope) or group


def _amount(value: float, unit: str) -> str:
    return f"{value:.4g} {unit}".strip()


def _group(result: Result) -> str:
    names = sorted(str(node.get("node")) for node in result.inventory.get("nodes", []) if node.get("node"))
    return "+".join(names) or "unknown"


def _judged(result: Result) -> list[Check]:
    """Checks worth a trend: a number, and a direction that says which way is worse."""
    return [
        c
        for c in result.checks
        if c.value is not None and not c.name.startswith("drift.") and _direction(c.name) != 0
    ]


def _direction(check_name: str) -> int:
    """+1 when a higher value of the metric this check judges is better, -1 when lower, 0: not kept."""
    judged = metrics.of_check(check_name)
    return judged.direction if judged else 0


def drift_checks(path: Path, result: Result, settings: Any) -> list[Check]:
    """This run's checks against the node's own recent past (empty on a node with no past)."""
    if not path.exists():
        return []
    group = _group(result)
    checks = []
    with closing(_connect(path)) as db:
        for check in _judged(result):
            node = _owner(check.scope, group)
            rows = db.execute(
                "SELECT v.value FROM values_ v JOIN runs r ON r.id = v.run_id "
                "WHERE v.node = ? AND v.name = ? AND v.scope = ? AND r.profile = ? AND r.verdict != 'ERROR' "
                "ORDER BY r.started_at DESC, r.id DESC LIMIT ?",
                (node, check.name, check.scope, result.profile, settings.window),
            ).fetchall()
            if len(rows) < settings.min_runs:
                continue
            median = statistics.median(value for (value,) in rows)
            if median == 0:
                continue
            sign = _direction(check.name)  # +1: higher is better
            worse_pct = (check.value - median) / abs(median) * 100 * -sign
            if worse_pct <= settings.tolerance_pct:
                continue
            edge = median * (1 - sign * settings.tolerance_pct / 100)
            checks.append(
                Check(
                    name=f"drift.{check.name}",
                    status=Status.FAIL if settings.fail else Status.WARN,
                    value=check.value,
                    threshold={"min" if sign > 0 else "max": edge, "median": median, "runs": len(rows)},
                    unit=check.unit,
                    scope=check.scope,
                    detail=(
                        f"{_amount(check.value, check.unit)} is {worse_pct:.1f}% worse than this node's "
                        f"median {median:.4g} over its last {len(rows)} run(s) (tolerance "
                        f"{settings.tolerance_pct:g}%): see `gpuval history --node {node}` and what changed "
                        "(driver, clocks, cooling, firmware)"
                    ),
                )
            )
    return checks


def record(path: Path, result: Result) -> int:
    """Store the run and its judged values; returns the run's id."""
    import json

    group = _group(result)
    with closing(_connect(path)) as db, db:
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
            "INSERT INTO values_ (run_id, node, name, scope, value, unit) VALUES (?,?,?,?,?,?)",
            [
                (run_id, _owner(c.scope, group), c.name, c.scope, float(c.value or 0.0), c.unit)
                for c in _judged(result)
            ],
        )
    return run_id


def runs(path: Path, node: str | None = None, last: int = 20) -> list[dict[str, Any]]:
    """The latest runs (newest first), of one node (or node group containing it) when `node` is given."""
    if not path.exists():
        raise UsageError(f"no history at {path}: gpuval accept records there (or pass --history PATH)")
    with closing(_connect(path)) as db:
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
    """Per check on `node`: its values over the last runs (oldest first), their median, latest vs median."""
    with closing(_connect(path)) as db:
        rows = db.execute(
            "SELECT v.name, v.scope, v.value, v.unit FROM values_ v JOIN runs r ON r.id = v.run_id "
            "WHERE v.node = ? OR r.nodes = ? ORDER BY r.started_at, r.id",
            (node, node),
        ).fetchall()
    series: dict[tuple[str, str], list[float]] = {}
    units: dict[tuple[str, str], str] = {}
    for name, scope, value, unit in rows:
        series.setdefault((name, scope), []).append(value)
        units[(name, scope)] = unit
    out = []
    for (name, scope), values in sorted(series.items()):
        recent = values[-last:]
        median = statistics.median(recent)
        out.append(
            {
                "name": name,
                "scope": scope,
                "unit": units[(name, scope)],
                "values": recent,
                "median": median,
                "latest_vs_median_pct": (recent[-1] - median) / abs(median) * 100 if median else None,
            }
        )
    return out

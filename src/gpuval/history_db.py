"""The history database file of gpuval.history: opened, brought to gpuval's schema, and held to it.

A file gpuval did not write is bad input, never a crash: another program's SQLite database, one whose
tables lost a column, declare other types or miss under a `user_version` that says they are there, one
holding NULLs or text where gpuval writes numbers, one with corrupt pages. Each is a UsageError (exit 2)
naming the file and what to do. What gpuval writes is the CREATE TABLE statements below: the file's
tables are compared with what SQLite makes of exactly those (no second copy of the schema to drift), and
every row read is checked against the column's declared type, since SQLite stores text in a REAL column.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from typing import Any

from gpuval.atomic import folders_undone_on_failure
from gpuval.errors import UsageError

# PRAGMA user_version. 1 (a file from before versions: user_version 0): values keyed by node and scope;
# 2: values_.gpu_uuid added, NULL on every older row (those stay keyed by node and scope).
SCHEMA_VERSION = 2
TABLES = (
    """CREATE TABLE IF NOT EXISTS runs (
        id INTEGER PRIMARY KEY,
        started_at TEXT NOT NULL,
        profile TEXT NOT NULL,
        verdict TEXT NOT NULL,
        nodes TEXT NOT NULL,
        gpuval_version TEXT NOT NULL,
        command TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS values_ (
        run_id INTEGER NOT NULL REFERENCES runs(id),
        node TEXT NOT NULL,
        name TEXT NOT NULL,
        scope TEXT NOT NULL,
        value REAL NOT NULL,
        unit TEXT NOT NULL,
        gpu_uuid TEXT
    )""",
)
INDEXES = (
    "CREATE INDEX IF NOT EXISTS values_by_check ON values_(node, name, scope)",
    "CREATE INDEX IF NOT EXISTS values_by_gpu ON values_(gpu_uuid, name)",
)
# what SQLite's typeof() may say of a value in a column of each declared type (a REAL column keeps an
# integer as REAL, but a value written through another program's column may have stayed an integer)
_STORED = {"INTEGER": ("integer",), "TEXT": ("text",), "REAL": ("real", "integer")}
_TYPEOF = {int: "integer", float: "real", str: "text", bytes: "blob", type(None): "null"}
Column = tuple[str, bool, bool]  # declared type, NOT NULL, primary key


def _refused(path: Path, reason: str) -> UsageError:
    """The file cannot be used as a history (SQLite's reason, or the OS's)."""
    return UsageError(f"history database {path}: {reason}: pass --history PATH (or none)")


def _foreign(path: Path, what: str) -> UsageError:
    """The file holds something gpuval never writes there."""
    return UsageError(
        f"history database {path} is not one gpuval wrote ({what}): move it aside (gpuval accept then "
        "starts a new one there) or pass --history PATH (or none)"
    )


def _columns(db: sqlite3.Connection, table: str) -> dict[str, Column]:
    return {
        name: (kind.upper(), bool(notnull), bool(pk))
        for _, name, kind, notnull, _, pk in db.execute(f"PRAGMA table_info({table})")
    }


@functools.cache
def _declared() -> dict[str, dict[str, Column]]:
    """Each table's columns as SQLite reads gpuval's own CREATE TABLE statements."""
    with closing(sqlite3.connect(":memory:")) as db:
        for statement in TABLES:
            db.execute(statement)
        return {table: _columns(db, table) for table in ("runs", "values_")}


def _spelled(column: Column) -> str:
    kind, notnull, pk = column
    return " ".join([kind or "untyped", *["NOT NULL"] * notnull, *["PRIMARY KEY"] * pk])


def _check_tables(db: sqlite3.Connection, path: Path) -> None:
    """The file's tables are gpuval's, column for column, and there is no other."""
    found = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    others = sorted(name for name in found - set(_declared()) if not name.startswith("sqlite_"))
    if others:
        raise _foreign(path, f"it holds tables gpuval never writes: {', '.join(others)[:200]}")
    for table, declared in _declared().items():
        columns = _columns(db, table)
        if not columns:
            raise _foreign(path, f"it has no table {table}")
        for name, column in declared.items():
            if name not in columns:
                raise _foreign(path, f"table {table} has no column {name}")
            if columns[name] != column:
                shown = f"{_spelled(columns[name])}, where gpuval's is {_spelled(column)}"
                raise _foreign(path, f"column {table}.{name} is {shown}")
        extra = sorted(set(columns) - set(declared))
        if extra:
            raise _foreign(path, f"table {table} has columns gpuval never writes: {', '.join(extra)[:200]}")


def _allowed(column: Column) -> tuple[str, ...]:
    kind, notnull, _ = column
    return _STORED[kind] + (() if notnull else ("null",))


def as_written(path: Path, table: str, names: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[Any]:
    """`rows` (of the columns `names` of `table`) as read, each value of the type gpuval writes there."""
    declared, checked = _declared()[table], []
    for row in rows:
        for name, value in zip(names, row, strict=True):
            stored = _TYPEOF[type(value)]
            if stored not in _allowed(declared[name]):
                where = f"{table}.{name} holds {stored.upper()}"
                raise _foreign(path, f"{where}, where gpuval writes {_spelled(declared[name])}")
        checked.append(row)
    return checked


def check_every_row(db: sqlite3.Connection, path: Path) -> None:
    """Every page readable and every row of the types gpuval writes, in one pass of SQLite over the file
    (a million rows take about a second): the first row that is not is named as as_written names it."""
    problems = [line for (line,) in db.execute("PRAGMA quick_check(1)") if line != "ok"]
    if problems:  # the first line of SQLite's report, which names the database ("*** in database main ***")
        found = " ".join(problems[0].replace("*** in database main ***", "").split())[:200]
        raise _refused(path, f"its pages are damaged (SQLite's integrity check: {found})")
    for table, declared in _declared().items():
        names = list(declared)
        fits = " AND ".join(
            f"typeof({name}) IN ({', '.join(repr(kind) for kind in _allowed(declared[name]))})"
            for name in names
        )
        first = db.execute(f"SELECT {', '.join(names)} FROM {table} WHERE NOT ({fits}) LIMIT 1").fetchall()
        as_written(path, table, names, first)


def _version(db: sqlite3.Connection, path: Path) -> int:
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise UsageError(
            f"history database {path} has schema {version}, newer than this gpuval's {SCHEMA_VERSION}: "
            "upgrade gpuval or pass --history PATH"
        )
    if version < 0:
        raise _foreign(path, f"its schema version is {version}")
    return version


def _migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the database to SCHEMA_VERSION in one transaction, keeping every row: create what is
    missing, and give a schema-1 file its gpu_uuid column (NULL: its rows stay keyed by node and scope).
    A file whose tables are not gpuval's is refused and left as it was (the transaction rolls back)."""
    if _version(db, path) == SCHEMA_VERSION:
        _check_tables(db, path)
        return
    db.execute("BEGIN IMMEDIATE")  # one writer migrates; another waits, then finds it done
    try:
        if _version(db, path) < SCHEMA_VERSION:
            for statement in TABLES:
                db.execute(statement)
            if "gpu_uuid" not in _columns(db, "values_"):
                db.execute("ALTER TABLE values_ ADD COLUMN gpu_uuid TEXT")
            _check_tables(db, path)  # before the indexes, which name gpuval's columns
            for statement in INDEXES:
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        else:  # another process migrated it meanwhile
            _check_tables(db, path)
        db.commit()
    except BaseException:
        db.rollback()
        raise


# What a file that is not a sound gpuval database raises while it is read: SQLite's errors, and text that
# is not UTF-8 (garbled bytes in a name or value: gpuval writes UTF-8 only)
_FILE_ERRORS = (sqlite3.Error, UnicodeDecodeError)


def _reason(exc: Exception) -> str:
    return "it holds text that is not UTF-8" if isinstance(exc, UnicodeDecodeError) else str(exc)


def connect(path: Path) -> sqlite3.Connection:
    """The database at `path` (made, with its folder, when missing), at gpuval's schema."""
    try:
        with folders_undone_on_failure(path.parent):  # a refused path leaves no folder behind
            path.parent.mkdir(parents=True, exist_ok=True)
            with suppress(FileNotFoundError):  # sqlite says only "unable to open": the OS says why
                path.stat()
            connection = sqlite3.connect(path, timeout=30)
    except (OSError, sqlite3.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise _refused(path, reason) from None
    try:
        _migrate(connection, path)
    except _FILE_ERRORS as exc:
        connection.close()
        raise _refused(path, _reason(exc)) from None
    except BaseException:
        connection.close()
        raise
    return connection


@contextmanager
def reading(path: Path) -> Iterator[sqlite3.Connection]:
    """connect(path), closed after the block; an SQLite error inside it (a corrupt page met while reading)
    is the file's, a UsageError naming it."""
    with closing(connect(path)) as db:
        try:
            yield db
        except _FILE_ERRORS as exc:
            raise _refused(path, _reason(exc)) from None

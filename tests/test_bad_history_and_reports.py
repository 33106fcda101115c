"""History databases gpuval did not write, and result documents built to be slow or to break markup (issue
50).

A history file with a table dropped or retyped, NULLs or text where gpuval writes numbers, another
program's tables, cut or garbled bytes: `gpuval history` and every reader end in one `gpuval:` line naming
the file (exit 2, a UsageError in this process), never "internal error"; `accept --history` refuses it
before any work. Schema-valid results holding long or markup-laden text, hundreds of soak series, many
nodes' P2P pairs or thousands of GPUs: `report` and `compare` finish in seconds, show text escaped and cut,
and say what they left out. Most cases run in this process; a few run as child processes, as users run
gpuval.
"""

from __future__ import annotations

import copy
import functools
import io
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_env, ends_within
from test_fuzz_inputs import _base_result, assert_clean, invoke

import gpuval.launch as launch
from gpuval.accept import with_drift
from gpuval.config import HistorySettings
from gpuval.errors import UsageError
from gpuval.history import drift_checks, open_history, record, recorded_runs, runs, trends
from gpuval.report.limits import MAX_DETAIL, MAX_MATRICES, MAX_ROWS
from gpuval.results import Check, Result, Status, World

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SETTINGS = settings(
    deadline=None,
    database=None,  # no .hypothesis/ folder left behind
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
UUID = "GPU-aaaaaaaa-1111-2222-3333-444444444444"


# --- history databases gpuval did not write --------------------------------------------------------------


def _run(started: str, unit: str = "TFLOP/s") -> Result:
    """An accept run of node n1: a GPU's check (kept with its UUID) and a cluster check."""
    return Result(
        verdict=Status.PASS,
        started_at=started,
        duration_s=1.0,
        profile="h200-sxm",
        world=World(size=1, nodes=1, backend="nccl"),
        inventory={"nodes": [{"node": "n1", "gpus": [{"index": 0, "uuid": UUID}]}]},
        checks=[
            Check(name="matmul.bf16_tflops", status=Status.PASS, value=700.0, unit=unit, scope="gpu:n1/0"),
            Check(
                name="all_reduce.busbw_gbps", status=Status.PASS, value=350.0, unit="GB/s", scope="cluster"
            ),
        ],
    )


@functools.cache
def _good_history() -> bytes:
    """The bytes of a history gpuval wrote: two runs of n1."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "history.sqlite"
        for day in (1, 2):
            record(path, _run(f"2026-11-0{day}T00:00:00+00:00"))
        return path.read_bytes()


def _columns(db: sqlite3.Connection, table: str) -> list[tuple[str, str, bool, bool]]:
    return [(name, kind, bool(notnull), bool(pk)) for _, name, kind, notnull, _, pk in db.execute(
        f"PRAGMA table_info({table})")]  # fmt: skip


def _rebuilt(
    db: sqlite3.Connection, table: str, change: Callable[[str, str, bool], tuple[str, bool]]
) -> None:
    """`table` made again with each column's (type, NOT NULL) as `change` gives it, its rows kept."""
    parts = []
    for name, kind, notnull, pk in _columns(db, table):
        kind, notnull = change(name, kind, notnull)
        parts.append(f"{name} {kind}" + (" PRIMARY KEY" if pk else "") + (" NOT NULL" if notnull else ""))
    db.executescript(
        f"ALTER TABLE {table} RENAME TO old_{table}; CREATE TABLE {table} ({', '.join(parts)}); "
        f"INSERT INTO {table} SELECT * FROM old_{table}; DROP TABLE old_{table};"
    )


TABLE_COLUMNS = {
    "runs": ("started_at", "profile", "verdict", "nodes", "gpuval_version", "command"),
    "values_": ("run_id", "node", "name", "scope", "value", "unit"),
}
# a value SQLite keeps as it is in a column of each declared type (a TEXT column makes 42 the text '42')
WRONG_VALUES = {"TEXT": [b"\x00\xff"], "REAL": ["fast", b"\x00"], "INTEGER": ["abc", 2.5, b"\x01"]}
KINDS = ["drop", "retype", "null", "wrong-value", "other-table", "negative-version", "text", "cut", "garble"]
STRUCTURAL = set(KINDS[:7])  # gpuval never writes these: refused; a cut or garbled file may still read


def _declared_type(table: str, column: str) -> str:
    from gpuval.history_db import TABLES

    with closing(sqlite3.connect(":memory:")) as db:
        for statement in TABLES:
            db.execute(statement)
        return {name: kind for name, kind, _, _ in _columns(db, table)}[column]


@st.composite
def broken_histories(draw: Any) -> tuple[str, Callable[[Path], None]]:
    """(kind, a change that breaks a good history file in place)."""
    kind = draw(st.sampled_from(KINDS))
    table = draw(st.sampled_from(sorted(TABLE_COLUMNS)))
    column = draw(st.sampled_from(TABLE_COLUMNS[table]))
    declared = _declared_type(table, column)
    retyped = draw(
        st.sampled_from([t for t in ("TEXT", "REAL", "INTEGER", "BLOB", "NUMERIC", "") if t != declared])
    )
    wrong = draw(st.sampled_from(WRONG_VALUES[declared]))
    other = draw(st.text(alphabet="abcdefxyz_", min_size=1, max_size=8))
    version = draw(st.integers(min_value=-(2**31), max_value=-1))
    at = draw(st.floats(min_value=0.0, max_value=0.999))
    noise = draw(st.binary(min_size=1, max_size=600))

    def change(path: Path) -> None:
        data = bytearray(path.read_bytes())
        if kind == "cut":
            path.write_bytes(data[: int(len(data) * at)])
        elif kind == "garble":  # past the 100-byte header: pages SQLite finds broken, or data it reads
            start = 100 + int((len(data) - 100) * at)
            data[start : start + len(noise)] = noise
            path.write_bytes(data)
        elif kind == "text":
            path.write_bytes(b"runs: 3\n" + noise)
        else:
            with closing(sqlite3.connect(path)) as db:
                if kind == "drop":
                    db.execute(f"DROP TABLE {table}")
                elif kind == "retype":
                    _rebuilt(
                        db, table, lambda name, was, notnull: (retyped if name == column else was, notnull)
                    )
                elif kind == "null":
                    _rebuilt(db, table, lambda name, was, notnull: (was, notnull and name != column))
                    db.execute(f"UPDATE {table} SET {column} = NULL")
                elif kind == "wrong-value":
                    db.execute(f"UPDATE {table} SET {column} = ?", (wrong,))
                elif kind == "other-table":
                    db.execute(f"CREATE TABLE t_{other} (x)")
                else:
                    db.execute(f"PRAGMA user_version = {version}")
                db.commit()

    return kind, change


def _broken_copy(folder: Path, change: Callable[[Path], None]) -> Path:
    path = Path(tempfile.mkdtemp(dir=folder)) / "history.sqlite"
    path.write_bytes(_good_history())
    change(path)
    return path


def _refused_or_read(path: Path, work: Callable[[], Any]) -> bool:
    """Whether `work` refused the file: in one line naming it, never as an internal error (any other
    exception fails the test)."""
    try:
        work()
    except UsageError as exc:
        message = str(exc)
        assert str(path) in message and "\n" not in message, message
        return True
    return False


@settings(SETTINGS, max_examples=40)
@given(broken=broken_histories())
def test_a_history_gpuval_did_not_write_is_refused_in_one_line(broken, tmp_path):
    kind, change = broken
    path = _broken_copy(tmp_path, change)
    later = _run("2026-11-03T00:00:00+00:00")
    for work in (
        lambda: trends(path, "n1"),
        lambda: drift_checks(path, later, HistorySettings(min_runs=1)),
        lambda: recorded_runs(path, later),
    ):
        _refused_or_read(path, work)
    for whole_file in (lambda: runs(path), lambda: open_history(path)):  # `history`'s and accept's gates
        assert _refused_or_read(path, whole_file) or kind not in STRUCTURAL, kind


@settings(SETTINGS, max_examples=15)
@given(broken=broken_histories())
def test_the_history_command_says_one_line_and_exits_2(broken, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    kind, change = broken
    path = _broken_copy(tmp_path, change)
    code = assert_clean(invoke(["history", "--history", str(path)], tmp_path), {0, 2}, kind)
    assert code == 2 or kind not in STRUCTURAL, kind


@pytest.mark.parametrize("where", ["SELECT", "TABLE"])
def test_text_that_is_not_utf8_is_refused_naming_the_file(tmp_path, where):
    """Garbled bytes where SQLite keeps text (a value, a table's name): found by the property above as an
    internal UnicodeDecodeError; gpuval writes UTF-8 only, so the file is not one it wrote."""
    path = tmp_path / "history.sqlite"
    record(path, _run("2026-11-01T00:00:00+00:00"))
    with closing(sqlite3.connect(path)) as db:
        if where == "SELECT":
            db.execute("UPDATE values_ SET unit = CAST(x'80ff' AS TEXT)")
        else:
            db.execute("CREATE TABLE t (a)")
            db.execute("PRAGMA writable_schema = ON")
            db.execute("UPDATE sqlite_master SET name = CAST(x'74ff' AS TEXT) WHERE name = 't'")
        db.commit()
    # a garbled value is met where it is read (the trends read units; the list of runs does not)
    for work in (lambda: trends(path, "n1"), *((lambda: runs(path),) if where == "TABLE" else ())):
        with pytest.raises(UsageError, match=f"{re.escape(str(path))}.*(UTF-8|not one gpuval wrote)"):
            work()


def test_a_unit_holding_markup_is_shown_as_text(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_path / "history.sqlite"
    record(path, _run("2026-11-01T00:00:00+00:00", unit="[/]"))
    code, out, err = invoke(["history", "--history", str(path)], tmp_path)
    assert code == 0 and "[/]" in out, err


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """accept up to its work (its gates), with no rank started."""
    monkeypatch.setattr(launch, "run_distributed", lambda *args, **kwargs: 0)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)


@pytest.mark.parametrize("statement", ["DROP TABLE values_", "UPDATE values_ SET value = 'fast'"])
def test_accept_refuses_a_bad_history_before_any_work(statement, tmp_path, no_work):
    path = tmp_path / "history.sqlite"
    path.write_bytes(_good_history())
    with closing(sqlite3.connect(path)) as db:
        db.execute(statement)
        db.commit()
    out = tmp_path / "out"
    result = invoke(["accept", "--profile", "cpu", "--history", str(path), "--output", str(out)], tmp_path)
    assert_clean(result, {2}, statement, out)
    assert f"history database {path} is not one gpuval wrote" in result[2]


def test_a_history_that_goes_bad_during_the_run_is_an_error_check_not_a_crash(tmp_path):
    path = tmp_path / "history.sqlite"
    path.write_bytes(_good_history())
    with closing(sqlite3.connect(path)) as db:
        db.execute("DROP TABLE runs")
        db.commit()
    judged = with_drift(_run("2026-11-03T00:00:00+00:00"), path, HistorySettings(min_runs=1))
    [drift] = [check for check in judged.checks if check.name == "drift"]
    assert drift.status is Status.ERROR and "has no table runs" in drift.detail
    assert judged.verdict is Status.ERROR  # the run could not be judged in full: never a PASS


# --- result documents built to be slow or to break markup -------------------------------------------------

MARKUP = ["[/]", "[bold]x[/bold]", "[red", "<script>alert(1)</script>", "\x1b[31m", "&amp;", "]"]


@st.composite
def long_texts(draw: Any) -> str:
    """Text of any length up to 400,000 characters, holding rich markup and HTML."""
    piece = draw(st.sampled_from(MARKUP)) + draw(st.text(alphabet="ab ", max_size=5))
    return piece * draw(st.sampled_from([1, 3, 60, 5_000, 40_000]))


def _document(text: str, places: list[str]) -> dict[str, Any]:
    """The fuzzing base result with `text` in each of `places`."""
    document = _base_result()
    gpu = document["measurements"][1]
    document["inventory"]["nodes"][0]["gpus"][0]["name"] = text if "gpu name" in places else "H100"
    edits = {
        "profile": lambda: document.update(profile=text),
        "command": lambda: document.update(command=["gpuval", text]),
        "check name": lambda: document["checks"][1].update(name=text),
        "check scope": lambda: document["checks"][0].update(scope=text),
        "detail": lambda: document["checks"][1].update(detail=text),
        "unit": lambda: document["checks"][0].update(unit=text),
        "evidence": lambda: document["checks"][0]["threshold"].update(evidence=text, source=text),
        "measurement scope": lambda: gpu.update(scope=text),
        "node": lambda: document["inventory"]["nodes"][0].update(node=text),
        "gpu name": lambda: None,
        "identity": lambda: document["measurements"][0]["params"].update(dtype=text),
    }
    for place in places:
        edits[place]()
    return document


PLACES = ["profile", "command", "check name", "check scope", "detail", "unit", "evidence",
          "measurement scope", "node", "gpu name", "identity"]  # fmt: skip


def _compared(before: Result, after: Result, width: int = 80) -> str:
    from rich.console import Console

    from gpuval.report.compare import compare, summarize
    from gpuval.report.console import print_comparison

    rows, unmatched = compare(before, after)
    console = Console(file=io.StringIO(), width=width, color_system=None)
    print_comparison(rows, unmatched, "a.json", "b.json", console, summaries=summarize(rows, 0.0))
    return console.file.getvalue()


@settings(SETTINGS, max_examples=25)
@given(text=long_texts(), places=st.lists(st.sampled_from(PLACES), min_size=1, max_size=4, unique=True))
def test_long_and_markup_text_is_escaped_and_cut(text, places):
    from gpuval.report.html import render_html

    document = _document(text, places)
    result = Result.model_validate(document)
    later = copy.deepcopy(document)
    later["measurements"][0]["metrics"]["busbw_gbps"] = 9.0
    with ends_within(30):
        page = render_html(result)
        shown = _compared(result, Result.model_validate(later))
    assert "<script>" not in page  # HTML escaped
    # cut: no value is shown whole past what a cell holds; the page stays the size of an ordinary one
    assert len(page) < 400_000, (places, len(text), len(page))
    assert len(shown) < 20_000, (places, len(text), len(shown))
    if len(text) > MAX_DETAIL:
        assert text not in page and text not in shown
    if "identity" in places and "[/]" in text:  # rich markup printed as the text it is
        assert "[/]" in shown


def _many(soak_series: int, p2p_nodes: int, gpus: int, rows: int) -> dict[str, Any]:
    """A schema-valid result with `soak_series` judged soak series, `p2p_nodes` nodes' P2P pairs (8 GPUs
    each), `gpus` GPUs' HBM bandwidth and `rows` failing checks."""
    document = _base_result()
    document["measurements"] += [
        {"name": "p2p", "scope": f"link:n{node}/gpu{a}-gpu{b}", "params": {"src": a, "dst": b},
         "metrics": {"copy_gbps": 300.0 + node + a * b}}
        for node in range(p2p_nodes) for a in range(8) for b in range(8) if a != b
    ] + [
        {"name": "membw", "scope": f"gpu:n{gpu // 8}/{gpu % 8}", "params": {},
         "metrics": {"copy_tbps": 3.0 + gpu % 7 / 100}}
        for gpu in range(gpus)
    ]  # fmt: skip
    document["checks"] += [
        {"name": "membw.copy_tbps", "status": "FAIL", "value": 1.0, "unit": "TB/s", "scope": f"gpu:n{k}/0",
         "threshold": {"min": 2.0}, "detail": "slow"}
        for k in range(rows)
    ]  # fmt: skip
    if soak_series:
        document["inventory"]["soak"] = {
            "completed": 10, "first_failing_iteration": 3, "tolerance_pct": 5.0,
            "iterations": [{"iteration": k, "verdict": "PASS", "problems": []} for k in range(1, 11)],
            "series": [
                {"kind": "metric" if k % 3 else "counter", "name": f"check{k % 40}", "scope": f"gpu:n{k}/0",
                 "unit": "x", "values": [float(k + i) for i in range(10)], "edge": 1.0,
                 "status": "FAIL" if k % 9 == 0 else "PASS", "first_bad": 3 if k % 9 == 0 else None}
                for k in range(soak_series)
            ],
        }  # fmt: skip
    return document


@settings(SETTINGS, max_examples=6)
@given(
    soak_series=st.sampled_from([0, 5, 600]),
    p2p_nodes=st.sampled_from([0, 3, 150]),
    gpus=st.sampled_from([0, 8, 2000]),
    rows=st.sampled_from([0, 10, 3000]),
)
def test_many_series_nodes_and_gpus_render_in_seconds_and_say_what_they_left_out(
    soak_series, p2p_nodes, gpus, rows
):
    from gpuval.report.html import render_html

    result = Result.model_validate(_many(soak_series, p2p_nodes, gpus, rows))
    with ends_within(40):  # seconds on a loaded 2-core machine; each took over a minute before
        page = render_html(result)
        shown = _compared(result, result)
    if p2p_nodes > MAX_MATRICES:
        assert f"The {MAX_MATRICES} nodes with the weakest link, of {p2p_nodes}" in page
    if soak_series > 100:
        assert "series not shown: result.json has every one" in page
    if rows + len(result.checks) > MAX_ROWS:
        assert "checks not shown: result.json lists every one" in page
    if len(result.measurements) > MAX_ROWS:
        assert "measurements not shown: gpuval compare --json lists every one" in shown


# --- child processes: as a user runs gpuval --------------------------------------------------------------


def _child(args: list[str], cwd: Path) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "gpuval", *args], cwd=cwd, env=cli_env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def test_child_process_history_not_gpuvals_is_one_line(tmp_path):
    path = tmp_path / "history.sqlite"
    path.write_bytes(_good_history())
    with closing(sqlite3.connect(path)) as db:
        db.execute("DROP TABLE runs")
        db.commit()
    result = _child(["history", "--history", str(path)], tmp_path)
    assert_clean(result, {2}, "dropped runs")
    assert result[2].startswith(
        f"gpuval: history database {path} is not one gpuval wrote (it has no table runs)"
    )


def test_child_process_report_and_compare_of_a_5_mb_scope(tmp_path):
    document = _document("[/]" + "x" * (5 * 2**20), ["check scope", "measurement scope", "profile"])
    source, later = tmp_path / "result.json", tmp_path / "later.json"
    source.write_text(json.dumps(document))
    shutil.copy(source, later)
    code, out, err = _child(["report", str(source), "--output", str(tmp_path / "page.html")], tmp_path)
    assert code == 0 and err == "", err
    assert (tmp_path / "page.html").stat().st_size < 400_000
    code, out, err = _child(["compare", str(source), str(later)], tmp_path)
    assert code == 0 and err == "" and len(out) < 20_000, err


def test_a_regression_named_by_a_long_scope_with_a_newline_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    document = _document("gpu:n1/0\n[/]" + "x" * 100_000, ["measurement scope"])
    before, after = tmp_path / "a.json", tmp_path / "b.json"
    before.write_text(json.dumps(document))
    document["measurements"][1]["metrics"]["copy_tbps"] = 1.0  # HBM bandwidth fell by two thirds
    after.write_text(json.dumps(document))
    code, out, err = invoke(["compare", str(before), str(after), "--fail-on-regression", "5"], tmp_path)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "regressed more than 5 %" in err and len(err) < 400, err

"""History in SQLite and drift: a node judged against the median of its own last runs, a GPU against its
own by UUID wherever it sits; and a history file of the older schema migrated."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

import pytest
from conftest import cli_env

from gpuval.config import HistorySettings
from gpuval.errors import UsageError
from gpuval.history import drift_checks, record, runs, trends
from gpuval.results import Check, Result, Status, World, load_result


def _ok(name: str, value: float, unit: str, scope: str) -> Check:
    return Check(name=name, status=Status.PASS, value=value, unit=unit, scope=scope)


# Drift judged from one past run: what the tests of direction, window and GPU keying need. A profile asks
# for five by default (test_drift_waits_for_enough_past_runs_and_says_so).
FROM_ONE_RUN = HistorySettings(min_runs=1)


def _run(
    started: str,
    bf16: float,
    gap_pct: float,
    busbw: float,
    verdict=Status.PASS,
    profile="h200-sxm",
    step_ms: float = 100.0,
):
    return Result(
        verdict=verdict,
        started_at=started,
        duration_s=1.0,
        profile=profile,
        world=World(size=2, nodes=1, backend="nccl"),
        inventory={"nodes": [{"node": "n1"}]},
        checks=[
            Check(
                name="matmul.bf16_tflops", status=Status.PASS, value=bf16, unit="TFLOP/s", scope="gpu:n1/0"
            ),
            _ok("outliers.matmul_pct", gap_pct, "%", "gpu:n1/0"),
            _ok("train.step_ms", step_ms, "ms", "cluster"),  # lower is better
            Check(
                name="all_reduce.busbw_gbps", status=Status.PASS, value=busbw, unit="GB/s", scope="cluster"
            ),
            Check(name="expect.gpu_count", status=Status.PASS, value=2, scope="node:n1"),  # no direction
        ],
    )


def _by_name(checks):
    return {c.name: c for c in checks}


def test_a_degraded_run_warns_against_the_median_of_the_past_ones(tmp_path):
    db = tmp_path / "history.sqlite"
    for day, bf16 in ((1, 700.0), (2, 690.0), (3, 710.0), (4, 705.0), (5, 695.0)):
        record(db, _run(f"2026-11-0{day}T00:00:00+00:00", bf16, gap_pct=2.0, busbw=350.0))
    # median 700; 600 is (600 - 700) / 700 = 14.3% worse; busbw 340 is 2.9% worse: within 10%
    degraded = _run("2026-11-06T00:00:00+00:00", 600.0, gap_pct=2.1, busbw=340.0)
    drift = _by_name(drift_checks(db, degraded, HistorySettings()))
    assert set(drift) == {"drift.matmul.bf16_tflops"}
    check = drift["drift.matmul.bf16_tflops"]
    assert check.status is Status.WARN and check.scope == "gpu:n1/0" and check.value == 600.0
    assert check.threshold == {"min": pytest.approx(630.0), "median": 700.0, "runs": 5}  # 700 * (1 - 0.10)
    assert (
        "600 TFLOP/s is 14.3% worse than this node's median 700 TFLOP/s over its last 5 runs" in check.detail
    )
    assert "gpuval history --node n1" in check.detail


def test_lower_is_better_metrics_drift_upwards_and_settings_apply(tmp_path):
    db = tmp_path / "history.sqlite"
    record(db, _run("2026-11-01T00:00:00+00:00", 700.0, gap_pct=2.0, busbw=350.0, step_ms=100.0))
    slower = _run("2026-11-02T00:00:00+00:00", 700.0, gap_pct=2.0, busbw=350.0, step_ms=200.0)  # +100%
    [check] = drift_checks(db, slower, FROM_ONE_RUN)
    assert check.name == "drift.train.step_ms" and check.threshold["max"] == pytest.approx(110.0)
    [strict] = drift_checks(db, slower, HistorySettings(min_runs=1, fail=True))
    assert strict.status is Status.FAIL
    assert drift_checks(db, slower, HistorySettings(min_runs=1, tolerance_pct=150)) == []
    [wait] = drift_checks(db, slower, HistorySettings(min_runs=2))  # one past run is too few
    assert (wait.name, wait.status) == ("drift", Status.SKIP)


def test_drift_waits_for_enough_past_runs_and_says_so_without_changing_the_verdict(tmp_path):
    """The second run of a node used to WARN against its first alone; now drift waits for five past runs
    (history.min_runs), one SKIP check says how many there are, and then it judges with rounded figures."""
    from gpuval.accept import with_drift

    db = tmp_path / "history.sqlite"
    slow = _run("2026-11-09T00:00:00+00:00", 0.0501234, gap_pct=31.44, busbw=350.0)
    record(db, _run("2026-11-01T00:00:00+00:00", 0.112834, gap_pct=1.223, busbw=350.0))
    [wait] = drift_checks(db, slow, HistorySettings())
    assert (wait.name, wait.status, wait.scope) == ("drift", Status.SKIP, "node:n1")
    assert wait.detail == (
        "drift not judged yet: 1 of the 5 past runs it needs here (history.min_runs); judged from run 6 on"
    )
    judged = with_drift(slow, db, HistorySettings())
    assert judged.verdict is Status.PASS and [c.name for c in judged.checks][-1] == "drift"
    for day in (2, 3, 4, 5):
        record(db, _run(f"2026-11-0{day}T00:00:00+00:00", 0.112834, gap_pct=1.223, busbw=350.0))
    [check] = drift_checks(db, slow, HistorySettings())  # the gap's 31.44 % is its own check's to judge
    assert check.name == "drift.matmul.bf16_tflops" and check.status is Status.WARN
    assert check.detail.startswith(
        "0.05012 TFLOP/s is 55.6% worse than this node's median 0.1128 TFLOP/s over its last 5 runs"
    )


def test_a_check_new_here_is_named_while_the_others_are_judged(tmp_path):
    db = tmp_path / "history.sqlite"
    record(db, _gpus_run(tmp_path, "2026-11-01T00:00:00+00:00", {"n1": [(0, A, 700.0)]}))
    added = _gpus_run(tmp_path, "2026-11-02T00:00:00+00:00", {"n1": [(0, A, 700.0), (1, B, 690.0)]})
    [wait] = drift_checks(db, added, FROM_ONE_RUN)
    assert wait.status is Status.SKIP and wait.detail == (
        "drift not judged for 1 of 2 checks, new here (such as matmul.bf16_tflops on gpu:n1/1): fewer than "
        "the 1 past run each needs (history.min_runs)"
    )


def test_the_outliers_gap_is_kept_for_trends_but_never_judged_for_drift(tmp_path):
    """A gap between peers near 0 % is bounded absolutely each run: from 1.2 % to 31 % read '2470 % worse'
    against the node's median, and the GPU it names changes from run to run."""
    db = tmp_path / "history.sqlite"
    for day in (1, 2, 3, 4, 5):
        record(db, _run(f"2026-11-0{day}T00:00:00+00:00", 700.0, gap_pct=1.223, busbw=350.0))
    wider_gap = _run("2026-11-06T00:00:00+00:00", 700.0, gap_pct=31.44, busbw=350.0)
    assert drift_checks(db, wider_gap, HistorySettings()) == []
    assert "outliers.matmul_pct" in {t["name"] for t in trends(db, "n1")}


def test_every_profile_judges_drift_from_enough_runs_and_min_runs_never_exceeds_the_window():
    from pydantic import ValidationError

    from gpuval.config import builtin_profiles, load_profile

    least = {name: load_profile(name).history.min_runs for name in builtin_profiles()}
    assert least == {"cpu": 10, "h100-sxm": 5, "h200-sxm": 5}
    with pytest.raises(ValidationError, match=r"min_runs \(5\) is more than window \(2\)"):
        HistorySettings(window=2)


def test_the_baseline_skips_errored_runs_other_profiles_and_older_than_the_window(tmp_path):
    db = tmp_path / "history.sqlite"
    record(db, _run("2026-11-01T00:00:00+00:00", 100.0, 2.0, 350.0))  # outside a window of 2
    record(db, _run("2026-11-02T00:00:00+00:00", 700.0, 2.0, 350.0))
    record(db, _run("2026-11-03T00:00:00+00:00", 700.0, 2.0, 350.0))
    record(db, _run("2026-11-04T00:00:00+00:00", 10.0, 2.0, 350.0, verdict=Status.ERROR))
    record(db, _run("2026-11-05T00:00:00+00:00", 10.0, 2.0, 350.0, profile="h100-sxm"))
    current = _run("2026-11-06T00:00:00+00:00", 600.0, 2.0, 350.0)
    [check] = drift_checks(db, current, HistorySettings(window=2, min_runs=2))
    assert check.threshold["median"] == 700.0 and check.threshold["runs"] == 2


def test_runs_and_trends_read_back_what_was_recorded(tmp_path):
    db = tmp_path / "history.sqlite"
    for day, bf16 in ((1, 700.0), (2, 690.0), (3, 620.0)):
        record(db, _run(f"2026-11-0{day}T00:00:00+00:00", bf16, 2.0, 350.0))
    assert [r["started_at"][:10] for r in runs(db, "n1")] == ["2026-11-03", "2026-11-02", "2026-11-01"]
    assert runs(db, "n2") == []
    bf16 = next(t for t in trends(db, "n1") if t["name"] == "matmul.bf16_tflops")
    assert bf16["values"] == [700.0, 690.0, 620.0] and bf16["median"] == 690.0
    assert bf16["latest_vs_median_pct"] == pytest.approx((620 - 690) / 690 * 100)
    names = {t["name"] for t in trends(db, "n1")}
    assert "all_reduce.busbw_gbps" in names and "expect.gpu_count" not in names  # no direction: not kept


@pytest.mark.slow
def test_two_accept_runs_one_degraded_give_the_drift_warn(tmp_path, gpuval, write_profile):
    """Real accept runs on this CPU (matmul only, to stay quick). The first run's stored values are
    multiplied by ten (a faster past), so the second, ordinary run is 90% below the node's median: beyond
    any run-to-run noise of a shared CPU and the profile's 60% tolerance."""
    from gpuval.cli.options import home_short

    profile = write_profile(
        "name: cpu-matmul\nexpect: {gpu_count: 0}\nhistory: {tolerance_pct: 60, min_runs: 1}\n"
        "checks:\n  matmul.fp32_tflops: {min: 0.001}\n"
    )
    db = tmp_path / "history.sqlite"
    common = ["accept", "--quick", "--profile", str(profile), "--history", str(db)]
    first = gpuval([*common, "--output", str(tmp_path / "a")], tmp_path)
    assert first.returncode == 0, first.stderr
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE values_ SET value = value * 10 WHERE name = 'matmul.fp32_tflops'")
    second = gpuval([*common, "--output", str(tmp_path / "b")], tmp_path)
    assert second.returncode == 0, second.stderr  # a WARN never changes the verdict
    # where the run was recorded, in the summary: a database in the home folder nobody asked for
    node = json.loads((tmp_path / "b" / "result.json").read_text())["inventory"]["nodes"][0]["node"]
    said = f"history: 2 runs of node {node} in {home_short(db)} (gpuval history)"
    assert said in " ".join(second.stdout.split()), second.stdout
    result = json.loads((tmp_path / "b" / "result.json").read_text())
    drift = [c for c in result["checks"] if c["name"] == "drift.matmul.fp32_tflops"]
    assert {c["scope"].split("/")[-1] for c in drift} == {"0", "1"}  # both ranks' CPUs
    assert all(c["status"] == "WARN" and "worse than this node's median" in c["detail"] for c in drift)
    assert result["verdict"] == "PASS"
    listed = gpuval(["history", "--history", str(db), "--json"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert [run["verdict"] for run in document["runs"]] == ["PASS", "PASS"]
    matmul = [t for t in document["trends"] if t["name"] == "matmul.fp32_tflops"]
    assert all(len(t["values"]) == 2 for t in matmul)


def test_history_command_without_a_database_is_a_one_line_error(tmp_path, gpuval):
    proc = gpuval(["history", "--history", str(tmp_path / "missing.sqlite")], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpuval: no history at {tmp_path / 'missing.sqlite'}: gpuval accept records there (or pass "
        "--history PATH)"
    ]


@pytest.mark.slow
def test_a_history_that_cannot_be_written_stops_accept_before_any_work(tmp_path, gpuval):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    out = tmp_path / "out"
    history = str(blocker / "h.sqlite")
    proc = gpuval(["accept", "--quick", "--output", str(out), "--history", history], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpuval: history database {blocker / 'h.sqlite'}: File exists: pass --history PATH (or none)"
    ]
    assert not out.exists()  # no benchmark ran, nothing half-written


# --- a GPU's history follows its UUID ---------------------------------------------------------------------

A, B, C = (f"GPU-{c * 8}-1111-2222-3333-444444444444" for c in "abc")


def _gpus_run(tmp_path, started: str, slots: dict[str, list[tuple[int, str, float]]]) -> Result:
    """An accept result.json with one matmul.bf16_tflops check per GPU, node -> [(index, uuid, value)], and
    each node's inventory listing its GPUs' index and UUID: written as a file and read back as gpuval reads
    it."""
    document = {
        "schema": "gpuval.result/v1",
        "verdict": "PASS",
        "started_at": started,
        "duration_s": 1.0,
        "profile": "h200-sxm",
        "world": {"size": sum(map(len, slots.values())), "nodes": len(slots), "backend": "nccl"},
        "inventory": {
            "nodes": [
                {"node": node, "gpus": [{"index": index, "uuid": uuid} for index, uuid, _ in gpus]}
                for node, gpus in slots.items()
            ]
        },
        "checks": [
            {
                "name": "matmul.bf16_tflops",
                "status": "PASS",
                "value": value,
                "unit": "TFLOP/s",
                "scope": f"gpu:{node}/{index}",
            }
            for node, gpus in slots.items()
            for index, _, value in gpus
        ],
    }
    path = tmp_path / f"result-{len(list(tmp_path.glob('result-*.json')))}.json"
    path.write_text(json.dumps(document))
    return load_result(path)


def test_a_gpu_keeps_its_history_when_its_index_or_node_changes(tmp_path):
    db = tmp_path / "history.sqlite"
    # A is the fast GPU, B a slower one; the first inventory spells A's UUID as torch does (no 'GPU-')
    first = _gpus_run(tmp_path, "2026-11-01T00:00:00+00:00", {"n1": [(0, A[4:], 700.0), (1, B, 600.0)]})
    record(db, first)
    # re-indexed: B is now GPU 0 and A GPU 1. By slot, GPU 0 fell from 700 to 600 (14 % worse); by UUID
    # neither GPU changed
    swapped = _gpus_run(tmp_path, "2026-11-02T00:00:00+00:00", {"n1": [(0, B, 600.0), (1, A, 700.0)]})
    assert drift_checks(db, swapped, FROM_ONE_RUN) == []
    record(db, swapped)
    # A degrades in its new slot: judged against its own 700, not slot 1's past 600
    degraded = _gpus_run(tmp_path, "2026-11-03T00:00:00+00:00", {"n1": [(0, B, 600.0), (1, A, 600.0)]})
    [check] = drift_checks(db, degraded, FROM_ONE_RUN)
    assert check.scope == "gpu:n1/1" and check.threshold["median"] == 700.0 and check.threshold["runs"] == 2
    assert "worse than this GPU's (GPU-aaaaaaaa) median 700" in check.detail
    # moved to another node, A still has its past
    moved = _gpus_run(tmp_path, "2026-11-03T00:00:00+00:00", {"n2": [(0, A, 600.0)]})
    [check] = drift_checks(db, moved, FROM_ONE_RUN)
    assert check.scope == "gpu:n2/0" and check.threshold["median"] == 700.0
    assert "gpuval history --node n2" in check.detail
    record(db, moved)
    # n1's trends: B only (A was last measured on n2); n2's: A with every value it had on n1
    assert [(t["gpu_uuid"], t["values"]) for t in trends(db, "n1")] == [(B, [600.0, 600.0])]
    [a] = trends(db, "n2")
    assert (a["gpu_uuid"], a["node"], a["scope"], a["values"]) == (A, "n2", "gpu:n2/0", [700.0, 700.0, 600.0])


def test_a_replaced_gpu_starts_a_history_of_its_own(tmp_path):
    db = tmp_path / "history.sqlite"
    record(db, _gpus_run(tmp_path, "2026-11-01T00:00:00+00:00", {"n1": [(0, A, 700.0)]}))
    # GPU 0 of n1 is now another GPU, C, slower than A was: no drift, it has no past (and says so)
    replaced = _gpus_run(tmp_path, "2026-11-02T00:00:00+00:00", {"n1": [(0, C, 500.0)]})
    [wait] = drift_checks(db, replaced, FROM_ONE_RUN)
    assert (wait.name, wait.status) == ("drift", Status.SKIP) and "none of the 1 past run it" in wait.detail
    record(db, replaced)
    again = _gpus_run(tmp_path, "2026-11-03T00:00:00+00:00", {"n1": [(0, C, 500.0)]})
    assert drift_checks(db, again, FROM_ONE_RUN) == []  # C against its own 500
    record(db, again)
    series = {t["gpu_uuid"]: t["values"] for t in trends(db, "n1")}  # one slot, two GPUs' series
    assert series == {A: [700.0], C: [500.0, 500.0]}


OLD_SCHEMA = """
CREATE TABLE runs (id INTEGER PRIMARY KEY, started_at TEXT NOT NULL, profile TEXT NOT NULL,
    verdict TEXT NOT NULL, nodes TEXT NOT NULL, gpuval_version TEXT NOT NULL, command TEXT NOT NULL);
CREATE TABLE values_ (run_id INTEGER NOT NULL REFERENCES runs(id), node TEXT NOT NULL, name TEXT NOT NULL,
    scope TEXT NOT NULL, value REAL NOT NULL, unit TEXT NOT NULL);
CREATE INDEX values_by_check ON values_(node, name, scope);
INSERT INTO runs VALUES (1, '2026-10-01T00:00:00+00:00', 'h200-sxm', 'PASS', 'n1', '0.1.0', '[]');
INSERT INTO values_ VALUES (1, 'n1', 'matmul.bf16_tflops', 'gpu:n1/0', 700.0, 'TFLOP/s');
INSERT INTO values_ VALUES (1, 'n1', 'all_reduce.busbw_gbps', 'cluster', 350.0, 'GB/s');
"""


def test_a_history_file_of_the_schema_before_uuids_migrates_and_keeps_its_rows(tmp_path):
    """A file as gpuval wrote it before GPUs were keyed by UUID (user_version 0): its rows stay, keyed by
    node and scope, and still serve as the past of checks that have no UUID."""
    db = tmp_path / "history.sqlite"
    with closing(sqlite3.connect(db)) as connection:
        connection.executescript(OLD_SCHEMA)
    no_uuid = _run("2026-11-01T00:00:00+00:00", 600.0, gap_pct=2.0, busbw=300.0)  # inventory without GPUs
    drift = _by_name(drift_checks(db, no_uuid, FROM_ONE_RUN))
    assert drift["drift.matmul.bf16_tflops"].threshold["median"] == 700.0  # by node and scope, as before
    assert drift["drift.all_reduce.busbw_gbps"].threshold["median"] == 350.0
    with_uuid = _gpus_run(tmp_path, "2026-11-01T00:00:00+00:00", {"n1": [(0, A, 600.0)]})
    [wait] = drift_checks(db, with_uuid, FROM_ONE_RUN)  # A has no past: the old row may be any GPU
    assert (wait.name, wait.status) == ("drift", Status.SKIP)
    record(db, with_uuid)
    with closing(sqlite3.connect(db)) as connection:
        assert connection.execute("PRAGMA user_version").fetchone() == (2,)
        rows = connection.execute(
            "SELECT run_id, scope, value, gpu_uuid FROM values_ ORDER BY run_id"
        ).fetchall()
    assert rows == [(1, "gpu:n1/0", 700.0, None), (1, "cluster", 350.0, None), (2, "gpu:n1/0", 600.0, A)]
    assert [r["started_at"][:10] for r in runs(db, "n1")] == ["2026-11-01", "2026-10-01"]
    assert {(t["scope"], t["gpu_uuid"]): t["values"] for t in trends(db, "n1")} == {
        ("cluster", None): [350.0],
        ("gpu:n1/0", None): [700.0],
        ("gpu:n1/0", A): [600.0],
    }


def test_a_history_file_of_a_newer_schema_is_refused(tmp_path):
    db = tmp_path / "history.sqlite"
    with closing(sqlite3.connect(db)) as connection:
        connection.execute("PRAGMA user_version = 3")
    with pytest.raises(UsageError, match="has schema 3, newer than this gpuval's 2: upgrade gpuval"):
        runs(db)


def test_history_command_shows_a_gpus_short_uuid_and_node(tmp_path, gpuval):
    db = tmp_path / "history.sqlite"
    record(db, _gpus_run(tmp_path, "2026-11-01T00:00:00+00:00", {"n1": [(0, A, 700.0), (1, B, 690.0)]}))
    proc = gpuval(["history", "--history", str(db)], tmp_path, env=cli_env(COLUMNS="200"))
    assert proc.returncode == 0, proc.stderr
    lines = [line.split("│") for line in proc.stdout.splitlines() if "matmul.bf16_tflops" in line]
    assert [[cell.strip() for cell in line[1:5]] for line in lines] == [
        ["matmul.bf16_tflops", "gpu:n1/0", "GPU-aaaaaaaa", "n1"],
        ["matmul.bf16_tflops", "gpu:n1/1", "GPU-bbbbbbbb", "n1"],
    ]


def test_history_at_80_columns_keeps_check_names_whole_and_has_no_empty_gpu_column(tmp_path, gpuval):
    db = tmp_path / "history.sqlite"
    for day in (1, 2):
        record(db, _run(f"2026-11-0{day}T00:00:00+00:00", 700.0, gap_pct=2.0, busbw=350.0))
    proc = gpuval(["history", "--history", str(db)], tmp_path)  # cli_env: 80 columns
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(map(len, lines)) <= 80, proc.stdout
    header = next(line for line in lines if "check" in line and "scope" in line)
    assert "gpu" not in header.replace("check", ""), proc.stdout  # no GPU known by UUID here
    for name in ("all_reduce.busbw_gbps", "matmul.bf16_tflops", "outliers.matmul_pct", "train.step_ms"):
        assert any(f"│ {name} " in line for line in lines), (name, proc.stdout)

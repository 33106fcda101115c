"""History in SQLite and drift: a node judged against the median of its own last runs."""

from __future__ import annotations

import json
import sqlite3

import pytest

from gpuval.config import HistorySettings
from gpuval.history import drift_checks, record, runs, trends
from gpuval.results import Check, Result, Status, World


def _ok(name: str, value: float, unit: str, scope: str) -> Check:
    return Check(name=name, status=Status.PASS, value=value, unit=unit, scope=scope)


def _run(started: str, bf16: float, gap_pct: float, busbw: float, verdict=Status.PASS, profile="h200-sxm"):
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
    for day, bf16 in ((1, 700.0), (2, 690.0), (3, 710.0)):
        record(db, _run(f"2026-11-0{day}T00:00:00+00:00", bf16, gap_pct=2.0, busbw=350.0))
    # median 700; 600 is (600 - 700) / 700 = 14.3% worse; busbw 340 is 2.9% worse: within 10%
    degraded = _run("2026-11-04T00:00:00+00:00", 600.0, gap_pct=2.1, busbw=340.0)
    drift = _by_name(drift_checks(db, degraded, HistorySettings()))
    assert set(drift) == {"drift.matmul.bf16_tflops"}
    check = drift["drift.matmul.bf16_tflops"]
    assert check.status is Status.WARN and check.scope == "gpu:n1/0" and check.value == 600.0
    assert check.threshold == {"min": pytest.approx(630.0), "median": 700.0, "runs": 3}  # 700 * (1 - 0.10)
    assert "14.3% worse than this node's median 700 over its last 3 run(s)" in check.detail
    assert "gpuval history --node n1" in check.detail


def test_lower_is_better_metrics_drift_upwards_and_settings_apply(tmp_path):
    db = tmp_path / "history.sqlite"
    record(db, _run("2026-11-01T00:00:00+00:00", 700.0, gap_pct=2.0, busbw=350.0))
    wider_gap = _run("2026-11-02T00:00:00+00:00", 700.0, gap_pct=4.0, busbw=350.0)  # +100%: worse
    [check] = drift_checks(db, wider_gap, HistorySettings())
    assert check.name == "drift.outliers.matmul_pct" and check.threshold["max"] == pytest.approx(2.2)
    [strict] = drift_checks(db, wider_gap, HistorySettings(fail=True))
    assert strict.status is Status.FAIL
    assert drift_checks(db, wider_gap, HistorySettings(tolerance_pct=150)) == []
    assert drift_checks(db, wider_gap, HistorySettings(min_runs=2)) == []  # one past run is too few


def test_the_baseline_skips_errored_runs_other_profiles_and_older_than_the_window(tmp_path):
    db = tmp_path / "history.sqlite"
    record(db, _run("2026-11-01T00:00:00+00:00", 100.0, 2.0, 350.0))  # outside a window of 2
    record(db, _run("2026-11-02T00:00:00+00:00", 700.0, 2.0, 350.0))
    record(db, _run("2026-11-03T00:00:00+00:00", 700.0, 2.0, 350.0))
    record(db, _run("2026-11-04T00:00:00+00:00", 10.0, 2.0, 350.0, verdict=Status.ERROR))
    record(db, _run("2026-11-05T00:00:00+00:00", 10.0, 2.0, 350.0, profile="h100-sxm"))
    current = _run("2026-11-06T00:00:00+00:00", 600.0, 2.0, 350.0)
    [check] = drift_checks(db, current, HistorySettings(window=2))
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
    profile = write_profile(
        "name: cpu-matmul\nexpect: {gpu_count: 0}\nhistory: {tolerance_pct: 60}\n"
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

"""gpuval compare: matching, % change and direction against hand-computed values, each measurement judged
once (by all its metrics, shown by its headline), and the exit code."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import cli_env

from gpuval.metrics import MeasurementDecl, Metric, direction
from gpuval.report.compare import compare, lost_metrics, regressions, summarize, totals
from gpuval.results import Measurement, Result, Status, World


def _result(*measurements: Measurement) -> Result:
    return Result(
        verdict=Status.PASS,
        started_at="2026-11-22T08:00:00+00:00",
        duration_s=1.0,
        profile="h200-sxm",
        world=World(size=4, nodes=1, backend="nccl"),
        measurements=list(measurements),
    )


def _reduce(busbw: float, time_us: float, iters: int) -> Measurement:
    return Measurement(
        name="all_reduce",
        scope="cluster",
        params={"bytes": 2**20, "dtype": "float32", "iters": iters},
        metrics={"busbw_gbps": busbw, "busbw_gbps_min": busbw - 1, "time_us": time_us},
    )


def _gap(pct: float) -> Measurement:
    return Measurement(
        name="outliers", scope="gpu:n1/0", params={"benchmark": "matmul"}, metrics={"matmul_pct": pct}
    )


def _train(tokens: float, kernels: str) -> Measurement:
    return Measurement(
        name="train",
        scope="cluster",
        params={"model": "qwen2-7b-shape", "mode": "fixed", "seq_len": 4096, "kernels": kernels},
        metrics={"tokens_per_s_per_gpu": tokens, "loss_first": 12.6},
    )


BEFORE = _result(
    _reduce(100.0, 20.0, iters=20),
    Measurement(name="matmul", scope="gpu:n1/0", metrics={"bf16_tflops": 700.0}),
    _train(10_000.0, kernels="torch"),
    Measurement(
        name="outliers", scope="gpu:n1/0", params={"benchmark": "matmul"}, metrics={"matmul_pct": 2.0}
    ),
)
AFTER = _result(
    _reduce(90.0, 22.0, iters=50),  # other iterations: the same measurement
    Measurement(name="matmul", scope="gpu:n1/0", metrics={"bf16_tflops": 707.0}),
    _train(12_000.0, kernels="liger"),  # a tuning change is compared with the run before it
    Measurement(
        name="outliers", scope="gpu:n1/0", params={"benchmark": "matmul"}, metrics={"matmul_pct": 5.0}
    ),
    Measurement(name="matmul", scope="gpu:n1/1", metrics={"bf16_tflops": 650.0}),  # only after
)


def test_rows_change_and_direction_by_hand():
    rows, unmatched = compare(BEFORE, AFTER)
    got = {(r.name, r.metric): (r.before, r.after, round(r.change_pct, 6), r.better) for r in rows}
    assert got == {
        ("all_reduce", "busbw_gbps"): (100.0, 90.0, -10.0, False),  # (90 - 100) / 100
        ("all_reduce", "time_us"): (20.0, 22.0, 10.0, False),  # slower is worse
        ("matmul", "bf16_tflops"): (700.0, 707.0, 1.0, True),
        ("train", "tokens_per_s_per_gpu"): (10_000.0, 12_000.0, 20.0, True),
        ("outliers", "matmul_pct"): (2.0, 5.0, 150.0, False),  # a wider gap to the median is worse
    }
    assert {r.identity for r in rows if r.name == "all_reduce"} == {"bytes=1MiB dtype=float32"}
    # measurements, not metrics: spreads and losses are not compared
    assert unmatched == {"only_before": 0, "only_after": 1}


def test_regressions_over_a_threshold():
    rows, _ = compare(BEFORE, AFTER)
    assert sorted(r.metric for r in regressions(rows, 5.0)) == ["busbw_gbps", "matmul_pct", "time_us"]
    assert [r.metric for r in regressions(rows, 100.0)] == ["matmul_pct"]
    assert regressions(rows, 200.0) == []


def _verdicts(threshold_pct: float) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    rows, _ = compare(BEFORE, AFTER)
    return {s.name: (s.metric, s.verdict, s.worse) for s in summarize(rows, threshold_pct)}


def test_a_measurement_is_one_summary_row_judged_on_all_its_metrics():
    # busbw and time of the one all_reduce size both got worse: one regression, shown by busbw (the
    # collective's plotted metric) although time_us is declared first
    assert _verdicts(0.0) == {
        "all_reduce": ("busbw_gbps", "worse", ("busbw_gbps", "time_us")),
        "matmul": ("bf16_tflops", "better", ()),
        "train": ("tokens_per_s_per_gpu", "better", ()),
        "outliers": ("matmul_pct", "worse", ("matmul_pct",)),  # a '*_pct' family's member
    }
    rows, unmatched = compare(BEFORE, AFTER)
    assert totals(summarize(rows, 0.0), unmatched) == {
        "compared": 4,
        "regressions": 2,
        "improvements": 2,
        "unchanged": 0,
        "only_before": 0,
        "only_after": 1,
    }


def test_changes_within_the_tolerance_are_the_same():
    # all_reduce -10 % / +10 % and matmul +1 % are within 15 %; train +20 % and outliers +150 % are not
    assert {name: verdict for name, (_, verdict, _) in _verdicts(15.0).items()} == {
        "all_reduce": "same",
        "matmul": "same",
        "train": "better",
        "outliers": "worse",
    }


def test_a_measurement_worse_on_a_metric_other_than_its_headline_is_a_regression():
    before, after = _reduce(100.0, 20.0, iters=20), _reduce(110.0, 18.0, iters=20)  # faster...
    before.metrics["wrong_elements"], after.metrics["wrong_elements"] = 0.0, 4.0  # ...yet wrong now
    rows, _ = compare(_result(before), _result(after))
    [summary] = summarize(rows, 5.0)
    assert (summary.metric, summary.before, summary.after, summary.change_pct) == (
        "busbw_gbps",
        100.0,
        110.0,
        10.0,
    )
    assert summary.verdict == "worse" and summary.worse == ("wrong_elements",)  # from 0: beyond any tolerance
    assert summary.better == ("busbw_gbps", "time_us")


def test_a_declared_headline_comes_first_then_plotted_then_declared_order():
    decl = MeasurementDecl(
        "x",
        (
            Metric("a", "s", -1),
            Metric("b", "GB/s", +1, plot=True),
            Metric("c", "GB/s", +1, headline=True),
            Metric("d", "nats", -1, compared=False),  # never compared: never a headline
        ),
    )
    assert decl.headline_keys() == ["c", "b", "a"]
    assert MeasurementDecl("y", (Metric("a", "s", -1),)).headline_keys() == ["a"]  # no flag: as before
    with pytest.raises(ValueError, match="more than one headline"):
        MeasurementDecl("z", (Metric("a", "s", -1, headline=True), Metric("b", "s", -1, headline=True)))


@pytest.mark.parametrize(
    "name, metric, sign",
    [
        ("all_reduce", "busbw_gbps", 1),
        ("membw", "copy_tbps", 1),
        ("train", "mfu_pct", 1),
        ("outliers", "matmul_pct", -1),
        ("train", "step_ms", -1),
        ("train", "loss_last", 0),  # declared, never compared
        ("p2p", "copy_gbps_min", 0),  # a spread is never compared
        ("all_reduce", "ranks", 0),  # undeclared
    ],
)
def test_direction(name, metric, sign):
    assert direction(name, metric) == sign


def test_cli_exit_code_follows_fail_on_regression(tmp_path, gpuval):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(BEFORE.to_json())
    after.write_text(AFTER.to_json())
    proc = gpuval(["compare", str(before), str(after), "--fail-on-regression", "100"], tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "gpuval: 1 measurement(s) regressed more than 100 %, e.g. outliers gpu:n1/0 benchmark=matmul "
        "matmul_pct: 2 → 5"
    ]
    words = " ".join(proc.stdout.split())
    assert (
        "4 measurements compared: 1 regression, 0 improvements, 3 unchanged; 0 only in A, 1 only in B"
        in words
    )
    # 3 metrics got worse by more than 5 %, in 2 measurements: the exit counts measurements
    proc = gpuval(["compare", str(before), str(after), "--fail-on-regression", "5"], tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith("gpuval: 2 measurement(s) regressed"), proc.stderr
    assert "all_reduce cluster bytes=1MiB dtype=float32 busbw_gbps: 100 → 90" in proc.stderr  # its headline


def test_json_keeps_every_metric_row_and_adds_each_measurements_summary(tmp_path, gpuval):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(BEFORE.to_json())
    after.write_text(AFTER.to_json())
    proc = gpuval(["compare", str(before), str(after), "--fail-on-regression", "5", "--json"], tmp_path)
    assert proc.returncode == 1, proc.stderr
    document = json.loads(proc.stdout)
    assert len(document["rows"]) == 5  # every metric row is kept
    assert [(m["name"], m["metric"], m["verdict"]) for m in document["measurements"]] == [
        ("all_reduce", "busbw_gbps", "worse"),
        ("matmul", "bf16_tflops", "same"),  # +1 %: within 5 %
        ("train", "tokens_per_s_per_gpu", "better"),
        ("outliers", "matmul_pct", "worse"),
    ]
    # 3 rows got worse, in 2 measurements: one regression each
    assert [r["name"] for r in document["regressions"]] == ["all_reduce", "outliers"]
    assert document["totals"] == {
        "compared": 4, "regressions": 2, "improvements": 1, "unchanged": 1, "only_before": 0, "only_after": 1
    }  # fmt: skip
    proc = gpuval(["compare", str(before), str(after)], tmp_path)  # no threshold: a report, never a verdict
    assert proc.returncode == 0
    assert "2 regressions, 2 improvements, 0 unchanged" in " ".join(proc.stdout.split())


def test_the_summary_has_a_row_per_measurement_and_all_a_row_per_metric(tmp_path, gpuval):
    """A sweep of 8 sizes with 3 compared metrics each: 8 rows by default, 24 with --all."""

    def sweep(time_us: float, algbw_gbps: float) -> Result:
        return _result(
            *(
                Measurement(
                    name="all_reduce",
                    scope="cluster",
                    params={"bytes": 4**power, "dtype": "float32"},  # 1 KiB to 16 MiB
                    metrics={"time_us": time_us, "algbw_gbps": algbw_gbps, "busbw_gbps": algbw_gbps * 1.75},
                )
                for power in range(5, 13)
            )
        )

    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(sweep(10.0, 100.0).to_json())
    after.write_text(sweep(11.0, 90.0).to_json())
    env = cli_env(COLUMNS="200")  # one table row a line
    summary = gpuval(["compare", str(before), str(after)], tmp_path, env=env)
    every = gpuval(["compare", str(before), str(after), "--all"], tmp_path, env=env)
    assert summary.returncode == every.returncode == 0, summary.stderr + every.stderr
    summary_rows = [line for line in summary.stdout.splitlines() if "│ all_reduce" in line]
    every_rows = [line for line in every.stdout.splitlines() if "│ all_reduce" in line]
    assert len(summary_rows) == 8 and all("busbw_gbps" in line and "worse" in line for line in summary_rows)
    assert "1KiB" in summary_rows[0] and "16MiB" in summary_rows[-1]  # the sweep's order, not the text's
    assert len(every_rows) == 24
    assert "8 measurements compared: 8 regressions, 0 improvements, 0 unchanged" in summary.stdout
    assert "24 metrics compared: 0 better, 24 worse" in every.stdout
    assert "8 measurements compared: 8 regressions" in every.stdout


def test_a_later_run_that_lost_a_metric_regressed(tmp_path, gpuval):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(_result(_reduce(100.0, 20.0, iters=20)).to_json())
    lost = _reduce(100.0, 20.0, iters=20)
    lost.metrics["busbw_gbps"] = None  # NaN in the run, null in result.json
    after.write_text(_result(lost).to_json())
    assert lost_metrics(_result(_reduce(100.0, 20.0, 20)), _result(lost)) == 1
    proc = gpuval(["compare", str(before), str(after), "--fail-on-regression", "5"], tmp_path)
    assert proc.returncode == 1 and "it lost 1 metric(s) of measurements that" in proc.stderr, proc.stderr


def test_results_with_nothing_in_common_are_bad_input(tmp_path, gpuval):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(_result(_reduce(1.0, 1.0, 1)).to_json())
    after.write_text(
        _result(Measurement(name="matmul", scope="gpu:n1/0", metrics={"bf16_tflops": 1.0})).to_json()
    )
    proc = gpuval(["compare", str(before), str(after)], tmp_path)
    assert proc.returncode == 2
    assert "share no measurement" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def _both_ways(monkeypatch: pytest.MonkeyPatch, child: bool) -> None:
    """read_sides reads the later file in a forked child where it can; `child` forces either way (a
    pytest worker runs threads, which alone would keep it to one process)."""
    import gpuval.forked

    monkeypatch.setattr(gpuval.forked.threading, "active_count", lambda: 1 if child else 2)


def _recorded_read(path):
    """report.compare._read_side, saying which process ran it (a module-level function: the child is
    handed it by name)."""
    from gpuval.report.compare import Side, side_of
    from gpuval.results import load_result

    Path(os.environ["GPUVAL_TEST_READ_BY"]).write_text(str(os.getpid()))
    side: Side = side_of(load_result(path))
    return side


@pytest.mark.parametrize("child", [True, False], ids=["later-in-a-child", "one-process"])
def test_read_sides_in_a_child_reads_what_one_process_reads(tmp_path, monkeypatch, child):
    from gpuval.report.compare import read_sides, side_of

    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(BEFORE.to_json())
    after.write_text(AFTER.model_copy(update={"verdict": Status.ERROR}).to_json())
    _both_ways(monkeypatch, child)
    import gpuval.report.compare as module

    marker = tmp_path / "read-by"
    monkeypatch.setenv("GPUVAL_TEST_READ_BY", str(marker))
    monkeypatch.setattr(module, "_read_side", _recorded_read)
    earlier, later = read_sides(before, after)
    assert (marker.read_text() != str(os.getpid())) == child  # the later file read by another process
    assert earlier == side_of(BEFORE) and later.verdict == "ERROR"
    assert later.values == side_of(AFTER).values
    assert compare(earlier, later) == compare(BEFORE, AFTER)


@pytest.mark.parametrize("child", [True, False], ids=["later-in-a-child", "one-process"])
def test_read_sides_says_the_earlier_files_fault_first_then_the_later_ones(tmp_path, monkeypatch, child):
    from gpuval.errors import UsageError
    from gpuval.report.compare import read_sides

    good, broken, other = tmp_path / "good.json", tmp_path / "broken.json", tmp_path / "other.json"
    good.write_text(BEFORE.to_json())
    broken.write_text(BEFORE.to_json().replace('"verdict": "PASS"', '"verdict": "MAYBE"'))
    other.write_text("{not json")
    _both_ways(monkeypatch, child)
    with pytest.raises(UsageError, match=rf"^{broken} is not a gpuval result.json \(verdict: "):
        read_sides(good, broken)  # the later file's fault, found in the child where there is one
    with pytest.raises(UsageError, match=rf"^result file '{other}': not JSON \(line 1, column 2"):
        read_sides(other, broken)


def test_a_broken_later_file_read_in_a_child_is_one_line(tmp_path, gpuval):
    """The command as a user runs it (no threads: the later file is read in a forked child): the child's
    refusal is the command's one line, exit 2."""
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(BEFORE.to_json())
    after.write_text(AFTER.to_json()[:-40])  # cut short
    proc = gpuval(["compare", str(before), str(after)], tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith(f"gpuval: result file '{after}': not JSON (line "), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr

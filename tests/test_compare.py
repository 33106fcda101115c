"""gpuval compare: matching, % change and direction against hand-computed values, and the exit code."""

from __future__ import annotations

import json

import pytest

from gpuval.metrics import direction
from gpuval.report.compare import compare, regressions
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
    assert unmatched == {"only_before": 0, "only_after": 1}  # spreads and losses are not compared


def test_regressions_over_a_threshold():
    rows, _ = compare(BEFORE, AFTER)
    assert sorted(r.metric for r in regressions(rows, 5.0)) == ["busbw_gbps", "matmul_pct", "time_us"]
    assert [r.metric for r in regressions(rows, 100.0)] == ["matmul_pct"]
    assert regressions(rows, 200.0) == []


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
    assert "5 shared: 2 better, 3 worse" in " ".join(proc.stdout.split())
    proc = gpuval(["compare", str(before), str(after), "--fail-on-regression", "200", "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert len(document["rows"]) == 5 and document["regressions"] == []
    proc = gpuval(["compare", str(before), str(after)], tmp_path)  # no threshold: a report, never a verdict
    assert proc.returncode == 0


def test_results_with_nothing_in_common_are_bad_input(tmp_path, gpuval):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(_result(_reduce(1.0, 1.0, 1)).to_json())
    after.write_text(
        _result(Measurement(name="matmul", scope="gpu:n1/0", metrics={"bf16_tflops": 1.0})).to_json()
    )
    proc = gpuval(["compare", str(before), str(after)], tmp_path)
    assert proc.returncode == 2
    assert "share no measurement" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1

"""checks.py: thresholds, outliers against the median, exact-result checks; values worked out by hand."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from gpuval import metrics
from gpuval.checks import (
    correctness_checks,
    gap_to_median_pct,
    outlier_measurements,
    threshold_checks,
)
from gpuval.config import Profile
from gpuval.results import Measurement, Status

PRODUCERS = {"all_reduce": "collectives", "all_gather": "collectives", "matmul": "matmul", "membw": "membw"}


def profile(**checks) -> Profile:
    return Profile.model_validate({"name": "test", "checks": checks})


def coll(name: str, size: int, scope: str = "cluster", wrong: float = 0.0, **metrics) -> Measurement:
    return Measurement(
        name=name,
        scope=scope,
        params={"bytes": size, "bytes_exact": size, "ranks": 4},
        metrics={"wrong_elements": wrong, **metrics},
        samples=3,
    )


SWEEP = [
    coll("all_reduce", 4096, busbw_gbps=10.0, time_us=40.0),
    coll("all_reduce", 2**20, busbw_gbps=120.0, time_us=60.0),
]


def judge(checks: dict, measurements=SWEEP, not_run=None):
    return threshold_checks(profile(**checks), measurements, not_run or {}, PRODUCERS)


# ---- thresholds -------------------------------------------------------------------------------------------


def test_bytes_selects_exactly_one_size_pass():
    [check] = judge({"all_reduce.busbw_gbps": {"min": 100, "bytes": "1MiB"}})
    assert check.status is Status.PASS
    assert check.value == 120.0
    assert check.unit == "GB/s"
    assert check.threshold == {"min": 100.0, "bytes": 2**20}
    assert check.detail == "120 GB/s at 1 MiB, required >= 100"


def test_min_fail():
    [check] = judge({"all_reduce.busbw_gbps": {"min": 200, "bytes": 2**20}})
    assert check.status is Status.FAIL
    assert check.value == 120.0
    assert check.scope == "cluster"
    assert check.detail == (
        "120 GB/s at 1 MiB on cluster, required >= 200: check NVLink/InfiniBand state and errors "
        "(nvidia-smi nvlink -e, ibstat), topology (nvidia-smi topo -m) and NCCL_* settings; "
        "--set benchmarks.collectives.scope=node finds the node"
    )


def test_nan_value_is_an_error_not_a_pass():
    nan = [coll("all_reduce", 2**20, busbw_gbps=float("nan"), time_us=60.0)]
    [low] = judge({"all_reduce.busbw_gbps": {"min": 1, "bytes": "1MiB"}}, nan)
    [high] = judge({"all_reduce.busbw_gbps": {"max": 1, "bytes": "1MiB"}}, nan)
    assert low.status is Status.ERROR and high.status is Status.ERROR
    assert "no value" in low.detail


def test_min_warn_level():
    [check] = judge({"all_reduce.busbw_gbps": {"min": 200, "bytes": "1MiB", "level": "warn"}})
    assert check.status is Status.WARN
    assert "level" not in check.threshold


def test_bytes_selects_the_small_size():
    [check] = judge({"all_reduce.busbw_gbps": {"min": 5, "bytes": "4KiB"}})
    assert (check.status, check.value) == (Status.PASS, 10.0)


def test_without_bytes_every_size_is_judged():
    checks = judge({"all_reduce.busbw_gbps": {"min": 50}})
    assert [(c.value, c.status) for c in checks] == [(10.0, Status.FAIL), (120.0, Status.PASS)]


def test_max_bound():
    checks = judge({"all_reduce.time_us": {"max": 50}})
    assert [(c.value, c.status) for c in checks] == [(40.0, Status.PASS), (60.0, Status.FAIL)]
    assert checks[0].unit == "us"
    assert checks[1].detail == f"60 us on cluster, required <= 50: {metrics.hint('all_reduce', 'time_us')}"


def test_min_and_max_bound():
    checks = judge({"all_reduce.time_us": {"min": 45, "max": 70, "level": "warn"}})
    assert [c.status for c in checks] == [Status.WARN, Status.PASS]
    assert (
        checks[0].detail
        == f"40 us on cluster, required >= 45 and <= 70: {metrics.hint('all_reduce', 'time_us')}"
    )
    assert checks[1].detail == "60 us, required >= 45 and <= 70"


def test_bound_is_inclusive():
    [check] = judge({"all_reduce.busbw_gbps": {"min": 120, "max": 120, "bytes": "1MiB"}})
    assert check.status is Status.PASS


def test_no_measurement_at_that_size_is_error():
    [check] = judge({"all_reduce.busbw_gbps": {"min": 1, "bytes": "2MiB"}})
    assert check.status is Status.ERROR
    assert check.value is None
    assert "at 2 MiB" in check.detail and "no 'all_reduce' measurement" in check.detail


def test_metric_never_measured_is_error():
    [check] = judge({"all_reduce.busbw_tbps": {"min": 1}})
    assert check.status is Status.ERROR
    assert "metric 'busbw_tbps'" in check.detail


def test_no_measurements_at_all_is_error_never_pass():
    checks = judge({"all_reduce.busbw_gbps": {"min": 0}, "matmul.fp32_tflops": {"min": 0}}, measurements=[])
    assert [c.status for c in checks] == [Status.ERROR, Status.ERROR]


def test_value_missing_is_error():
    m = Measurement(name="matmul", scope="gpu:n1/0", metrics={"fp32_tflops": None})
    [check] = judge({"matmul.fp32_tflops": {"min": 1}}, measurements=[m])
    assert check.status is Status.ERROR
    assert "produced no value" in check.detail


def test_skipped_benchmark_gives_skip_with_reason():
    reason = "one rank: a collective needs two or more GPUs (or processes) to move data"
    checks = judge(
        {"all_reduce.busbw_gbps": {"min": 1, "bytes": "1MiB"}, "all_gather.busbw_gbps": {"min": 1}},
        measurements=[],
        not_run={"collectives": (Status.SKIP, reason)},
    )
    assert [(c.name, c.status, c.detail) for c in checks] == [
        ("all_reduce.busbw_gbps", Status.SKIP, reason),
        ("all_gather.busbw_gbps", Status.SKIP, reason),
    ]


def test_failed_benchmark_gives_error_with_reason():
    reason = "matmul failed on rank 1: RuntimeError: boom"
    [check] = judge(
        {"matmul.fp32_tflops": {"min": 1}}, measurements=[], not_run={"matmul": (Status.ERROR, reason)}
    )
    assert (check.status, check.detail, check.unit) == (Status.ERROR, reason, "TFLOP/s")


def test_other_benchmark_skipped_does_not_excuse_missing_data():
    [check] = judge(
        {"matmul.fp32_tflops": {"min": 1}},
        measurements=[],
        not_run={"collectives": (Status.SKIP, "one rank")},
    )
    assert check.status is Status.ERROR


# ---- outliers ---------------------------------------------------------------------------------------------


def gpus(values, metric="fp32_tflops", name="matmul"):
    return [Measurement(name=name, scope=f"gpu:node1/{i}", metrics={metric: v}) for i, v in enumerate(values)]


def test_gap_to_median_by_hand():
    assert gap_to_median_pct([100, 98, 90, 99]) == pytest.approx((98.5 - 90) / 98.5 * 100)  # 8.6294...
    assert gap_to_median_pct([100, 98, 90, 99]) == pytest.approx(8.629441624365482, rel=1e-12)
    assert gap_to_median_pct([10, 20, 30]) == pytest.approx(50.0)
    assert gap_to_median_pct([1, 2]) == pytest.approx(100 / 3)
    assert gap_to_median_pct([5, 5, 5]) == 0.0
    assert gap_to_median_pct([0, 0]) == 0.0


def test_outlier_names_slowest_scope():
    [m] = outlier_measurements(gpus([100, 98, 90, 99]), {"matmul": ("bf16_tflops", "fp32_tflops")})
    assert m.name == "outliers"
    assert m.scope == "gpu:node1/2"
    assert m.metrics == {"matmul_pct": pytest.approx((98.5 - 90) / 98.5 * 100)}
    assert m.params == {
        "benchmark": "matmul",
        "metric": "fp32_tflops",
        "slowest": "gpu:node1/2",
        "slowest_value": 90,
        "median": 98.5,
        "count": 4,
    }
    assert m.samples == 4


def test_outlier_uses_first_measured_candidate():
    measured = gpus([100, 50]) + gpus([400, 396], metric="bf16_tflops")
    [m] = outlier_measurements(measured, {"matmul": ("bf16_tflops", "fp32_tflops")})
    assert m.params["metric"] == "bf16_tflops"
    assert m.metrics["matmul_pct"] == pytest.approx((398 - 396) / 398 * 100)


def test_outlier_needs_two_points():
    assert outlier_measurements(gpus([100]), {"matmul": ("fp32_tflops",)}) == []
    assert outlier_measurements([], {"matmul": ("fp32_tflops",)}) == []


def test_outlier_threshold_fail_names_the_gpu():
    measured = gpus([100, 98, 90, 99])
    measured += outlier_measurements(measured, {"matmul": ("fp32_tflops",)})
    [check] = judge({"outliers.matmul_pct": {"max": 5}}, measurements=measured)
    assert check.status is Status.FAIL
    assert check.value == pytest.approx(8.629441624365482)
    assert check.unit == "%"
    assert check.scope == "gpu:node1/2"
    assert check.detail == (
        "gpu:node1/2 is 8.6% below the median fp32_tflops (90 vs 98.5): check clocks, power limit and "
        "throttle reasons (nvidia-smi -q -d PERFORMANCE,POWER)"
    )


def test_outlier_threshold_warn_and_pass():
    measured = gpus([100, 98, 90, 99])
    measured += outlier_measurements(measured, {"matmul": ("fp32_tflops",)})
    [warn] = judge({"outliers.matmul_pct": {"max": 5, "level": "warn"}}, measurements=measured)
    [ok] = judge({"outliers.matmul_pct": {"max": 10}}, measurements=measured)
    assert (warn.status, ok.status) == (Status.WARN, Status.PASS)


def test_outlier_with_one_gpu_is_skip():
    [check] = judge({"outliers.matmul_pct": {"max": 5}}, measurements=gpus([100]))
    assert check.status is Status.SKIP
    assert "fewer than two" in check.detail


def test_outlier_of_failed_benchmark_is_error():
    [check] = judge(
        {"outliers.matmul_pct": {"max": 5}},
        measurements=[],
        not_run={"matmul": (Status.ERROR, "matmul failed on rank 0: boom")},
    )
    assert (check.status, check.detail) == (Status.ERROR, "matmul failed on rank 0: boom")


# ---- exact collective results -----------------------------------------------------------------------------


def test_correctness_pass():
    [check] = correctness_checks([coll("all_reduce", 4096), coll("all_reduce", 2**20)])
    assert (check.name, check.status, check.value) == ("all_reduce.correct", Status.PASS, 0)
    assert check.threshold == {"max": 0}
    assert check.detail == "exact at all 2 sizes"


def test_correctness_fail_names_the_size():
    measured = [
        coll("all_reduce", 4096),
        coll("all_reduce", 16384, wrong=3),
        coll("all_reduce", 2**20, wrong=2),
    ]
    [check] = correctness_checks(measured)
    assert check.status is Status.FAIL
    assert check.value == 5
    assert check.unit == "elements"
    assert check.detail.startswith("5 wrong elements at 16 KiB, 1 MiB: ")
    assert "scope=node" in check.detail


def test_correctness_per_op_and_scope():
    measured = [
        coll("all_reduce", 4096, scope="node:a"),
        coll("all_reduce", 4096, scope="node:b", wrong=1),
        coll("all_gather", 4096, scope="node:a"),
        Measurement(name="matmul", scope="gpu:a/0", metrics={"fp32_tflops": 1.0}),
    ]
    checks = correctness_checks(measured)
    assert [(c.name, c.scope, c.status) for c in checks] == [
        ("all_reduce.correct", "node:a", Status.PASS),
        ("all_reduce.correct", "node:b", Status.FAIL),
        ("all_gather.correct", "node:a", Status.PASS),
    ]


def test_correctness_nothing_to_check():
    assert correctness_checks([]) == []


@pytest.mark.parametrize(
    ("name", "metric", "unit"),
    [
        ("all_reduce", "busbw_gbps", "GB/s"),
        ("membw", "copy_tbps", "TB/s"),
        ("matmul", "fp32_tflops", "TFLOP/s"),
        ("outliers", "matmul_pct", "%"),
        ("all_reduce", "time_us", "us"),
        ("all_reduce", "time_us_max", "us"),  # a spread shares its metric's unit
        ("train", "step_ms", "ms"),
        ("train", "peak_memory_gib", "GiB"),
        ("matmul", "other", ""),  # undeclared
        ("warp_drive", "busbw_gbps", ""),  # no such measurement: a suffix says nothing any more
    ],
)
def test_unit_of_a_declared_metric(name, metric, unit):
    assert metrics.unit(name, metric) == unit


@pytest.mark.parametrize(
    ("name", "metric", "expected"),
    [
        ("matmul", "bf16_tflops", "power limit"),
        ("membw", "copy_tbps", "ROW_REMAPPER"),
        ("membw", "h2d_gbps", "PCIe"),
        ("p2p", "copy_gbps", "nvlink"),
        ("sendrecv", "busbw_gbps", "topo -m"),
    ],
)
def test_every_failure_gets_a_hint_for_its_hardware(name, metric, expected):
    assert expected in metrics.hint(name, metric)


def test_a_benchmark_that_raises_on_one_rank_is_an_error_said_by_that_rank(monkeypatch, capsys, tmp_path):
    """The rank that fails says so on its own stderr at once (the other ranks may still be inside the
    benchmark's collectives), with the file that keeps its traceback, and the run records an ERROR; later
    benchmarks are not run."""
    from types import SimpleNamespace

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the traceback goes

    from gpuval.bench import run as suite

    def boom(ctx, options):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    benchmarks = {
        "matmul": SimpleNamespace(run=boom, expected_s=None),
        "membw": SimpleNamespace(run=lambda ctx, options: [], expected_s=None),
    }
    monkeypatch.setattr(suite, "all_benchmarks", lambda: benchmarks)
    runtime = SimpleNamespace(rank=1, node_name="n1", all_gather_object=lambda obj: [obj])
    outcome = suite.run_benchmarks(runtime, {"matmul": None, "membw": None}, quick=True)
    status, reason = outcome.not_run["matmul"]
    said = "matmul failed on rank 1: RuntimeError: CUDA error: an illegal memory access was encountered"
    kept = re.fullmatch(re.escape(said) + r" \(traceback in (.+)\)", reason)
    assert status is Status.ERROR and kept, reason
    # the line names the exception; the file it names keeps where it was raised
    traceback = Path(kept.group(1)).read_text(encoding="utf-8")
    assert "in boom" in traceback and "illegal memory access was encountered\nmore" in traceback
    assert outcome.not_run["membw"] == (Status.ERROR, f"not run: an earlier benchmark failed ({reason})")
    assert outcome.error_nodes == {"matmul": {"n1"}, "membw": {"n1"}}  # where it broke: health may explain it
    assert capsys.readouterr().err == f"gpuval: {reason}\n"


# ---- bounds per GPU count (by_gpus) -----------------------------------------------------------------------

TWO_GPU_SOURCE = (
    "derived from 3 runs on 2 nodes, 3 values (spread 0.5 %, none left out): min 103 - 3 x sd 1; a, b, c"
)
PER_COUNT = {"bytes": "1MiB", "by_gpus": {2: {"min": 100, "source": TWO_GPU_SOURCE}, 4: {"min": 130}}}


def on(ranks: int, busbw: float) -> Measurement:
    measured = coll("all_reduce", 2**20, busbw_gbps=busbw)
    return measured.model_copy(update={"params": {**measured.params, "ranks": ranks}})


def test_a_collective_is_judged_by_the_bound_of_its_own_gpu_count():
    two, four = judge({"all_reduce.busbw_gbps": PER_COUNT}, [on(2, 120.0), on(4, 120.0)])
    # each reports the bound it was judged by, and what stands behind it where the profile says
    evidence = {"source": TWO_GPU_SOURCE, "evidence": "3 runs on 2 nodes, spread 0.5 %"}
    assert (two.status, two.threshold) == (Status.PASS, {"min": 100.0, "bytes": 2**20, "gpus": 2, **evidence})
    assert (four.status, four.threshold) == (Status.FAIL, {"min": 130.0, "bytes": 2**20, "gpus": 4})
    assert four.detail.startswith("120 GB/s at 1 MiB on cluster, required >= 130")


def test_an_uncalibrated_gpu_count_warns_and_never_fails_against_another_counts_bound():
    [check] = judge({"all_reduce.busbw_gbps": PER_COUNT}, [on(8, 50.0)])
    assert check.status is Status.WARN and check.value == 50.0
    assert check.detail == (
        "not calibrated for 8 GPUs: measured 50 GB/s at 1 MiB (the profile bounds it for 2, 4 GPUs; "
        "gpuval profiles derive makes a bound from clean runs)"
    )


def test_p2p_takes_the_gpu_count_of_the_node():
    link = Measurement(
        name="p2p", scope="link:n1/gpu0-gpu1", params={"src": 0, "dst": 1}, metrics={"copy_gbps": 90}
    )
    bounds = profile(**{"p2p.copy_gbps": {"by_gpus": {2: {"min": 100}}}})
    [two] = threshold_checks(bounds, [link], {}, {"p2p": "p2p"}, gpus_per_node=2)
    [four] = threshold_checks(bounds, [link], {}, {"p2p": "p2p"}, gpus_per_node=4)
    assert (two.status, four.status) == (Status.FAIL, Status.WARN)


def test_a_flat_bound_set_over_by_gpus_holds_at_every_count():
    from gpuval.config import apply_sets

    data = {"name": "t", "checks": {"all_reduce.busbw_gbps": dict(PER_COUNT)}}
    apply_sets(
        data, ["checks.all_reduce.busbw_gbps.min=125", "checks.all_reduce.busbw_gbps.by_gpus.4.min=90"]
    )
    bounds = Profile.model_validate(data)
    assert bounds.checks["all_reduce.busbw_gbps"].by_gpus[4].min == 90  # the YAML's key 4, not a new '4'
    checks = threshold_checks(bounds, [on(2, 120.0), on(8, 120.0)], {}, PRODUCERS)
    assert [(c.status, c.threshold.get("min")) for c in checks] == [
        (Status.FAIL, 125.0),
        (Status.FAIL, 125.0),
    ]


@pytest.mark.parametrize(
    "bound, message",
    [({"bytes": "1MiB"}, "give min or max (or by_gpus)"), ({"by_gpus": {2: {}}}, "needs min or max")],
)
def test_a_check_without_any_bound_is_refused(bound, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=re.escape(message)):
        profile(**{"all_reduce.busbw_gbps": bound})


def test_by_gpus_on_a_per_gpu_metric_is_a_usage_error():
    from gpuval.bench.run import plan_benchmarks
    from gpuval.errors import UsageError

    bounds = profile(**{"matmul.bf16_tflops": {"by_gpus": {2: {"min": 600}}}})
    with pytest.raises(UsageError, match="by_gpus is for measurements whose figure depends on the GPU count"):
        plan_benchmarks(bounds, quick=True, on_gpu=False)

"""gpuval.metrics: one declaration per metric, read by checks, compare, history and the reports.

Every metric gpuval produces (a real accept run on this CPU, and the GPU runs recorded under
benchmarks/results) is declared with a unit; and a benchmark with a metric nothing else knows is one
`register(...)` call away from being judged, compared, drift-checked and rendered.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel
from rich.console import Console

from gpuval import metrics
from gpuval.bench.registry import Benchmark, all_benchmarks, register, unregister
from gpuval.bench.run import plan_benchmarks, run_benchmarks
from gpuval.checks import threshold_checks
from gpuval.config import HistorySettings, Profile
from gpuval.errors import UsageError
from gpuval.history import drift_checks, record
from gpuval.metrics import MeasurementDecl, Metric
from gpuval.report.compare import compare, regressions
from gpuval.report.console import print_measurements, print_result
from gpuval.report.html import render_html
from gpuval.results import Measurement, Result, Status, World, load_result

REPO = Path(__file__).resolve().parents[1]
RECORDED = ("gpuval.result/v1", "gpuval.bench/v1")  # accept's result.json and `gpuval bench --output`


def _recorded_measurements() -> list[Measurement]:
    """The measurements of every result or bench file kept under benchmarks/results (GPU runs), archived
    ones included."""
    found = []
    results = REPO / "benchmarks" / "results"
    for path in sorted([*results.glob("*/*.json"), *results.glob("archive/*/*.json")]):
        document = json.loads(path.read_text())
        if isinstance(document, dict) and document.get("schema") in RECORDED:
            found += [Measurement.model_validate(m) for m in document.get("measurements", [])]
    return found


@pytest.fixture
def cpu_accept(cpu_accept_run) -> Result:
    proc, out = cpu_accept_run  # tests/conftest.py's one accept run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return load_result(out / "result.json")


# --- everything produced is declared ------------------------------------------------------------------


@pytest.mark.dist
def test_every_metric_a_cpu_accept_run_produces_is_declared_with_a_unit(cpu_accept):
    produced = {(m.name, key) for m in cpu_accept.measurements for key in m.metrics}
    names = {name for name, _ in produced}
    assert {"all_reduce", "matmul", "membw", "train", "outliers"} <= names  # what the cpu profile runs
    assert metrics.undeclared(cpu_accept.measurements) == []
    assert all(metrics.unit(name, key) for name, key in produced), sorted(
        (name, key) for name, key in produced if not metrics.unit(name, key)
    )


def test_every_metric_of_the_recorded_gpu_runs_is_declared_with_a_unit():
    measured = _recorded_measurements()
    assert {"p2p", "matmul", "membw", "sendrecv"} <= {m.name for m in measured}  # GPU-only ones too
    assert metrics.undeclared(measured) == []
    assert all(metrics.unit(m.name, key) for m in measured for key in m.metrics)


def test_every_declaration_is_complete_and_belongs_to_its_producer():
    declared = metrics.declared()
    for decl in declared.values():
        for metric in decl.metrics:
            assert metric.unit and metric.better in (-1, 0, 1), (decl.name, metric)
    produced = {name: bench.name for bench in all_benchmarks().values() for name in bench.produces}
    assert set(declared) == set(produced) | {"outliers"}  # 'outliers' is made by checks.py
    collectives = all_benchmarks()["collectives"]
    from gpuval.bench.collectives import OPS

    assert collectives.produces == tuple(OPS)  # the op table is the one list of collective names


def test_spread_companions_share_the_unit_and_are_never_compared():
    base = metrics.metric("membw", "copy_tbps")
    for key in ("copy_tbps_min", "copy_tbps_max"):
        spread = metrics.metric("membw", key)
        assert spread.unit == base.unit == "TB/s"
        assert not spread.compared and spread.direction == 0 and base.direction == 1


def test_an_undeclared_metric_is_visible():
    assert metrics.find("matmul", "bf16_tflop") is None
    with pytest.raises(metrics.UndeclaredMetric, match="bf16_tflops"):  # names what is declared
        metrics.metric("matmul", "bf16_tflop")
    odd = Measurement(name="matmul", scope="gpu:n1/0", metrics={"bf16_tflops": 1.0, "warp_factor": 9.0})
    assert metrics.undeclared([odd]) == ["matmul.warp_factor"]


def test_a_profile_check_on_an_undeclared_metric_is_refused_when_planned():
    profile = Profile.model_validate({"name": "x", "checks": {"matmul.bf16_tflop": {"min": 1}}})
    with pytest.raises(UsageError, match="did you mean 'matmul.bf16_tflops'"):
        plan_benchmarks(profile, quick=True, on_gpu=False)


def test_train_throughput_and_step_time_have_units_and_directions():
    tokens, step = metrics.metric("train", "tokens_per_s_per_gpu"), metrics.metric("train", "step_ms")
    assert (tokens.unit, tokens.direction) == ("tokens/s", 1)
    assert (step.unit, step.direction) == ("ms", -1)
    # so two runs are compared on them, where a suffix table once left them unjudged
    before = _result([Measurement(name="train", scope="cluster", metrics={"tokens_per_s_per_gpu": 1000.0})])
    after = _result([Measurement(name="train", scope="cluster", metrics={"tokens_per_s_per_gpu": 900.0})])
    [row] = compare(before, after)[0]
    assert row.better is False and regressions([row], 5.0) == [row]


def test_history_never_imports_accept():
    code = "import sys, gpuval.history; assert 'gpuval.accept' not in sys.modules, 'cycle'"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- a new benchmark with a new metric: one register() call -----------------------------------------


class ToyOptions(BaseModel):
    rate: float = 100.0


def _run_toy(ctx, options: ToyOptions) -> list[Measurement]:
    return [
        Measurement(
            name="toy",
            scope=ctx.runtime.device_scope,
            params={"size": 8},
            metrics={"widgets_per_s": options.rate, "widgets_per_s_min": options.rate * 0.9},
        )
    ]


@pytest.fixture
def toy():
    all_benchmarks()  # the real ones first, as in any run
    bench = register(
        Benchmark(
            name="toy",
            summary="widgets per second",
            options=ToyOptions,
            defaults=lambda quick, on_gpu: {},
            run=_run_toy,
            metrics=(
                MeasurementDecl(
                    "toy",
                    (Metric("widgets_per_s", "widgets/s", +1, hint="check the widget press"),),
                    identity=("size",),
                ),
            ),
        )
    )
    yield bench
    unregister("toy")
    assert "toy" not in all_benchmarks() and metrics.find("toy", "widgets_per_s") is None


class _OneRank:
    rank = 0
    node_name = "n1"
    device_scope = "cpu:n1/0"

    def all_gather_object(self, value):
        return [value]


def _result(measurements, checks=(), started="2026-11-01T00:00:00+00:00") -> Result:
    return Result(
        verdict=Status.PASS,
        started_at=started,
        duration_s=1.0,
        profile="toy",
        world=World(),
        inventory={"nodes": [{"node": "n1"}]},
        measurements=list(measurements),
        checks=list(checks),
    )


def _toy_run(rate: float, started: str = "2026-11-01T00:00:00+00:00") -> Result:
    """The toy through the real planner, runner and threshold checks, with `toy.widgets_per_s >= 50`."""
    profile = Profile.model_validate(
        {"name": "toy", "checks": {"toy.widgets_per_s": {"min": 50}}, "benchmarks": {"toy": {"rate": rate}}}
    )
    plan = plan_benchmarks(profile, quick=True, on_gpu=False)
    assert list(plan) == ["toy"]  # the check alone pulls the benchmark in
    outcome = run_benchmarks(_OneRank(), plan, quick=True)
    producers = {name: b.name for b in all_benchmarks().values() for name in b.produces}
    checks = threshold_checks(profile, outcome.measurements, outcome.not_run, producers)
    return _result(outcome.measurements, checks, started)


def test_a_toy_benchmark_is_judged_compared_drift_checked_and_rendered(toy, tmp_path):
    fast, slow = _toy_run(100.0), _toy_run(20.0, "2026-11-05T00:00:00+00:00")
    assert metrics.undeclared(fast.measurements) == []  # its spread companion is derived, not declared

    # judged against the profile, with its unit and its hint
    [passed], [failed] = fast.checks, slow.checks
    assert (passed.name, passed.status, passed.value, passed.unit) == (
        "toy.widgets_per_s",
        Status.PASS,
        100.0,
        "widgets/s",
    )
    assert (failed.status, failed.unit) == (Status.FAIL, "widgets/s")
    assert failed.detail == "20 widgets/s on cpu:n1/0, required >= 50: check the widget press"

    # compared: matched by its identity, the drop is a regression; the spread is not compared
    rows, unmatched = compare(fast, slow)
    [row] = rows
    assert (row.metric, row.identity, row.change_pct, row.better) == ("widgets_per_s", "size=8", -80.0, False)
    assert regressions(rows, 10.0) == [row] and unmatched == {"only_before": 0, "only_after": 0}
    assert compare(slow, fast)[0][0].better is True

    # drift: five good runs in history (the least it is judged from), then the slow one is flagged
    db = tmp_path / "history.sqlite"
    for day in (1, 2, 3, 4, 5):
        record(db, _toy_run(100.0, f"2026-11-0{day}T00:00:00+00:00"))
    [drift] = drift_checks(db, slow, HistorySettings())
    assert (drift.name, drift.status, drift.unit) == ("drift.toy.widgets_per_s", Status.WARN, "widgets/s")
    assert drift.threshold["median"] == 100.0 and "min" in drift.threshold
    assert drift_checks(db, _toy_run(99.0, "2026-11-06T00:00:00+00:00"), HistorySettings()) == []

    # rendered: the console (checks and measurements) and the HTML page show value and unit
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, color_system=None)
    print_result(slow, console)
    print_measurements("toy", fast.measurements, console)
    text = buffer.getvalue()
    assert "20 widgets/s" in text and "widgets_per_s=100 widgets/s" in text
    page = render_html(slow)
    assert "toy.widgets_per_s" in page and "20 widgets/s" in page

"""Soak (`gpuval accept --iterations N / --duration T`): the loop, the judgement between iterations, the
summary and its report, and a clean stop on a signal.

The judgement is fed real data in-process: each iteration's health checks and NVML inventory come from a
recording of an H200 node (tests/data/nvml/h200x2.json, replayed by tests/nvml_replay.py), the second
iteration's recording with an ECC counter grown and a hardware slowdown raised, as a GPU that degrades
under a long run would show them. End to end, `gpuval accept --iterations 3` (the cpu profile less its
train check) runs two gloo ranks, and tests/dist/soakhook starts a fault in iteration 2 (told by the
soak's own iterations.jsonl): matmul twenty times slower, as on a GPU whose clocks dropped, read by the
benchmark's own timers; or, through gpuval's NVML layer replaying the H100 recording, an uncorrectable
ECC count that grows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from conftest import cli_env
from nvml_replay import ReplayNvml, load

from gpuval.config import load_profile
from gpuval.errors import RunError, UsageError
from gpuval.health.cuda import CudaDevice, CudaView
from gpuval.health.run import node_health
from gpuval.nvml import snapshot
from gpuval.report.html import render_html
from gpuval.results import Check, Measurement, Result, Status, World, json_schema, verdict
from gpuval.soak import ITERATIONS_FILE, SoakPlan, parse_duration, run_soak, soak_plan, summarize

NODE = "n1"
SOAKHOOK = Path(__file__).parent / "dist" / "soakhook"
REPORTHOOK = Path(__file__).parent / "dist" / "reporthook"
# Each iteration small (one collective size, --quick, and the cpu profile without its train check, which
# no test here reads: the train benchmark imports transformers and trains in each rank, about half an
# iteration's CPU), so three take seconds on two shared cores.
SMALL_SETS = [
    "--quick",
    *("--set", "benchmarks.collectives.min_bytes=1MiB", "--set", "benchmarks.collectives.max_bytes=1MiB"),
]
CPU_PROFILE = Path(__file__).parents[1] / "src" / "gpuval" / "profiles" / "cpu.yaml"


def small(folder: Path) -> list[str]:
    """The accept arguments of one small iteration: the cpu profile less its train check, written into
    `folder`."""
    import yaml

    profile = yaml.safe_load(CPU_PROFILE.read_text(encoding="utf-8"))
    del profile["checks"]["train.tokens_per_s_per_gpu"]
    path = folder / "cpu-no-train.yaml"
    path.write_text(yaml.safe_dump(profile), encoding="utf-8")
    return ["--profile", str(path), *SMALL_SETS]


# --- options ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("1.5h", 5400), ("600", 600), (" 2H ", 7200)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["2x", "h", "", "1h 30m", "-5m", "0s", "inf", "30 minutes"])
def test_bad_durations_are_usage_errors(text):
    with pytest.raises(UsageError, match="--duration"):
        parse_duration(text)


def test_plan_stops_at_whichever_limit_comes_first():
    assert soak_plan(None, None) is None
    both = soak_plan(3, "1m")
    assert [both.wants(k, 10.0) for k in (1, 2, 3, 4)] == [True, True, True, False]
    assert both.wants(2, 61.0) is False
    assert SoakPlan(duration_s=60).wants(1, 1e6) is True  # the first iteration always runs
    assert SoakPlan(duration_s=60).wants(500, 59.0) is True
    with pytest.raises(UsageError, match="--iterations 0"):
        soak_plan(0, None)


# --- the judgement, on recorded NVML answers ---------------------------------------------------------


def _iteration(recording: dict, started_at: str, tflops: float) -> Result:
    """One accept iteration as run_accept makes it: the node's real health checks and NVML inventory from
    the recording, and one benchmark check."""
    profile = load_profile("h200-sxm", ["expect.gpu_count=2"])
    views = [CudaView(devices=tuple(CudaDevice(d["nvmlDeviceGetUUID"], None) for d in recording["devices"]))]
    checks = node_health(
        profile, NODE, library=ReplayNvml(recording), root=Path("/nonexistent"), kmsg=None, cuda=views
    )
    gpus = [gpu.to_json() for gpu in snapshot(ReplayNvml(recording)).gpus]
    scope = f"gpu:{NODE}/0"
    checks.append(
        Check(
            name="matmul.bf16_tflops",
            status=Status.PASS,
            value=tflops,
            threshold={"min": 1},
            unit="TFLOP/s",
            scope=scope,
        )
    )
    return Result(
        verdict=verdict(checks),
        started_at=started_at,
        duration_s=60.0,
        profile=profile.name,
        world=World(size=2, nodes=1, backend="nccl"),
        inventory={"nodes": [{"node": NODE, "gpus": gpus}]},
        measurements=[Measurement(name="matmul", scope=scope, metrics={"bf16_tflops": tflops})],
        checks=checks,
    )


@pytest.fixture(scope="module")
def degrading():
    """Three iterations of an H200 node; in the second GPU 1 logs an uncorrectable ECC error, GPU 0's
    corrected count creeps and GPU 0 throttles (hardware slowdown), gone again in the third."""
    healthy = load("h200x2")
    fault = load("h200x2")
    fault["devices"][1]["nvmlDeviceGetTotalEccErrors(uncorrected,volatile)"] = 1
    fault["devices"][0]["nvmlDeviceGetTotalEccErrors(corrected,volatile)"] = 4
    fault["devices"][0]["nvmlDeviceGetCurrentClocksEventReasons"] |= 0x40  # hw_thermal_slowdown
    fault["devices"][0]["nvmlDeviceGetCurrentClocksThrottleReasons"] |= 0x40
    later = load("h200x2")
    later["devices"][1]["nvmlDeviceGetTotalEccErrors(uncorrected,volatile)"] = 1  # a count never goes back
    later["devices"][0]["nvmlDeviceGetTotalEccErrors(corrected,volatile)"] = 4
    iterations = [
        _iteration(healthy, "2026-11-25T10:00:00+00:00", 900.0),
        _iteration(fault, "2026-11-25T10:01:00+00:00", 890.0),
        _iteration(later, "2026-11-25T10:02:00+00:00", 500.0),
    ]
    profile = load_profile("h200-sxm", ["expect.gpu_count=2"])
    return iterations, summarize(
        iterations,
        SoakPlan(iterations=3),
        None,
        started_at=iterations[0].started_at,
        duration_s=180.0,
        profile=profile,
        world={"size": 2, "nodes": 1, "backend": "nccl"},
    )


def _soak_checks(summary: Result) -> dict[tuple[str, str], Check]:
    return {(c.name, c.scope): c for c in summary.checks if c.name.startswith("soak.")}


def test_recorded_node_is_healthy_in_its_first_iteration(degrading):
    iterations, _ = degrading
    assert [r.verdict for r in iterations][0] is not Status.FAIL, [
        (c.name, c.scope, c.detail) for c in iterations[0].checks if c.status is Status.FAIL
    ]


def test_counters_that_grew_are_named_with_the_first_iteration(degrading):
    _, summary = degrading
    soak = _soak_checks(summary)
    uncorrected = soak[("soak.ecc.uncorrected_volatile", f"gpu:{NODE}/1")]
    assert uncorrected.status is Status.FAIL and uncorrected.value == 1
    assert "first in iteration 2" in uncorrected.detail and "0 -> 1" in uncorrected.detail
    corrected = soak[("soak.ecc.corrected_volatile", f"gpu:{NODE}/0")]
    assert (
        corrected.status is Status.WARN
        and corrected.value == 4
        and "first in iteration 2" in corrected.detail
    )
    assert ("soak.ecc.uncorrected_volatile", f"gpu:{NODE}/0") not in soak  # GPU 0's stayed at 0


def test_a_throttle_that_came_and_went_is_flapping(degrading):
    _, summary = degrading
    reasons = _soak_checks(summary)[("soak.clocks.event_reasons", f"gpu:{NODE}/0")]
    assert reasons.status is Status.FAIL
    assert reasons.detail.startswith("FAIL first in iteration 2 (PASS in iterations 1, 3)")
    assert "hw_thermal_slowdown" in reasons.detail


def test_drift_from_the_first_iteration_uses_the_metrics_direction(degrading):
    _, summary = degrading
    drift = _soak_checks(summary)[("soak.matmul.bf16_tflops", f"gpu:{NODE}/0")]
    tolerance = load_profile("h200-sxm").history.tolerance_pct
    assert drift.status is Status.FAIL and drift.value == 500.0  # 890 is within tolerance, 500 is not
    assert drift.threshold == {"min": pytest.approx(900 * (1 - tolerance / 100)), "baseline": 900.0}
    assert "first in iteration 3" in drift.detail


def test_summary_verdict_headline_and_merged_checks(degrading):
    iterations, summary = degrading
    assert summary.verdict is Status.FAIL
    headline = next(c for c in summary.checks if c.name == "soak.iterations")
    assert headline.status is Status.FAIL and headline.value == 3
    assert headline.detail.startswith("iteration 2 is the first to fail: ")
    assert f"ecc.uncorrected_volatile on gpu:{NODE}/1" in headline.detail
    assert summary.inventory["soak"]["first_failing_iteration"] == 2
    # every iteration's check once, at its worst: ecc on GPU 1 FAILed in iteration 2 and 3
    merged = [
        c for c in summary.checks if c.name == "ecc.uncorrected_volatile" and c.scope == f"gpu:{NODE}/1"
    ]
    assert [c.status for c in merged] == [Status.FAIL]
    assert merged[0].detail.startswith("iteration 3: ")  # the latest of the FAILs; PASS in iteration 1
    jsonschema.validate(json.loads(summary.to_json()), json_schema())


def test_report_plots_the_series_and_names_the_first_failing_iteration(degrading):
    _, summary = degrading
    page = render_html(summary)
    assert '<h2 id="soak">Soak: 3 iterations</h2>' in page
    assert "First failing iteration: 2" in page
    assert page.count("<svg") >= 2 and 'id="soak-metric"' in page and 'id="soak-counter"' in page
    assert "ecc.uncorrected_volatile" in page and "first failing: 2" in page
    single = summary.model_copy(update={"inventory": {"nodes": summary.inventory["nodes"]}})
    assert 'id="soak"' not in render_html(single)  # no section for a single accept


# --- the loop, in-process with a one-rank stand-in ----------------------------------------------------


class _OneRank:
    is_main, rank = True, 0

    def all_gather_object(self, obj):
        return [obj]

    def world_info(self):
        return {"size": 1, "nodes": 1, "backend": "gloo"}


def _passing(iteration: int) -> Result:
    check = Check(name="matmul.fp32_tflops", status=Status.PASS, value=1.0, unit="TFLOP/s", scope="cpu:n/0")
    return Result(
        verdict=Status.PASS,
        started_at=f"t{iteration}",
        duration_s=1.0,
        profile="cpu",
        world=World(),
        checks=[check],
    )


def test_the_loop_stops_at_the_iterations_asked_and_logs_each(tmp_path):
    ran = []
    summary = run_soak(
        _OneRank(),
        SoakPlan(iterations=3, duration_s=3600),
        lambda k: ran.append(k) or _passing(k),
        tmp_path,
        load_profile("cpu"),
    )
    assert ran == [1, 2, 3] and summary.verdict is Status.PASS
    assert [
        json.loads(line)["started_at"] for line in (tmp_path / ITERATIONS_FILE).read_text().splitlines()
    ] == ["t1", "t2", "t3"]
    assert next(c for c in summary.checks if c.name == "soak.iterations").detail.startswith(
        "3 iterations, every one PASS"
    )


def test_a_signal_inside_an_iteration_discards_it_and_summarises_the_others(tmp_path, no_launcher_env):
    def iterate(k: int) -> Result:
        if k == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # raised here, in the middle of the iteration
            pytest.fail("the iteration went on after the signal")
        return _passing(k)

    before = signal.getsignal(signal.SIGTERM)
    summary = run_soak(_OneRank(), SoakPlan(iterations=5), iterate, tmp_path, load_profile("cpu"))
    assert signal.getsignal(signal.SIGTERM) == before  # handlers restored
    assert summary.verdict is Status.ERROR and summary.inventory["soak"]["completed"] == 1
    assert _lines(tmp_path / ITERATIONS_FILE) == 1
    headline = next(c for c in summary.checks if c.name == "soak.iterations")
    assert headline.detail.startswith("stopped by SIGTERM after 1 iteration (5 iterations asked)")


def test_a_run_error_ends_the_soak_with_what_was_measured(tmp_path):
    def iterate(k: int) -> Result:
        if k == 3:
            raise RunError("rank 0 lost contact with the other ranks: Connection closed by peer")
        return _passing(k)

    summary = run_soak(_OneRank(), SoakPlan(duration_s=3600), iterate, tmp_path, load_profile("cpu"))
    assert summary.verdict is Status.ERROR and summary.inventory["soak"]["completed"] == 2
    headline = next(c for c in summary.checks if c.name == "soak.iterations")
    assert "stopped: iteration 3 could not complete: rank 0 lost contact" in headline.detail


# --- end to end: gpuval accept on CPU ------------------------------------------------------------------


def _start(
    tmp_path: Path, args: list[str], slow_summary_s: float | None = None, **fault: str
) -> subprocess.Popen[str]:
    """`gpuval accept ARGS` in the background; FAULT (GPUVAL_TEST_SOAK_* without the prefix, see
    tests/dist/soakhook) starts in iteration 2; `slow_summary_s`: rank 0 takes that much longer to write the
    soak summary's report.html (tests/dist/reporthook)."""
    env = cli_env(OMP_NUM_THREADS="1")
    if slow_summary_s is not None:
        path = os.pathsep.join(filter(None, [str(REPORTHOOK), os.environ.get("PYTHONPATH")]))
        env.update(PYTHONPATH=path, GPUVAL_TEST_SLOW_SOAK_SUMMARY=str(slow_summary_s))
    if fault:
        path = os.pathsep.join(filter(None, [str(SOAKHOOK), env.get("PYTHONPATH")]))
        out = Path(args[args.index("--output") + 1])
        env.update(
            PYTHONPATH=path, GPUVAL_TEST_SOAK_LOG=str(out / ITERATIONS_FILE), GPUVAL_TEST_SOAK_AFTER="1"
        )
        env.update({f"GPUVAL_TEST_SOAK_{key.upper()}": value for key, value in fault.items()})
    return subprocess.Popen(
        [sys.executable, "-m", "gpuval", "accept", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def _wait_for_lines(path: Path, count: int, proc: subprocess.Popen[str], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while _lines(path) < count:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"gpuval ended (exit {proc.returncode}) before iteration {count}:\n{out}{err}")
        assert time.monotonic() < deadline, f"iteration {count} did not end within {timeout} s"
        time.sleep(0.01)


def _finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"gpuval did not end within {timeout} s:\n{out}{err}")
    assert "Traceback" not in out + err, err[-3000:]
    return proc.returncode, out, err


def _summary(out: Path, iterations: int) -> tuple[dict, dict[tuple[str, str], dict]]:
    """The summary and its checks by (name, scope), after checking both files against the schema."""
    lines = (out / ITERATIONS_FILE).read_text().splitlines()
    assert len(lines) == iterations
    for line in lines:
        jsonschema.validate(json.loads(line), json_schema())
    summary = json.loads((out / "result.json").read_text())
    jsonschema.validate(summary, json_schema())
    return summary, {(c["name"], c["scope"]): c for c in summary["checks"]}


@pytest.mark.dist
def test_a_slowdown_in_iteration_2_is_named_and_fails_the_soak(tmp_path):
    """Three iterations on two gloo ranks; in the second, matmul runs at a twentieth of its speed. The
    summary names iteration 2 and matmul's drift, iterations.jsonl holds three full results, exit 1."""
    out = tmp_path / "out"
    proc = _start(tmp_path, [*small(tmp_path), "--iterations", "3", "--output", str(out)], slow="20")
    code, stdout, stderr = _finish(proc)
    assert code == 1, stdout[-3000:] + stderr[-3000:]
    summary, checks = _summary(out, 3)
    iterations = [json.loads(line) for line in (out / ITERATIONS_FILE).read_text().splitlines()]
    # 1 and 3 alone pass their bounds; 2 may too (the cpu profile's floors are far below any CPU)
    assert [r["verdict"] for r in iterations][::2] == ["PASS", "PASS"]

    assert summary["verdict"] == "FAIL"
    assert summary["inventory"]["soak"]["first_failing_iteration"] == 2
    headline = checks[("soak.iterations", "cluster")]
    assert headline["status"] == "FAIL" and headline["value"] == 3
    assert headline["detail"].startswith("iteration 2 is the first to fail: ")
    assert "matmul.fp32_tflops on cpu:" in headline["detail"]
    for rank in (0, 1):
        [matmul] = [
            c
            for (name, scope), c in checks.items()
            if name == "soak.matmul.fp32_tflops" and scope.endswith(f"/{rank}")
        ]
        assert matmul["status"] == "FAIL", matmul
        assert "by more than 60% first in iteration 2" in matmul["detail"], (
            matmul
        )  # the cpu profile's tolerance
    assert "iteration 2 of 3: PASS" in " ".join(stderr.split())  # each iteration said as it ends

    page = (out / "report.html").read_text()
    assert "First failing iteration: 2" in page and 'id="soak-metric"' in page
    assert 'name="soak.iterations"' in (out / "junit.xml").read_text()


@pytest.mark.slow
def test_an_ecc_count_that_grows_in_iteration_2_is_named(tmp_path):
    """NVML replayed from the H100 recording, GPU 0's uncorrectable ECC count up by 2 from iteration 2 on:
    the counter's growth is named with its iteration, through the real NVML layer and inventory. (CUDA
    cannot use the replayed GPU here, so every iteration FAILs cuda.visible and runs no benchmark.)"""
    out = tmp_path / "out"
    args = ["--profile", "h100-sxm", "--set", "expect.gpu_count=1", "--iterations", "3", "--output", str(out)]
    code, stdout, stderr = _finish(_start(tmp_path, args, ecc="2"))
    assert code == 1, stdout[-3000:] + stderr[-3000:]
    summary, checks = _summary(out, 3)
    ecc = checks[
        ("soak.ecc.uncorrected_volatile", next(s for n, s in checks if n == "ecc.uncorrected_volatile"))
    ]
    assert ecc["status"] == "FAIL" and ecc["value"] == 2
    assert "first in iteration 2 (PASS in iteration 1)" in ecc["detail"] and "0 -> 2" in ecc["detail"]
    series = [s for s in summary["inventory"]["soak"]["series"] if s["name"] == "ecc.uncorrected_volatile"]
    assert [s["values"] for s in series] == [[0, 2, 2]] and series[0]["first_bad"] == 2
    assert 'id="soak-counter"' in (out / "report.html").read_text()


@pytest.mark.dist
def test_sigint_after_iteration_1_keeps_it_and_writes_the_summary(tmp_path):
    """Ctrl-C to `gpuval accept --iterations 20` once iteration 1 is written: the launcher stops both
    ranks, rank 0 writes the summary of iteration 1, and the exit code is its verdict: ERROR (3), since a
    soak cut short never PASSes. Rank 0 takes 6 s more than it needs to write the summary's report (a soak
    of many series draws that long; a loaded machine too): the launcher waits for it, not 5 s (its wait for
    a single accept's ranks), which killed rank 0 half-way and lost the summary (exit 130)."""
    out = tmp_path / "out"
    log = out / ITERATIONS_FILE
    out.mkdir()
    (out / "result.json").write_text('{"verdict": "PASS"}')  # an older run's: must not survive
    args = [*small(tmp_path), "--iterations", "20", "--output", str(out)]
    slow = 6
    proc = _start(tmp_path, args, slow_summary_s=slow)
    _wait_for_lines(log, 1, proc)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    code, stdout, stderr = _finish(proc)
    assert time.monotonic() - sent < 15 + slow  # the bound without the delay, and the delay
    assert code == 3, stdout[-3000:] + stderr[-3000:]
    assert "gpuval: interrupted (SIGINT): the soak stopped after 1 iteration(s)" in " ".join(stderr.split())

    [line] = log.read_text().splitlines()
    iteration = json.loads(line)
    jsonschema.validate(iteration, json_schema())
    assert iteration["verdict"] == "PASS"

    summary = json.loads((out / "result.json").read_text())
    jsonschema.validate(summary, json_schema())
    assert summary["verdict"] == "ERROR"
    soak = summary["inventory"]["soak"]
    assert soak["completed"] == 1 and soak["stopped"].startswith("stopped by SIGTERM from gpuval's launcher")
    [headline] = [c for c in summary["checks"] if c["name"] == "soak.iterations"]
    assert headline["status"] == "ERROR"
    assert "after 1 iteration (20 iterations asked)" in headline["detail"]
    assert "the iteration in progress was discarded" in headline["detail"]
    assert summary["measurements"] == iteration["measurements"]  # what was measured is kept
    assert (out / "report.html").exists() and (out / "junit.xml").exists()


@pytest.mark.slow
def test_bad_soak_options_are_usage_errors(gpuval, assert_usage_error, tmp_path):
    proc = gpuval(
        ["accept", "--profile", "cpu", "--duration", "2x", "--output", str(tmp_path / "a")], tmp_path
    )
    assert_usage_error(proc, "--duration '2x'", "90s, 30m, 2h")
    proc = gpuval(
        ["accept", "--profile", "cpu", "--iterations", "0", "--output", str(tmp_path / "b")], tmp_path
    )
    assert_usage_error(proc, "--iterations 0")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()

"""Verdicts for Prometheus (gpuval.textfile, deploy/prometheus): the textfile of a real result, of a FAIL and
of an ERROR, linted by promtool, served by a real node_exporter and read back; the shipped alert rules'
unit tests; the atomic replace; `accept --textfile` and `health --textfile` end to end on this CPU.

promtool (Debian's `prometheus`) and `prometheus-node-exporter` are real binaries: a test that needs one
skips, saying which, where it is not installed. CI installs both (.ci/run), so there they run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from conftest import cli_env

from gpuval.errors import RunError, UsageError
from gpuval.textfile import (
    FILE_NAMES,
    FLEET_VERDICTS,
    fleet_text,
    published,
    result_text,
    unfinished,
    write_textfile,
)

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus"
# A committed real result: 4 H200s, verdict FAIL (host-device copies below their floor, one fp8 matmul).
REAL = ROOT / "benchmarks" / "results" / "2026-11-22-h200x4-device-run" / "accept-quick.json"
CRASH_HOOK = Path(__file__).parent / "dist" / "crashhook"

PROMTOOL = shutil.which("promtool")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus; CI installs it)"
)
needs_node_exporter = pytest.mark.skipif(
    NODE_EXPORTER is None,
    reason="node_exporter is not installed (Debian: apt-get install prometheus-node-exporter; CI "
    "installs it)",
)

# One small multiply: the fastest accept the tests run (tests/test_crash.py's profile).
TINY_PROFILE = (
    "name: tiny\n"
    "expect: {gpu_count: 0}\n"
    "runtime: {timeout_s: 30}\n"
    "checks:\n"
    "  matmul.fp32_tflops: {min: 0.000001}\n"
    "benchmarks:\n"
    "  matmul: {dtypes: [fp32], slow_shapes: [[64, 64, 64]], warmup: 1, repeats: 1, warmup_s: 0,"
    " min_time_s: 0, window_s: 0}\n"
)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(name, labels) -> value of every sample in exposition text, label values unescaped."""
    found = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, inside, value = match.groups()
        labels = {
            key: re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), raw)
            for key, raw in _LABEL.findall(inside or "")
        }
        # an empty label is no label (node_exporter may fill a family's missing labels with "")
        found[(name, frozenset((k, v) for k, v in labels.items() if v))] = float(value)
    return found


def pick(found, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return {key: value for (n, key), value in found.items() if n == name and wanted <= key}


def promtool(*args: str, text: str | None = None) -> tuple[int, str]:
    """promtool ARGS (run in deploy/prometheus, `text` on its stdin): (exit status, stdout + stderr)."""
    assert PROMTOOL is not None
    proc = subprocess.run(
        [PROMTOOL, *args], input=text, cwd=RULES, capture_output=True, text=True, timeout=60
    )
    return proc.returncode, proc.stdout + proc.stderr


def promtool_lint(text: str) -> tuple[int, str]:
    return promtool("check", "metrics", text=text)


def _real() -> dict:
    return json.loads(REAL.read_text())


def _synthetic(verdict: str, checks: list[dict], profile: str = "h100-sxm") -> dict:
    return {
        "schema": "gpuval.result/v1",
        "verdict": verdict,
        "started_at": "2026-12-06T10:00:00+00:00",
        "duration_s": 31.5,
        "profile": profile,
        "world": {"size": 1, "nodes": 1, "backend": "nccl"},
        "inventory": {"nodes": [{"node": "n1", "gpus": [{"index": 0, "uuid": "GPU-0000"}]}]},
        "checks": checks,
    }


# --- the text ------------------------------------------------------------------------------------------


def test_a_real_result_reads_as_its_verdict_checks_and_values():
    document = _real()
    found = samples(result_text(document, "accept"))
    run = {"command": "accept", "profile": "h200-sxm"}
    verdicts = pick(found, "gpuval_run_verdict", **run)
    assert {dict(k)["verdict"]: v for k, v in verdicts.items()} == {"PASS": 0, "FAIL": 1, "ERROR": 0}
    assert pick(found, "gpuval_run_duration_seconds", **run) == {frozenset(run.items()): 26.236}
    started = datetime(2026, 11, 22, 7, 39, 37, tzinfo=timezone.utc).timestamp()
    assert list(pick(found, "gpuval_run_timestamp_seconds").values()) == [started]
    # one status series per check, each carrying the check's own status
    statuses = pick(found, "gpuval_check_status")
    assert len(statuses) == len({(c["name"], c["scope"]) for c in document["checks"]})
    for check in document["checks"]:
        (labels,) = [
            k for k in statuses if dict(k)["check"] == check["name"] and dict(k)["scope"] == check["scope"]
        ]
        assert dict(labels)["status"] == check["status"]
    failed = pick(found, "gpuval_run_checks", status="FAIL")
    assert list(failed.values()) == [sum(c["status"] == "FAIL" for c in document["checks"])]
    # a GPU's check names the GPU's UUID from the inventory; a cluster check names none
    uuid = document["inventory"]["nodes"][0]["gpus"][2]["uuid"]
    fp8 = pick(found, "gpuval_check_value_flops", check="matmul.fp8_tflops", scope="gpu:vm/2")
    assert [dict(k)["gpu_uuid"] for k in fp8] == [uuid]
    assert list(fp8.values()) == [pytest.approx(1170.2908145906497e12)]  # TFLOP/s -> FLOP/s
    busbw = pick(found, "gpuval_check_value_bytes_per_second", check="all_reduce.busbw_gbps")
    assert "gpu_uuid" not in dict(next(iter(busbw)))
    assert list(busbw.values()) == [pytest.approx(353.0037057739811e9)]  # GB/s -> bytes/s
    pct = pick(found, "gpuval_check_value_ratio", check="outliers.matmul_pct")
    assert list(pct.values()) == [pytest.approx(0.01824473192293336)]  # % -> ratio
    # nothing free-form in a label: no check's detail, no time
    text = result_text(document, "accept")
    assert all(c["detail"] not in text for c in document["checks"] if len(c["detail"]) > 20)


def test_help_and_type_precede_every_family_and_no_name_ends_total():
    text = result_text(_real(), "accept") + fleet_text(_fleet())
    names = {name for name, _ in samples(text)}
    for name in names:
        assert f"# HELP {name} " in text and f"# TYPE {name} gauge\n" in text
        assert name.startswith("gpuval_") and not name.endswith("_total")
    assert not re.search(r"\} \S+ \d+$", text, re.MULTILINE), "a sample with a timestamp"


def test_label_values_are_escaped_and_read_back_whole():
    profile = 'we"ird\\pro\nfile'
    check = {"name": "expect.gpu_count", "status": "FAIL", "value": 7, "unit": "GPUs", "scope": "node:n1"}
    found = samples(result_text(_synthetic("FAIL", [check], profile=profile), "health"))
    assert pick(found, "gpuval_run_verdict", profile=profile, verdict="FAIL", command="health")
    assert list(pick(found, "gpuval_check_value", check="expect.gpu_count").values()) == [7.0]


def test_an_error_without_a_result_is_error_with_what_is_known():
    began = datetime.now(timezone.utc) - timedelta(seconds=12)
    found = samples(result_text(unfinished("accept", "h100-sxm", began, checks=["run.result"]), "accept"))
    verdicts = {
        dict(k)["verdict"]: v for k, v in pick(found, "gpuval_run_verdict", profile="h100-sxm").items()
    }
    assert verdicts == {"PASS": 0, "FAIL": 0, "ERROR": 1}
    (duration,) = pick(found, "gpuval_run_duration_seconds").values()
    assert 11 < duration < 60
    assert pick(found, "gpuval_check_status", check="run.result", status="ERROR")


def test_a_value_in_an_unknown_unit_is_left_out_and_its_status_kept():
    check = {"name": "odd.thing", "status": "PASS", "value": 3.0, "unit": "furlongs", "scope": "cluster"}
    found = samples(result_text(_synthetic("PASS", [check]), "accept"))
    assert pick(found, "gpuval_check_status", check="odd.thing", status="PASS")
    assert not [key for key in found if key[0].startswith("gpuval_check_value")]


def _fleet() -> dict:
    return {
        "schema": "gpuval.fleet/v1",
        "created_at": "2026-12-06T10:00:00+00:00",
        "nodes": [
            {"name": "n001", "verdict": "PASS", "failed": [], "outliers": [], "source": "a/result.json"},
            {
                "name": "n017",
                "verdict": "PASS",
                "outliers": [
                    {
                        "check": "matmul.bf16_tflops",
                        "scope": "gpu:n017/3",
                        "value": 644.0,
                        "fleet_median": 700.0,
                        "deviation_pct": -8.0,
                        "robust_z": -6.1,
                    },
                ],  # fmt: skip
            },
            {"name": "n023", "verdict": "FAIL", "failed": [{"check": "ecc.uncorrected_volatile"}]},
            {"name": "n040", "verdict": "MISSING"},
            {"name": "n041", "outliers": [{"check": "membw.copy_tbps", "deviation_pct": -5.0}]},  # no verdict
            {"verdict": "PASS"},  # no name: left out
        ],
        "drain": "n023",
    }


def test_fleet_text_per_node_verdict_and_outliers_tolerating_missing_keys():
    found = samples(fleet_text(_fleet()))
    assert pick(found, "gpuval_fleet_node_verdict", node="n023", verdict="FAIL") == {
        frozenset({("node", "n023"), ("verdict", "FAIL")}): 1.0
    }
    assert sum(pick(found, "gpuval_fleet_node_verdict", node="n040").values()) == 1.0  # MISSING
    assert sum(pick(found, "gpuval_fleet_node_verdict", node="n041").values()) == 0.0  # no verdict known
    counts = {dict(k)["verdict"]: v for k, v in pick(found, "gpuval_fleet_nodes").items()}
    assert counts == {"PASS": 2, "WARN": 0, "FAIL": 1, "ERROR": 0, "MISSING": 1}
    assert list(pick(found, "gpuval_fleet_timestamp_seconds").values()) == [1796551200.0]
    (ratio,) = pick(found, "gpuval_fleet_outlier_median_ratio", node="n017", scope="gpu:n017/3").values()
    assert ratio == pytest.approx(0.92)
    assert list(pick(found, "gpuval_fleet_outlier_robust_z", node="n017").values()) == [-6.1]
    # deviation_pct alone still gives the ratio; no robust_z, no z series
    assert list(pick(found, "gpuval_fleet_outlier_median_ratio", node="n041").values()) == [
        pytest.approx(0.95)
    ]
    assert not pick(found, "gpuval_fleet_outlier_robust_z", node="n041")
    assert fleet_text({}).count("gpuval_fleet_nodes{") == 5  # an empty document: counts of 0, no error


def test_fleet_text_reads_the_keys_the_published_fleet_schema_has():
    """fleet_text reads fleet.json by its key names: the shipped schema (gpuval schema fleet) still has them,
    with the verdicts it writes."""
    schema = json.loads((ROOT / "src" / "gpuval" / "schema" / "fleet.v1.json").read_text())
    node, outlier = schema["$defs"]["FleetNodeEntry"], schema["$defs"]["FleetOutlier"]
    assert {"created_at", "nodes"} <= set(schema["properties"])
    assert {"name", "verdict", "outliers"} <= set(node["properties"])
    assert {"check", "scope", "value", "fleet_median", "deviation_pct", "robust_z"} <= set(
        outlier["properties"]
    )
    assert set(node["properties"]["verdict"]["enum"]) <= set(FLEET_VERDICTS)


def test_every_metric_the_rules_name_is_one_gpuval_writes():
    written = {name for name, _ in samples(result_text(_real(), "accept") + fleet_text(_fleet()))}
    named = set(re.findall(r"\bgpuval_[a-z_]+\b", (RULES / "gpuval.rules.yml").read_text()))
    assert named and named <= written, named - written


# --- promtool ------------------------------------------------------------------------------------------


@needs_promtool
@pytest.mark.parametrize(
    "text",
    [
        pytest.param(lambda: result_text(_real(), "accept"), id="real-h200x4-FAIL"),
        pytest.param(
            lambda: result_text(
                _synthetic(
                    "FAIL",
                    [
                        {
                            "name": "matmul.bf16_tflops",
                            "status": "FAIL",
                            "value": 512.5,
                            "unit": "TFLOP/s",
                            "scope": "gpu:n1/0",
                            "threshold": {"min": 650},
                        },
                        {
                            "name": "clocks.temperature",
                            "status": "PASS",
                            "value": 41.0,
                            "unit": "C",
                            "scope": "gpu:n1/0",
                        },
                        {
                            "name": "train.step_ms",
                            "status": "WARN",
                            "value": 12.5,
                            "unit": "ms",
                            "scope": "cluster",
                        },
                        {
                            "name": "expect.gpu_memory_gib",
                            "status": "PASS",
                            "value": 79.6,
                            "unit": "GiB",
                            "scope": "gpu:n1/0",
                        },
                        {"name": "ecc.enabled", "status": "SKIP", "scope": "gpu:n1/0"},
                    ],  # fmt: skip
                    profile='odd "name"',
                ),
                "health",
            ),
            id="synthetic-FAIL",
        ),
        pytest.param(
            lambda: result_text(
                unfinished("accept", "cpu", datetime.now(timezone.utc), ["run.result"]), "accept"
            ),
            id="ERROR-without-result",
        ),
        pytest.param(lambda: fleet_text(_fleet()), id="fleet"),
    ],
)
def test_promtool_check_metrics_is_clean(text):
    status, said = promtool_lint(text())
    assert (status, said.strip()) == (0, "")


@needs_promtool
@pytest.mark.parametrize(
    ("name", "complaint"),
    [
        ("gpuval_run_duration_milliseconds", 'use base unit "seconds"'),
        ("gpuval_run_duration_seconds_total", 'non-counter metrics should not have "_total" suffix'),
    ],
)
def test_promtool_would_catch_a_convention_broken(name, complaint):
    """The lint above is not vacuous: a non-base unit, and `_total` on a gauge, are reported."""
    status, said = promtool_lint(result_text(_real(), "accept").replace("gpuval_run_duration_seconds", name))
    assert status != 0 and complaint in said


@needs_promtool
def test_the_shipped_rules_check_and_their_unit_tests_pass():
    status, said = promtool("check", "rules", "gpuval.rules.yml")
    assert status == 0 and "SUCCESS: 4 rules found" in said, said
    status, said = promtool("test", "rules", "gpuval.rules.test.yml")
    assert status == 0 and "SUCCESS" in said, said


# --- node_exporter ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def node_exporter(tmp_path):
    """(the textfile folder, a function reading /metrics) of a real node_exporter on loopback, textfile
    collector only; killed after the test."""
    folder = tmp_path / "textfile"
    folder.mkdir()
    port = _free_port()
    log = (tmp_path / "node_exporter.log").open("w")
    proc = subprocess.Popen(
        [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
         "--collector.textfile", f"--collector.textfile.directory={folder}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip

    def scrape() -> str:
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    return response.read().decode()
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError((tmp_path / "node_exporter.log").read_text()) from None
                time.sleep(0.1)

    try:
        yield folder, scrape
    finally:
        proc.kill()
        proc.wait(timeout=10)
        log.close()


def _matmul(status: str, tflops: float) -> dict:
    return {
        "name": "matmul.bf16_tflops",
        "status": status,
        "value": tflops,
        "unit": "TFLOP/s",
        "scope": "gpu:n1/0",
    }


@needs_node_exporter
def test_node_exporter_serves_the_verdict_back(node_exporter):
    folder, scrape = node_exporter
    profile = 'odd "name" \\ here'
    accept = result_text(_synthetic("FAIL", [_matmul("FAIL", 512.5)], profile=profile), "accept")
    write_textfile(folder, FILE_NAMES["accept"], accept)
    # health's file and the fleet's beside it: one folder, no series twice
    health = result_text(_synthetic("PASS", [_matmul("PASS", 700.0)], profile=profile), "health")
    write_textfile(folder, FILE_NAMES["health"], health)
    write_textfile(folder, FILE_NAMES["fleet"], fleet_text(_fleet()))
    served = samples(scrape())
    assert list(pick(served, "node_textfile_scrape_error").values()) == [0.0]
    assert pick(served, "gpuval_run_verdict", command="accept", profile=profile, verdict="FAIL") == {
        frozenset({("command", "accept"), ("profile", profile), ("verdict", "FAIL")}): 1.0
    }
    assert list(pick(served, "gpuval_run_verdict", command="health", verdict="PASS").values()) == [1.0]
    (value,) = pick(served, "gpuval_check_value_flops", command="accept", gpu_uuid="GPU-0000").values()
    assert value == 512.5e12
    # every sample of every file as written, labels and value: node_exporter keeps the first of two
    # same-labelled series from two files and drops the other without a scrape error, so the `command`
    # label is what keeps health's PASS from hiding accept's FAIL
    for key, value in (samples(accept) | samples(health) | samples(fleet_text(_fleet()))).items():
        assert served[key] == value, key
    # the staleness rule's file pattern matches the label this node_exporter gives the file
    files = [dict(k)["file"] for k in pick(served, "node_textfile_mtime_seconds")]
    assert len(files) == 3
    rule = (RULES / "gpuval.rules.yml").read_text()
    pattern = re.search(r'file=~"([^"]+)"', rule).group(1).replace("\\\\", "\\")
    assert [f for f in files if re.fullmatch(pattern, f)] == [
        f for f in files if f.endswith("/gpuval.prom") or f == "gpuval.prom"
    ]


# --- the atomic write and the run's end ----------------------------------------------------------------


def test_a_failing_write_leaves_the_old_file_whole_and_no_temp_file(tmp_path, monkeypatch):
    old = write_textfile(tmp_path, "gpuval.prom", "gpuval_old 1\n")

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("gpuval.atomic.os.fsync", full_disk)
    with pytest.raises(OSError):
        write_textfile(tmp_path, "gpuval.prom", result_text(_real(), "accept"))
    assert old.read_text() == "gpuval_old 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpuval.prom"]


def _began() -> datetime:
    return datetime.now(timezone.utc) - timedelta(seconds=5)


def test_published_writes_this_runs_result(tmp_path):
    began = _began()
    (tmp_path / "out").mkdir()
    with published(tmp_path / "tf", "accept", tmp_path / "out", "tiny", began):
        document = _synthetic("PASS", [{"name": "x.y", "status": "PASS", "scope": "cluster"}], profile="tiny")
        document["started_at"] = began.isoformat(timespec="seconds")
        (tmp_path / "out" / "result.json").write_text(json.dumps(document))
    found = samples((tmp_path / "tf" / "gpuval.prom").read_text())
    assert list(pick(found, "gpuval_run_verdict", verdict="PASS").values()) == [1.0]


def test_published_says_error_for_a_run_that_left_only_an_older_result(tmp_path):
    (tmp_path / "out").mkdir()
    older = _synthetic("PASS", [{"name": "x.y", "status": "PASS", "scope": "cluster"}], profile="tiny")
    (tmp_path / "out" / "result.json").write_text(json.dumps(older))  # 2026-12-06T10:00, before this run
    with (
        pytest.raises(KeyboardInterrupt),
        published(tmp_path / "tf", "health", tmp_path / "out", "tiny", _began()),
    ):
        raise KeyboardInterrupt
    found = samples((tmp_path / "tf" / "gpuval-health.prom").read_text())
    assert list(pick(found, "gpuval_run_verdict", verdict="ERROR", command="health").values()) == [1.0]
    assert pick(found, "gpuval_check_status", check="run.result", status="ERROR")


def test_published_writes_nothing_for_bad_input_and_fails_the_run_when_it_cannot_write(tmp_path):
    with pytest.raises(UsageError), published(tmp_path / "tf", "accept", tmp_path, "tiny", _began()):
        raise UsageError("bad input")
    assert not (tmp_path / "tf").exists()
    (tmp_path / "file").write_text("")
    with (
        pytest.raises(RunError, match="--textfile"),
        published(tmp_path / "file", "accept", tmp_path, "t", _began()),
    ):
        pass


# --- the commands --------------------------------------------------------------------------------------


def _check_against_result(textfile: Path, result: dict, command: str) -> dict:
    found = samples(textfile.read_text())
    run = {"command": command, "profile": result["profile"]}
    assert [dict(k)["verdict"] for k, v in pick(found, "gpuval_run_verdict", **run).items() if v] == [
        result["verdict"]
    ]
    for check in result["checks"]:
        assert pick(
            found, "gpuval_check_status", check=check["name"], scope=check["scope"], status=check["status"]
        )
    return found


def test_accept_textfile_end_to_end_fail(gpuval, tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY_PROFILE)
    args = ["accept", "--profile", "tiny.yaml", "--nproc", "1", "--history", "none", "--output", "out"]
    proc = gpuval([*args, "--textfile", "tf", "--set", "checks.matmul.fp32_tflops.min=1e9"], tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    found = _check_against_result(tmp_path / "tf" / "gpuval.prom", result, "accept")
    matmul = next(c for c in result["checks"] if c["name"] == "matmul.fp32_tflops")
    assert pick(found, "gpuval_check_status", check="matmul.fp32_tflops", status="FAIL")
    values = pick(found, "gpuval_check_value_flops", check="matmul.fp32_tflops")
    assert list(values.values()) == [pytest.approx(matmul["value"] * 1e12)]
    assert [p.name for p in (tmp_path / "tf").iterdir()] == ["gpuval.prom"]  # no temp file left
    if PROMTOOL:
        assert promtool_lint((tmp_path / "tf" / "gpuval.prom").read_text()) == (0, "")


def test_accept_textfile_says_error_when_a_rank_crashes(tmp_path):
    from conftest import run_cli

    (tmp_path / "tiny.yaml").write_text(TINY_PROFILE)
    env = cli_env(
        PYTHONPATH=os.pathsep.join(filter(None, [str(CRASH_HOOK), os.environ.get("PYTHONPATH")])),
        GPUVAL_TEST_CRASH="rank0",
    )
    args = ["accept", "--profile", "tiny.yaml", "--nproc", "1", "--history", "none", "--output", "out"]
    proc = run_cli([*args, "--textfile", "tf"], tmp_path, env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["verdict"] == "ERROR"
    _check_against_result(tmp_path / "tf" / "gpuval.prom", result, "accept")


def test_health_textfile_end_to_end_pass(gpuval, tmp_path):
    proc = gpuval(["health", "--output", "out", "--textfile", "tf"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    _check_against_result(tmp_path / "tf" / "gpuval-health.prom", result, "health")
    assert not (tmp_path / "tf" / "gpuval.prom").exists()


def test_a_textfile_folder_that_cannot_be_written_is_bad_input(gpuval, assert_usage_error, tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY_PROFILE)
    (tmp_path / "plain").write_text("")
    args = ["accept", "--profile", "tiny.yaml", "--nproc", "1", "--history", "none", "--output", "out"]
    proc = gpuval([*args, "--textfile", "plain/sub"], tmp_path)
    assert_usage_error(proc, "pass --textfile")
    assert not (tmp_path / "out" / "result.json").exists()

"""`gpuval accept` end to end on CPU (gloo), and the planning and expect checks behind it.

The two-rank run goes through torchrun's agent exactly as a user's `gpuval accept` does; the FAIL and
ERROR runs use one rank (`--nproc 1`) and `--quick` to stay fast on a 2-core runner.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from gpuval.bench.run import plan_benchmarks
from gpuval.config import load_profile
from gpuval.errors import UsageError
from gpuval.health.gpu import expect_checks
from gpuval.results import Status, generated_schema, json_schema

ALL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "sendrecv")


def _read(directory: Path) -> tuple[dict, ET.Element]:
    document = json.loads((directory / "result.json").read_text())
    jsonschema.validate(document, json_schema())
    root = ET.parse(directory / "junit.xml").getroot()
    suites = root.findall("testsuite")
    assert len(suites) == 1
    return document, suites[0]


def _no_traceback(proc) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def _junit_matches(document: dict, suite: ET.Element) -> None:
    """junit.xml holds one testcase per check, with failure/error/skipped exactly where result.json says."""
    checks = document["checks"]
    count = {status: sum(1 for c in checks if c["status"] == status) for status in ("FAIL", "ERROR", "SKIP")}
    assert suite.get("tests") == str(len(checks))
    assert suite.get("failures") == str(count["FAIL"])
    assert suite.get("errors") == str(count["ERROR"])
    assert suite.get("skipped") == str(count["SKIP"])
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [(c["scope"], c["name"]) for c in checks]
    tags = {"FAIL": "failure", "ERROR": "error", "SKIP": "skipped"}
    for case, check in zip(cases, checks, strict=True):
        for status, tag in tags.items():
            assert (case.find(tag) is not None) == (check["status"] == status), (check, tag)


def test_shipped_schema_matches_the_model():
    # The file users validate against and the pydantic model that writes result.json cannot drift apart.
    assert json_schema() == generated_schema()


# --- PASS: two ranks through torchrun's agent -----------------------------------------------------


@pytest.fixture
def two_ranks(cpu_accept_run):
    return cpu_accept_run  # (proc, out): tests/conftest.py's one accept run, which other modules read too


@pytest.mark.dist
@pytest.mark.torch_version  # the lowest torch runs one two-rank accept end to end
def test_two_rank_accept_passes(two_ranks):
    proc, out = two_ranks
    _no_traceback(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = sorted(p.name for p in out.iterdir())
    # the reports, and per rank the libraries' warnings when they raised any (gpuval/quiet.py); no tmp
    reports = [name for name in written if not re.fullmatch(r"third_party(\.rank\d+)?\.log", name)]
    assert reports == ["junit.xml", "report.html", "result.json"], written
    assert "Warning" not in proc.stderr, proc.stderr[-2000:]
    # the console summary is for people and rich wraps it at the terminal width: compare the words; the
    # folder is said once (three full paths took three lines at 80 columns)
    written = f"wrote result.json, junit.xml and report.html to {out}"
    assert written in " ".join(proc.stdout.split())


@pytest.mark.dist
@pytest.mark.torch_version  # the lowest torch runs one two-rank accept end to end
def test_two_rank_result_json(two_ranks):
    proc, out = two_ranks
    document, _ = _read(out)
    assert document["schema"] == "gpuval.result/v1"
    assert document["verdict"] == "PASS"
    assert document["profile"] == "cpu"  # picked for a machine without GPUs
    assert document["world"] == {"size": 2, "nodes": 1, "backend": "gloo"}
    assert document["settings"]["quick"] is True
    assert document["command"][:2] == ["gpuval", "accept"]
    benchmark = bench_checks(document)
    assert benchmark and all(c["status"] in ("PASS", "WARN") for c in benchmark), benchmark
    # no NVIDIA driver here: the GPU health families SKIP with that reason; count, SDC and the shared
    # directory the run names can still pass
    passing = ("expect.gpu_count", "sdc.bitwise", "fleet.shared_fs")
    for check in document["checks"]:
        if check not in benchmark and check["name"] not in passing:
            assert check["status"] == "SKIP", check
            assert "no NVIDIA driver" in check["detail"] or "InfiniBand" in check["detail"], check
    assert {c["status"] for c in document["checks"] if c["name"] in passing} == {"PASS"}
    assert {c["name"] for c in document["checks"] if c["name"] in passing} == set(passing)


def bench_checks(document: dict) -> list[dict]:
    """The checks that judge benchmarks, without the health checks that run before them."""
    from gpuval.health import all_checks

    health = set(all_checks()) | {"expect", "gpu", "fleet"}
    return [c for c in document["checks"] if c["name"].split(".")[0] not in health]


@pytest.mark.dist
@pytest.mark.torch_version  # the lowest torch runs one two-rank accept end to end
def test_two_rank_measurements(two_ranks):
    _, out = two_ranks
    document, _ = _read(out)
    measurements = document["measurements"]
    for op in ALL_OPS:
        mine = [m for m in measurements if m["name"] == op]
        assert mine, f"no {op} measurement"
        assert {m["scope"] for m in mine} == {"cluster"}
        assert 2**20 in {m["params"]["bytes"] for m in mine}, (
            f"{op} not measured at the 1 MiB the profile checks"
        )
        for m in mine:
            assert m["params"]["ranks"] == 2
            assert m["metrics"]["wrong_elements"] == 0
            assert m["metrics"]["busbw_gbps"] > 0
    matmul_scopes = sorted(m["scope"] for m in measurements if m["name"] == "matmul")
    assert len(matmul_scopes) == 2
    assert all(scope.startswith("cpu:") for scope in matmul_scopes)
    assert [scope.rsplit("/", 1)[1] for scope in matmul_scopes] == ["0", "1"]
    assert all(m["metrics"]["fp32_tflops"] > 0 for m in measurements if m["name"] == "matmul")
    assert len([m for m in measurements if m["name"] == "membw"]) == 2


@pytest.mark.dist
@pytest.mark.torch_version  # the lowest torch runs one two-rank accept end to end
def test_two_rank_checks_cover_the_profile(two_ranks):
    _, out = two_ranks
    document, _ = _read(out)
    names = [c["name"] for c in document["checks"]]
    for check in load_profile("cpu").checks:
        assert check in names, f"profile check {check} missing from result.json"
    assert names.count("matmul.fp32_tflops") == 2  # one per rank's CPU
    for op in ALL_OPS:
        correct = [c for c in document["checks"] if c["name"] == f"{op}.correct"]
        assert len(correct) == 1 and correct[0]["status"] == "PASS"
    busbw = {c["name"]: c for c in document["checks"] if c["name"].endswith(".busbw_gbps")}
    assert busbw["all_reduce.busbw_gbps"]["threshold"] == {"min": 0.01, "bytes": 2**20}


@pytest.mark.dist
@pytest.mark.torch_version  # the lowest torch runs one two-rank accept end to end
def test_two_rank_junit(two_ranks):
    _, out = two_ranks
    document, suite = _read(out)
    _junit_matches(document, suite)
    assert suite.get("failures") == "0" and suite.get("errors") == "0"


# --- FAIL: a threshold no CPU reaches -------------------------------------------------------------


@pytest.fixture(scope="module")
def failing(gpuval, tmp_path_factory):
    # No --output: the default gpuval-results/accept-<UTC stamp>/ under the working directory is used.
    work = tmp_path_factory.mktemp("accept-fail")
    proc = gpuval(["accept", "--quick", "--nproc", "1", "--set", "checks.matmul.fp32_tflops.min=1e9"], work)
    written = list((work / "gpuval-results").glob("accept-*")) if (work / "gpuval-results").exists() else []
    return proc, written


@pytest.mark.slow
def test_fail_exits_1(failing):
    proc, written = failing
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(written) == 1, "expected one gpuval-results/accept-<stamp> directory"


@pytest.mark.slow
def test_fail_result_names_the_cpu_scope(failing):
    _, written = failing
    document, suite = _read(written[0])
    assert document["verdict"] == "FAIL"
    assert document["world"]["size"] == 1
    failed = [c for c in document["checks"] if c["status"] == "FAIL"]
    assert [c["name"] for c in failed] == ["matmul.fp32_tflops"]
    scope = failed[0]["scope"]
    assert scope.startswith("cpu:") and scope.endswith("/0")
    assert scope in failed[0]["detail"]
    assert failed[0]["threshold"]["min"] == 1e9
    assert 0 < failed[0]["value"] < 1e9
    _junit_matches(document, suite)
    failures = [case for case in suite.findall("testcase") if case.find("failure") is not None]
    assert [(case.get("classname"), case.get("name")) for case in failures] == [(scope, "matmul.fp32_tflops")]
    assert scope in failures[0].find("failure").get("message")


# --- ERROR: a check whose measurement never exists ------------------------------------------------


_SMALL_MEMBW = "benchmarks:\n  membw: {device_bytes: 1MiB, warmup: 0, repeats: 1}\n"


@pytest.mark.slow
def test_error_exits_3_and_json_goes_to_stdout(gpuval, write_profile, tmp_path):
    # h2d_gbps is a declared membw metric that only a GPU measures: on this CPU there is nothing to judge
    path = write_profile(
        "name: err\nchecks:\n  membw.h2d_gbps: {min: 1}\n  membw.copy_tbps: {min: 1e-9}\n" + _SMALL_MEMBW
    )
    out = tmp_path / "out"
    proc = gpuval(
        ["accept", "--profile", str(path), "--quick", "--nproc", "1", "--json", "--output", str(out)],
        tmp_path,
    )
    _no_traceback(proc)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    document, suite = _read(out)
    assert json.loads(proc.stdout) == document  # --json prints exactly the file
    assert document["verdict"] == "ERROR"
    assert document["profile"] == "err"
    statuses = {c["name"]: c["status"] for c in bench_checks(document)}
    assert statuses == {"membw.h2d_gbps": "ERROR", "membw.copy_tbps": "PASS"}
    error = next(c for c in document["checks"] if c["status"] == "ERROR")
    assert "h2d_gbps" in error["detail"] and error["unit"] == "GB/s"
    assert error["value"] is None
    _junit_matches(document, suite)
    assert suite.get("errors") == "1" and suite.get("failures") == "0"


@pytest.mark.slow
def test_fail_outranks_error_in_the_exit_code(gpuval, write_profile, tmp_path):
    path = write_profile(
        "name: both\nchecks:\n  membw.h2d_gbps: {min: 1}\n  membw.copy_tbps: {min: 1e9}\n" + _SMALL_MEMBW
    )
    out = tmp_path / "out"
    proc = gpuval(
        ["accept", "--profile", str(path), "--quick", "--nproc", "1", "--output", str(out)], tmp_path
    )
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    document, suite = _read(out)
    assert document["verdict"] == "FAIL"
    assert sorted(c["status"] for c in bench_checks(document)) == ["ERROR", "FAIL"]
    _junit_matches(document, suite)


# --- planning: which benchmarks a profile needs (bad ones are exit-2 usage errors) ----------------


def _profile(write_profile, text: str):
    return load_profile(str(write_profile(text)))


def test_cpu_profile_plans_collectives_matmul_membw_train():
    plan = plan_benchmarks(load_profile("cpu"), quick=True, on_gpu=False)
    assert list(plan) == ["collectives", "matmul", "membw", "train"]  # train: the fine-tune step (issue 5)
    assert 2**20 in plan["collectives"].extra_sizes  # the size the thresholds name is always measured


def test_threshold_size_outside_the_sweep_is_added(write_profile):
    profile = _profile(write_profile, "name: x\nchecks:\n  all_reduce.busbw_gbps: {min: 1, bytes: 3MiB}\n")
    plan = plan_benchmarks(profile, quick=True, on_gpu=False)
    assert list(plan) == ["collectives"]
    assert plan["collectives"].extra_sizes == [3 * 2**20]


def test_benchmark_listed_without_a_check_runs(write_profile):
    profile = _profile(write_profile, "name: x\nbenchmarks:\n  membw: {repeats: 2}\n")
    plan = plan_benchmarks(profile, quick=False, on_gpu=False)
    assert list(plan) == ["membw"]
    assert plan["membw"].repeats == 2


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("checks:\n  warp_drive.speed_gbps: {min: 1}\n", ("nothing measures 'warp_drive'",)),
        ("checks:\n  membw.copy_tbs: {min: 1}\n", ("no metric 'copy_tbs'", "did you mean 'membw.copy_tbps'")),
        ("checks:\n  outliers.train_pct: {max: 5}\n", ("compares no benchmark", "outliers.matmul_pct")),
        ("checks:\n  outliers.matmul: {max: 5}\n", ("compares no benchmark",)),
        ("benchmarks:\n  matmull: {}\n", ("benchmarks.matmull: unknown benchmark", "matmul, membw")),
        ("benchmarks:\n  matmul: {repeatz: 2}\n", ("unknown key 'repeatz'", "did you mean 'repeats'")),
        ("benchmarks:\n  membw: {device_bytes: lots}\n", ("'device_bytes'", "not a byte size")),
        ("benchmarks:\n  collectives: {ops: [all_reduse]}\n", ("'ops.0'", "all_reduse")),
    ],
)
def test_bad_plans_are_usage_errors(write_profile, text, fragments):
    profile = _profile(write_profile, "name: x\n" + text)
    with pytest.raises(UsageError) as info:
        plan_benchmarks(profile, quick=True, on_gpu=False)
    for fragment in fragments:
        assert fragment in str(info.value)


# --- expect checks (no GPU needed: the inventory is a plain dict) ---------------------------------


def _node(name: str, gpus: list[tuple[str, float]]) -> dict:
    return {
        "node": name,
        "gpu_count": len(gpus),
        "gpus": [
            {"index": i, "name": gpu, "memory_total_bytes": int(gib * 2**30)}
            for i, (gpu, gib) in enumerate(gpus)
        ],
    }


def test_expect_checks_pass_on_matching_hardware():
    checks = expect_checks(load_profile("h200-sxm"), [_node("n1", [("NVIDIA H200", 140.4)] * 8)])
    assert len(checks) == 1 + 8 * 2
    assert {c.status for c in checks} == {Status.PASS}


def test_expect_checks_name_the_missing_gpu_node_and_wrong_gpu():
    gpus = [("NVIDIA H200", 140.4)] * 6 + [("NVIDIA H200 NVL", 140.4), ("NVIDIA H200", 100.0)]
    checks = expect_checks(
        load_profile("h200-sxm"), [_node("good", [("NVIDIA H200", 140.4)] * 8), _node("bad", gpus)]
    )
    failed = [(c.name, c.scope) for c in checks if c.status is Status.FAIL]
    assert failed == [("expect.gpu_name", "gpu:bad/6"), ("expect.gpu_memory_gib", "gpu:bad/7")]
    checks = expect_checks(load_profile("h200-sxm"), [_node("short", [("NVIDIA H200", 140.4)] * 7)])
    count = next(c for c in checks if c.name == "expect.gpu_count")
    assert (count.status, count.value, count.scope) == (Status.FAIL, 7, "node:short")
    assert "7 GPUs visible, 8 expected" in count.detail


def test_cpu_profile_expects_no_gpus():
    checks = expect_checks(load_profile("cpu"), [_node("cpu-box", [])])
    assert [(c.name, c.status, c.scope) for c in checks] == [
        ("expect.gpu_count", Status.PASS, "node:cpu-box")
    ]


# --- health first: a node that fails it gets no benchmark verdicts -------------------------------------


def test_node_scope_parsing_and_failed_nodes():
    from gpuval.accept import failed_nodes, node_of
    from gpuval.results import Check, Status

    assert [node_of(s) for s in ("gpu:n1/3", "node:n2", "link:n3/gpu0-nvlink5", "cpu:n4/0", "cluster")] == [
        "n1",
        "n2",
        "n3",
        "n4",
        None,
    ]
    checks = [
        Check(name="ecc.uncorrected_volatile", status=Status.FAIL, scope="gpu:n1/3"),
        Check(name="nvlink.state", status=Status.FAIL, scope="link:n1/gpu0-nvlink5"),
        Check(name="pcie.generation", status=Status.WARN, scope="gpu:n2/0"),
        Check(name="fleet.driver", status=Status.FAIL, scope="cluster"),
    ]
    assert failed_nodes(checks) == {"n1": "ecc.uncorrected_volatile on gpu:n1/3"}


@pytest.mark.dist
def test_failed_health_skips_the_benchmarks_with_the_reason(tmp_path, gpuval):
    """No InfiniBand here but one port expected: the node fails health, collectives and the training step
    (both cross every node) are not run, the node's benchmarks SKIP."""
    out = tmp_path / "out"
    proc = gpuval(["accept", "--quick", "--output", str(out), "--set", "expect.ib_ports=1"], tmp_path)
    assert proc.returncode == 1, proc.stderr
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, json_schema())
    by_name: dict[str, list[dict]] = {}
    for check in result["checks"]:
        by_name.setdefault(check["name"], []).append(check)
    [ports] = by_name["infiniband.ports"]
    assert ports["status"] == "FAIL" and ports["value"] == 0
    node = ports["scope"].split(":", 1)[1]
    for name in ("all_reduce.busbw_gbps", "sendrecv.busbw_gbps", "train.tokens_per_s_per_gpu"):
        [check] = by_name[name]
        assert check["status"] == "SKIP"
        assert "failed health" in check["detail"] and f"{node}: infiniband.ports" in check["detail"]
    ran = {m["name"] for m in result["measurements"]}
    assert "all_reduce" not in ran and "train" not in ran  # really not run
    for check in by_name["matmul.fp32_tflops"]:
        assert check["status"] == "SKIP" and f"node {node} failed health" in check["detail"]
    assert result["verdict"] == "FAIL"


@pytest.mark.slow
def test_gpus_expected_on_a_machine_without_any_run_no_benchmark_on_the_cpu(tmp_path, gpuval):
    """No GPU here but 8 expected: one rank (not two CPU ranks standing in for GPUs), no benchmark at all,
    every benchmark check SKIP naming the health check that failed; the verdict is FAIL, within seconds."""
    out = tmp_path / "out"
    proc = gpuval(["accept", "--quick", "--output", str(out), "--set", "expect.gpu_count=8"], tmp_path)
    assert proc.returncode == 1, proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["world"]["size"] == 1 and result["measurements"] == [] and result["duration_s"] < 30
    [count] = [c for c in result["checks"] if c["name"] == "expect.gpu_count"]
    assert count["status"] == "FAIL" and count["value"] == 0
    benchmark_checks = [c for c in result["checks"] if c["name"] in load_profile("cpu").checks]
    assert benchmark_checks and {c["status"] for c in benchmark_checks} == {"SKIP"}
    reason = f"{count['scope'].split(':', 1)[1]}: expect.gpu_count FAIL on {count['scope']}"
    assert all(reason in c["detail"] for c in benchmark_checks)
    assert result["verdict"] == "FAIL"


@pytest.mark.dist
def test_shared_directory_is_checked_when_the_profile_names_one(two_ranks):
    proc, out = two_ranks  # tests/conftest.py's one accept run names a shared directory
    shared = out.parent / "shared"
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    [fs] = [c for c in result["checks"] if c["name"] == "fleet.shared_fs"]
    assert fs["status"] == "PASS" and str(shared) in fs["detail"]
    sdc = [c for c in result["checks"] if c["name"] == "sdc.bitwise"]
    assert len(sdc) == 2 and {c["status"] for c in sdc} == {"PASS"}  # both ranks, bit-identical
    assert list(shared.iterdir()) == []

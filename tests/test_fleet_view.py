"""`gpuval fleet`: many nodes' results in one verdict (gpuval.fleet), over a fleet synthesised from a real
H100 run and over the committed device results as they are; and every bad input as one line, exit 2."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import random
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import jsonschema
import pytest

from gpuval.fleet.document import generated_schema, json_schema
from gpuval.fleet.judge import Rule, summarize
from gpuval.fleet.read import read_runs
from gpuval.result_files import find_result_files

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
# a real PASS of `accept` standard on one H100: its fp8 matmul sits 12 % above its floor, so a node 8 % slow
# there still PASSes its own run
BASE = RESULTS / "2026-11-22-h100x1-device-run" / "accept-standard.json"
NAMES = [f"node{number:03d}" for number in range(1, 203)]
FAILING = "node017"  # its bf16 matmul at 60 %: below the floor
SLOW = ["node023", "node024", "node142"]  # fp8 matmul 8 % below the fleet, above the floor
MISSING = ["node050", "node202"]  # expected, never reported
PLANTS = {FAILING: {"matmul.bf16_tflops": 0.6}} | {name: {"matmul.fp8_tflops": 0.92} for name in SLOW}


def _synth():
    """benchmarks/fleet_scale.py, whose synthesis these fixtures share."""
    spec = importlib.util.spec_from_file_location("fleet_scale", REPO / "benchmarks" / "fleet_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


synth = _synth()


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fleet") / "runs"
    reporting = [name for name in NAMES if name not in MISSING]
    synth.write_fleet(synth.load(BASE), folder, reporting, plants=PLANTS)
    return folder


@pytest.fixture(scope="module")
def planted(fleet_dir, tmp_path_factory):
    """`gpuval fleet` over the 200 synthesised nodes, as a user runs it: (process, output folder)."""
    from conftest import cli_env, run_cli

    out = tmp_path_factory.mktemp("fleet-out") / "out"
    args = ["fleet", str(fleet_dir), "--output", str(out), "--expect", "node[001-202]"]
    args += ["--textfile", str(out)]  # beside fleet.json: the head node's exporter may read any folder
    proc = run_cli(args, fleet_dir.parent, env=cli_env(COLUMNS="200"))  # the table's reasons on one line
    return proc, out


def _document(out: Path) -> dict:
    return json.loads((out / "fleet.json").read_text(encoding="utf-8"))


def test_the_planted_fleet_fails_on_its_one_failed_node_and_drains_only_it(planted):
    proc, out = planted
    assert proc.returncode == 1, proc.stderr
    document = _document(out)
    jsonschema.validate(document, json_schema())
    assert document["schema"] == "gpuval.fleet/v1"
    assert document["drain"] == FAILING
    assert document["rerun"] == {"error": "", "missing": "node[050,202]"}
    assert document["counts"] == {"nodes": 202, "MISSING": 2, "FAIL": 1, "ERROR": 0, "WARN": 3, "PASS": 196}
    failed = next(node for node in document["nodes"] if node["name"] == FAILING)
    assert failed["verdict"] == "FAIL" and failed["outliers"] == []  # its own floor says it; no echo
    assert [(c["check"], c["status"], c["bound"]) for c in failed["checks"]] == [
        ("matmul.bf16_tflops", "FAIL", {"min": 675.0})
    ]
    assert failed["source"].endswith(f"{FAILING}/result.json")


def test_only_the_three_slow_nodes_are_fleet_outliers(planted):
    _, out = planted
    nodes = {node["name"]: node for node in _document(out)["nodes"]}
    flagged = sorted(name for name, node in nodes.items() if node["outliers"])
    assert flagged == SLOW
    for name in SLOW:
        node = nodes[name]
        assert node["verdict"] == "WARN" and node["checks"] == []  # it PASSed its own run
        (outlier,) = node["outliers"]
        assert outlier["check"] == "matmul.fp8_tflops" and outlier["scope"] == f"gpu:{name}/0"
        assert -9.5 < outlier["deviation_pct"] < -6.5
        assert outlier["robust_z"] < -3.5
        assert outlier["compared_with"] == "200 nodes"
        assert re.fullmatch(r"fleet outlier: \d\.\d % below the median of 200 nodes", outlier["detail"])
    others = [node for name, node in nodes.items() if name not in [*SLOW, FAILING, *MISSING]]
    assert {node["verdict"] for node in others} == {"PASS"}


def test_missing_nodes_come_first_then_the_failed_then_the_slow(planted):
    _, out = planted
    order = [(node["verdict"], node["name"]) for node in _document(out)["nodes"][:6]]
    assert order == [("MISSING", "node050"), ("MISSING", "node202"), ("FAIL", FAILING)] + [
        ("WARN", name) for name in SLOW
    ]


def test_the_console_names_what_needs_attention_and_the_drain_list(planted):
    proc, out = planted
    for text in (FAILING, *SLOW, *MISSING, "drain: node017", "run again (no result): node[050,202]"):
        assert text in proc.stdout, proc.stdout
    assert "fleet outlier: " in proc.stdout and "% below the median of 200 nodes" in proc.stdout
    assert "node001 " not in proc.stdout  # a node that passed is not in the table
    assert f"to {out}" in proc.stdout


def test_fleet_html_opens_from_disk_and_lists_the_planted_nodes_first(planted):
    _, out = planted
    page = (out / "fleet.html").read_text(encoding="utf-8")
    assert "<script" not in page.lower() and "http://" not in page and "https://" not in page
    attention = page[page.index('id="attention"') : page.index('id="heat"')]
    listed = re.findall(r"<td>(node\d{3})</td>", attention)
    assert listed == [*MISSING, FAILING, *SLOW]
    heat = page[page.index('id="heat"') : page.index('id="distributions"')]
    rows = re.findall(r"<td>(node\d{3})</td>", heat)
    assert rows[:6] == [*MISSING, FAILING, *SLOW] and len(rows) == 60  # capped, and says so
    assert "142 more node(s) not shown" in heat
    assert heat.count("<tr>") == 61  # the head and 60 rows
    distributions = page[page.index('id="distributions"') :]
    assert "matmul.fp8_tflops · NVIDIA H100 80GB HBM3 · per GPU" in distributions
    assert distributions.count("<svg") >= 5 and 'stroke="#cf222e"' in distributions  # with its floor


def test_junit_has_one_testcase_per_node(planted):
    import xml.etree.ElementTree as ET

    _, out = planted
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == 202
    assert (suite.get("failures"), suite.get("errors")) == ("1", "2")
    assert [c.get("name") for c in cases if c.find("failure") is not None] == [FAILING]
    assert sorted(c.get("name") for c in cases if c.find("error") is not None) == MISSING


def test_textfile_gives_the_head_nodes_exporter_each_nodes_verdict(planted):
    """`--textfile DIR`: the fleet's view in DIR/gpuval-fleet.prom, each node's verdict a 1 in its series
    (and promtool finds nothing to lint where it is installed)."""
    import re
    import shutil
    import subprocess

    proc, out = planted
    text = (out / "gpuval-fleet.prom").read_text(encoding="utf-8")
    ones = dict(re.findall(r'^gpuval_fleet_node_verdict\{node="([^"]+)",verdict="([A-Z]+)"\} 1$', text, re.M))
    assert ones[FAILING] == "FAIL" and all(ones[name] == "WARN" for name in SLOW)
    assert all(ones[name] == "MISSING" for name in MISSING)
    assert sum(v == "PASS" for v in ones.values()) == len(NAMES) - 1 - len(SLOW) - len(MISSING)
    if shutil.which("promtool"):
        lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout + lint.stderr


def test_fail_outliers_drains_the_slow_nodes_too(fleet_dir):
    files = find_result_files([fleet_dir])
    summary = summarize(read_runs(files), len(files), NAMES, Rule(fail=True))
    assert summary.drain == "node[017,023-024,142]"
    assert summary.exit_code == 1


def test_below_ten_nodes_no_outlier_is_judged_and_the_summary_says_so(fleet_dir):
    nine = ["node001", "node002", "node003", "node004", "node005", "node006", FAILING, *SLOW[:2]]
    files = [fleet_dir / name / "result.json" for name in nine]  # two of the slow nodes among them
    summary = summarize(read_runs(files), len(files))
    assert {node.name for node in summary.nodes} >= {"node023", "node024"}
    assert not any(node.outliers for node in summary.nodes)
    assert "no fleet outlier judged" in summary.rule_note and "10 nodes or more" in summary.rule_note
    assert summary.exit_code == 1  # node017 is among them: FAIL all the same


def _result(name: str, started: datetime, scale=None, seed: int = 1) -> dict:
    return synth.node_result(synth.load(BASE), name, random.Random(seed), started, scale=scale)


def _write(folder: Path, name: str, document: dict) -> Path:
    path = folder / name / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_the_newest_run_of_a_node_counts_and_the_console_says_so(gpuval, tmp_path):
    start = datetime(2026, 12, 6, 8, 0, tzinfo=timezone.utc)
    _write(tmp_path / "runs", "first", _result("n1", start, {"matmul.bf16_tflops": 0.5}))  # FAIL
    _write(tmp_path / "runs", "again", _result("n1", start + timedelta(hours=1)))  # PASS, later
    _write(tmp_path / "runs", "other", _result("n2", start))
    proc = gpuval(["fleet", "runs", "--output", "out"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "node n1: 2 results; the newest (started 2026-12-06T09:00:00+00:00) counts" in proc.stdout
    node = next(n for n in _document(tmp_path / "out")["nodes"] if n["name"] == "n1")
    assert node["source"] == "runs/again/result.json" and node["not_counted"] == ["runs/first/result.json"]
    # the other way round, the FAIL is the newest and counts
    _write(tmp_path / "runs", "first", _result("n1", start + timedelta(hours=2), {"matmul.bf16_tflops": 0.5}))
    files = find_result_files([tmp_path / "runs"])
    assert summarize(read_runs(files), len(files)).drain == "n1"


def test_an_error_run_is_run_again_never_drained_and_exits_3(tmp_path):
    start = datetime(2026, 12, 6, 8, 0, tzinfo=timezone.utc)
    broken = _result("n2", start)
    broken["checks"][0]["status"] = "ERROR"
    broken["verdict"] = "ERROR"
    files = [_write(tmp_path, "a", _result("n1", start)), _write(tmp_path, "b", broken)]
    summary = summarize(read_runs(files), 2, ["n1", "n2"])
    assert summary.drain == "" and summary.names("ERROR") == ["n2"]
    assert summary.exit_code == 3
    assert summarize(read_runs(files[:1]), 1).exit_code == 0  # all PASS
    assert summarize(read_runs(files[:1]), 1, ["n1", "n9"]).exit_code == 3  # a node MISSING


def _two_nodes(start: datetime) -> dict:
    """One run across nodes a1 and a2: the base's node copied, its GPU checks on each node."""
    from gpuval.scope import Scope

    document = _result("a1", start)
    second = copy.deepcopy(document["inventory"]["nodes"][0])
    second["node"] = second["host"]["hostname"] = "a2"
    document["inventory"]["nodes"].append(second)
    document["world"]["nodes"], document["world"]["size"] = 2, 2
    copies = []
    for check in document["checks"]:
        scope = Scope.parse(check["scope"])
        if scope.kind == "gpu":
            twin = copy.deepcopy(check)
            twin["scope"] = str(Scope.gpu("a2", scope.index))
            copies.append(twin)
    document["checks"] += copies
    return document


def test_a_run_across_nodes_gives_each_node_its_own_verdict(tmp_path):
    from gpuval.scope import Scope

    start = datetime(2026, 12, 6, 8, 0, tzinfo=timezone.utc)
    document = _two_nodes(start)
    for check in document["checks"]:
        if check["name"] == "ecc.uncorrected_volatile" and check["scope"] == str(Scope.gpu("a2", 0)):
            check["status"], check["value"] = "FAIL", 2.0
    document["verdict"] = "FAIL"
    files = [_write(tmp_path, "run", document)]
    summary = summarize(read_runs(files), 1)
    assert {node.name: node.verdict for node in summary.nodes} == {"a1": "PASS", "a2": "FAIL"}
    assert summary.drain == "a2"
    # a cluster-scoped FAIL names no node: it bears on both
    document = _two_nodes(start)
    document["verdict"] = "FAIL"
    document["checks"].append(
        {"name": "all_reduce.busbw_gbps", "status": "FAIL", "value": 1.0, "threshold": {"min": 340.0},
         "unit": "GB/s", "scope": "cluster", "detail": "far below"}
    )  # fmt: skip
    _write(tmp_path, "run", document)
    assert summarize(read_runs(files), 1).drain == "a[1-2]"


COMMITTED = sorted(
    path for path in RESULTS.glob("*/*.json") if '"schema": "gpuval.result/v1"' in path.read_text()[:200]
)


def test_the_committed_device_results_are_summarised_as_their_runs_judged_them(tmp_path):
    """The 1-, 2- and 4-GPU results of the lent machines, each alone: the node's verdict is the run's (WARN
    where a PASS carried a WARN check); together, as one node (every lent machine calls itself 'vm'), the
    newest run counts."""
    gpu_counts = set()
    for path in COMMITTED:
        raw = json.loads(path.read_text())
        gpu_counts.add(raw["world"]["size"])
        summary = summarize(read_runs([path]), 1)
        (node,) = summary.nodes
        expected = raw["verdict"]
        if expected == "PASS" and any(check["status"] == "WARN" for check in raw["checks"]):
            expected = "WARN"
        assert (node.name, node.verdict) == ("vm", expected), path
        assert summary.drain == ("vm" if expected == "FAIL" else "")
    assert {1, 2, 4} <= gpu_counts and len(COMMITTED) >= 10
    together = summarize(read_runs(COMMITTED), len(COMMITTED))
    (node,) = together.nodes
    newest = max(COMMITTED, key=lambda path: json.loads(path.read_text())["started_at"])
    assert node.run.source == str(newest) and len(node.older) == len(COMMITTED) - 1
    assert "no fleet outlier judged" in together.rule_note


# --- bad input: one line, exit 2, nothing written ------------------------------------------------------


def _refused(gpuval, assert_usage_error, tmp_path, args, *fragments):
    proc = gpuval(["fleet", *args, "--output", str(tmp_path / "out")], tmp_path)
    assert_usage_error(proc, *fragments)
    assert proc.stdout == ""
    assert not (tmp_path / "out").exists()


def test_an_empty_folder_is_refused(gpuval, assert_usage_error, tmp_path):
    (tmp_path / "empty").mkdir()
    _refused(gpuval, assert_usage_error, tmp_path, ["empty"], "empty: no result.json in this folder")


def test_a_json_that_is_no_result_is_refused(gpuval, assert_usage_error, tmp_path):
    start = datetime(2026, 12, 6, 8, 0, tzinfo=timezone.utc)
    _write(tmp_path / "runs", "n1", _result("n1", start))
    (tmp_path / "runs" / "n2").mkdir()
    (tmp_path / "runs" / "n2" / "result.json").write_text('{"hello": 1}')
    _refused(gpuval, assert_usage_error, tmp_path, ["runs"], "n2/result.json is not a gpuval result.json")


def test_a_bench_document_among_results_is_named_as_two_schemas(gpuval, assert_usage_error, tmp_path):
    start = datetime(2026, 12, 6, 8, 0, tzinfo=timezone.utc)
    _write(tmp_path / "runs", "n1", _result("n1", start))
    bench = RESULTS / "2026-11-24-h200x1-timing-windows" / "matmul.json"
    _refused(
        gpuval,
        assert_usage_error,
        tmp_path,
        ["runs", str(bench)],
        "gpuval.bench/v1 document",
        "two schemas mixed",
    )


def test_a_fleet_summary_fed_back_is_named(gpuval, assert_usage_error, planted, tmp_path):
    _, out = planted
    _refused(gpuval, assert_usage_error, tmp_path, [str(out / "fleet.json")], "gpuval.fleet/v1 summary")


def test_an_unreadable_file_is_refused(gpuval, assert_usage_error, tmp_path):
    (tmp_path / "runs" / "n1").mkdir(parents=True)
    (tmp_path / "runs" / "n1" / "result.json").write_bytes(b'{"schema": "\xff"}')
    _refused(gpuval, assert_usage_error, tmp_path, ["runs"], "not UTF-8 text")
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    _refused(gpuval, assert_usage_error, tmp_path, [str(fifo)], "not a file or folder")


@pytest.mark.parametrize(
    ("expect", "said"),
    [("node[1-", "never closed"), ("node[5-1]", "runs backwards"), ("@missing.txt", "cannot read it")],
)
def test_an_expect_that_does_not_parse_is_refused(gpuval, assert_usage_error, tmp_path, expect, said):
    start = datetime(2026, 12, 6, 8, 0, tzinfo=timezone.utc)
    _write(tmp_path / "runs", "n1", _result("n1", start))
    _refused(gpuval, assert_usage_error, tmp_path, ["runs", "--expect", expect], said)


def test_expect_reads_a_file_of_names(tmp_path):
    from gpuval.fleet.read import read_expected

    listed = tmp_path / "nodes.txt"
    listed.write_text("# the rack\nnode001\nnode[002-003]  # two more\n\ngpu-a7\n")
    assert (
        read_expected(f"@{listed}")
        == read_expected(str(listed))
        == ["node001", "node002", "node003", "gpu-a7"]
    )
    assert read_expected("node[001-002],gpu-a7") == ["node001", "node002", "gpu-a7"]


def test_the_schema_command_prints_the_shipped_fleet_schema(gpuval, tmp_path):
    # If this fails, regenerate src/gpuval/schema/fleet.v1.json from gpuval.fleet.document.generated_schema().
    assert json_schema() == generated_schema()
    jsonschema.Draft202012Validator.check_schema(json_schema())
    proc = gpuval(["schema", "fleet"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json_schema()

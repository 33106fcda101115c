"""results.py (verdict, result.json) and the files written from it: atomic writes, schema, junit.xml."""

from __future__ import annotations

import json
import math
import os
import stat
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from gpuval.atomic import ensure_writable_dir, write_text_atomic
from gpuval.errors import EXIT_USAGE, UsageError
from gpuval.report.junit import junit_xml, write_junit
from gpuval.results import (
    BENCH_SCHEMA_ID,
    SCHEMA_ID,
    BenchDocument,
    Check,
    Measurement,
    Result,
    Status,
    World,
    generated_schema,
    json_schema,
    verdict,
)

P, F, W, S, E = Status.PASS, Status.FAIL, Status.WARN, Status.SKIP, Status.ERROR


def _checks(*statuses: Status) -> list[Check]:
    return [Check(name=f"check{i}.metric", status=status) for i, status in enumerate(statuses)]


def _result(checks: list[Check], measurements: list[Measurement] | None = None) -> Result:
    return Result(
        verdict=verdict(checks),
        started_at="2025-01-01T00:00:00+00:00",
        duration_s=1.5,
        profile="cpu",
        world=World(size=2, nodes=1, backend="gloo"),
        measurements=measurements or [],
        checks=checks,
    )


# --- verdict --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "statuses, expected",
    [
        ((P,), P),
        ((P, P, P), P),
        ((P, W), P),
        ((W,), P),
        ((P, S), P),
        ((P, W, S), P),
        ((F,), F),
        ((P, F), F),
        ((P, W, S, F), F),
        ((F, E), F),  # a proven hardware fault outranks an incomplete run
        ((E, F, P), F),
        ((E,), E),
        ((P, E), E),
        ((P, W, S, E), E),
        ((), E),  # nothing was shown to work
        ((S,), E),
        ((S, S), E),  # only skipped checks: nothing was shown to work either
    ],
)
def test_verdict_truth_table(statuses, expected):
    assert verdict(_checks(*statuses)) is expected


def test_verdict_does_not_depend_on_order():
    checks = _checks(P, W, E, S, F)
    assert verdict(checks) is verdict(list(reversed(checks))) is F


# --- result.json ----------------------------------------------------------------------------------


def test_result_json_has_the_v1_header_and_validates():
    result = _result(
        _checks(P),
        [
            Measurement(
                name="all_reduce",
                scope="cluster",
                params={"bytes": 2**20},
                metrics={"busbw_gbps": 1.5},
                samples=3,
            )
        ],
    )
    document = json.loads(result.to_json())
    assert document["schema"] == SCHEMA_ID == "gpuval.result/v1"
    assert document["verdict"] == "PASS"
    assert document["world"] == {"size": 2, "nodes": 1, "backend": "gloo"}
    jsonschema.validate(document, json_schema())


def test_nan_and_infinity_are_written_as_null_and_the_file_still_validates(tmp_path):
    measurement = Measurement(
        name="matmul",
        scope="cpu:host/0",
        params={"slowest_value": float("nan")},
        metrics={
            "fp32_tflops": float("nan"),
            "time_us": float("inf"),
            "algbw_gbps": -float("inf"),
            "busbw_gbps": 2.0,
        },
        samples=1,
    )
    check = Check(name="matmul.fp32_tflops", status=Status.ERROR, value=float("nan"), unit="TFLOP/s")
    result = _result([check], [measurement])
    path = tmp_path / "result.json"
    result.write(path)
    text = path.read_text()
    for token in ("NaN", "Infinity"):
        assert token not in text
    document = json.loads(text)  # a strict parser would reject NaN; json.loads accepts it, so check above too
    assert document["measurements"][0]["metrics"] == {
        "fp32_tflops": None,
        "time_us": None,
        "algbw_gbps": None,
        "busbw_gbps": 2.0,
    }
    assert document["measurements"][0]["params"]["slowest_value"] is None
    assert document["checks"][0]["value"] is None
    jsonschema.validate(document, json_schema())
    reread = Result.model_validate(document)
    assert reread.measurements[0].metrics["fp32_tflops"] is None
    assert reread.measurements[0].metrics["busbw_gbps"] == 2.0


def test_result_json_round_trips_and_can_be_re_judged(tmp_path):
    checks = [
        Check(
            name="matmul.fp32_tflops",
            status=Status.FAIL,
            value=0.5,
            threshold={"min": 1.0},
            unit="TFLOP/s",
            scope="cpu:host/1",
            detail="0.5 TFLOP/s on cpu:host/1, required >= 1",
        ),
        Check(name="membw.copy_tbps", status=Status.PASS, value=0.01, threshold={"min": 0.001}, unit="TB/s"),
    ]
    result = _result(checks, [Measurement(name="membw", scope="cpu:host/0", metrics={"copy_tbps": 0.01})])
    result.write(tmp_path / "result.json")
    reread = Result.model_validate_json((tmp_path / "result.json").read_text())
    assert reread == result
    assert verdict(reread.checks) is reread.verdict is Status.FAIL


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.pop("verdict"),
        lambda d: d.update(verdict="OK"),
        lambda d: d.update(surprise=1),
        lambda d: d["checks"].append({"name": "x.y", "status": "MAYBE"}),
        lambda d: d["measurements"].append({"name": "x", "scope": "cluster", "metrics": {"a": "fast"}}),
        lambda d: d["world"].update(size="two"),
    ],
)
def test_schema_rejects_malformed_documents(change):
    document = json.loads(_result(_checks(P)).to_json())
    change(document)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, json_schema())


def test_shipped_schema_file_equals_the_model():
    # If this fails, regenerate src/gpuval/schema/result.v1.json from gpuval.results.generated_schema().
    assert json_schema() == generated_schema()
    assert json_schema()["$id"] == SCHEMA_ID


def test_shipped_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(json_schema())


# --- gpuval.bench/v1: the document `gpuval bench --output` writes ------------------------------------


def _bench_document(**changes: object) -> dict:
    document = {
        "schema": BENCH_SCHEMA_ID,
        "benchmark": "membw",
        "started_at": "2025-01-01T00:00:00+00:00",
        "duration_s": 1.5,
        "world": {"size": 2, "nodes": 1, "backend": "nccl"},
        "status": "OK",
        "detail": "",
        "options": {"repeats": 10},
        "command": ["gpuval", "bench", "membw"],
        "inventory": {"nodes": [{"host": {"hostname": "node1"}}]},
        "measurements": [
            {
                "name": "membw",
                "scope": "gpu:node1/0",
                "params": {},
                "metrics": {"copy_tbps": 3.1},
                "samples": 10,
            }
        ],
    }
    document.update(changes)
    return document


def test_shipped_bench_schema_file_equals_the_model():
    # If this fails, regenerate src/gpuval/schema/bench.v1.json from generated_schema("bench").
    assert json_schema("bench") == generated_schema("bench")
    assert json_schema("bench")["$id"] == BENCH_SCHEMA_ID == "gpuval.bench/v1"
    jsonschema.Draft202012Validator.check_schema(json_schema("bench"))


def test_bench_document_round_trips_with_its_fields_in_their_order():
    document = _bench_document()
    jsonschema.validate(document, json_schema("bench"))
    written = BenchDocument.model_validate(document).to_json()
    assert json.loads(written) == document
    assert list(json.loads(written)) == list(document)


def test_bench_document_of_earlier_versions_without_inventory_still_validates():
    document = _bench_document()
    del document["inventory"]
    jsonschema.validate(document, json_schema("bench"))
    assert BenchDocument.model_validate(document).inventory.nodes == []


def test_bench_document_writes_nan_as_null_and_still_validates():
    document = _bench_document()
    document["measurements"][0]["metrics"]["copy_tbps"] = math.nan
    written = json.loads(BenchDocument.model_validate(document).to_json())
    assert written["measurements"][0]["metrics"]["copy_tbps"] is None
    jsonschema.validate(written, json_schema("bench"))


@pytest.mark.parametrize(
    "changes",
    [{"status": "PASS"}, {"world": {"size": 1}, "extra": 1}, {"duration_s": "slow"}, {"measurements": [{}]}],
    ids=["status", "extra-key", "duration", "measurement"],
)
def test_bench_schema_rejects_malformed_documents(changes):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_bench_document(**changes), json_schema("bench"))


# --- atomic writes --------------------------------------------------------------------------------


def test_write_leaves_no_temp_files(tmp_path):
    result = _result(_checks(P, F))
    result.write(tmp_path / "result.json")
    result.write(tmp_path / "result.json")  # overwrite
    write_junit(result, tmp_path / "junit.xml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junit.xml", "result.json"]
    assert json.loads((tmp_path / "result.json").read_text())["verdict"] == "FAIL"


def test_write_creates_missing_parent_directories(tmp_path):
    target = tmp_path / "a" / "b" / "result.json"
    _result(_checks(P)).write(target)
    assert json.loads(target.read_text())["verdict"] == "PASS"


def test_failed_write_keeps_the_old_file_and_removes_the_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "result.json"
    target.write_text("old contents")

    def broken_replace(src, dst):
        assert Path(src).parent == tmp_path  # the temp file sits beside the target: rename stays atomic
        assert Path(src).exists()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        _result(_checks(P)).write(target)
    assert target.read_text() == "old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_written_files_get_ordinary_permissions(tmp_path):
    # CI collects result.json and junit.xml as another user: they must be as readable as any file this
    # process creates with open(), not private like a bare temp file (mkstemp makes 0600).
    reference = tmp_path / "reference"
    reference.write_text("x")
    expected = stat.S_IMODE(reference.stat().st_mode)
    write_text_atomic(tmp_path / "result.json", "{}\n")
    assert stat.S_IMODE((tmp_path / "result.json").stat().st_mode) == expected


def test_overwrite_keeps_ordinary_permissions(tmp_path):
    reference = tmp_path / "reference"
    reference.write_text("x")
    expected = stat.S_IMODE(reference.stat().st_mode)
    write_text_atomic(tmp_path / "junit.xml", "a")
    write_text_atomic(tmp_path / "junit.xml", "b")
    assert (tmp_path / "junit.xml").read_text() == "b"
    assert stat.S_IMODE((tmp_path / "junit.xml").stat().st_mode) == expected


def test_ensure_writable_dir_creates_it_and_leaves_nothing_behind(tmp_path):
    target = tmp_path / "x" / "y"
    assert ensure_writable_dir(target) == target
    assert target.is_dir()
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("below", [True, False], ids=["under-a-file", "is-a-file"])
def test_ensure_writable_dir_rejects_a_regular_file(tmp_path, below):
    blocker = tmp_path / "file"
    blocker.write_text("keep")
    target = blocker / "sub" if below else blocker
    with pytest.raises(UsageError) as info:
        ensure_writable_dir(target)
    assert info.value.exit_code == EXIT_USAGE
    assert f"output directory '{target}' cannot be written" in str(info.value)
    assert blocker.read_text() == "keep"


# --- junit.xml ------------------------------------------------------------------------------------


def _suite(result: Result) -> ET.Element:
    root = ET.fromstring(junit_xml(result))
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    return suites[0]


def test_junit_counts_match_the_checks():
    checks = [
        Check(name="matmul.fp32_tflops", status=P, value=0.1, unit="TFLOP/s", scope="cpu:h/0"),
        Check(
            name="matmul.fp32_tflops",
            status=F,
            value=0.0001,
            threshold={"min": 0.001},
            unit="TFLOP/s",
            scope="cpu:h/1",
            detail="0.0001 TFLOP/s on cpu:h/1, required >= 0.001",
        ),
        Check(name="all_reduce.busbw_gbps", status=E, scope="cluster", detail="collectives failed on rank 1"),
        Check(name="membw.nonexistent_tbps", status=E, detail="no 'membw' measurement"),
        Check(name="outliers.matmul_pct", status=S, detail="fewer than two GPUs"),
        Check(name="outliers.membw_pct", status=W, value=7.0, unit="%", detail="slow"),
        Check(name="all_reduce.correct", status=F, value=3, unit="elements", detail="3 wrong elements"),
    ]
    result = _result(checks)
    suite = _suite(result)
    assert suite.get("name") == "gpuval.cpu"
    assert suite.get("tests") == "7"
    assert suite.get("failures") == "2"
    assert suite.get("errors") == "2"
    assert suite.get("skipped") == "1"
    assert suite.get("time") == "1.500"
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [(c.scope, c.name) for c in checks]
    assert len(suite.findall("testcase/failure")) == 2
    assert len(suite.findall("testcase/error")) == 2
    assert len(suite.findall("testcase/skipped")) == 1
    failed = [c for c in cases if c.find("failure") is not None]
    assert [c.get("classname") for c in failed] == ["cpu:h/1", "cluster"]
    assert failed[0].find("failure").get("message") == "0.0001 TFLOP/s on cpu:h/1, required >= 0.001"
    assert "threshold {'min': 0.001}" in failed[0].find("failure").text
    warned = [c for c in cases if c.get("name") == "outliers.membw_pct"][0]
    assert warned.find("failure") is None and warned.find("error") is None
    assert warned.find("system-out").text.startswith("WARN")


def test_junit_with_no_checks():
    suite = _suite(_result([]))
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "0",
    ) * 4


def test_junit_escapes_markup_and_survives_nan(tmp_path):
    check = Check(name="x.y", status=F, value=math.nan, detail="<&> \"quoted\" 'single'")
    write_junit(_result([check]), tmp_path / "junit.xml")
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite.find("testcase/failure").get("message") == "<&> \"quoted\" 'single'"

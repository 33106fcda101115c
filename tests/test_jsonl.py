"""gpuval.jsonl and its users (issue 50, point 1): JSON Lines split on "\\n" alone and written so that every
line reads back as one, whatever the strings hold. U+2028, U+2029 and U+0085 are legal inside a JSON string
and json.dumps(ensure_ascii=False) writes them raw; str.splitlines() breaks there, which made `finetune
prepare` skip valid records and write splits that `finetune eval`/`train` then refused."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

# hypothesis caches what it learns under ./.hypothesis: keep the checkout clean (nothing left behind)
set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "gpuval-hypothesis"))
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gpuval.errors import UsageError  # noqa: E402
from gpuval.finetune.data.prepare import prepare, read_jsonl  # noqa: E402
from gpuval.finetune.data.synth import render_records, synth_records  # noqa: E402
from gpuval.inputs import MAX_INT, decode_json  # noqa: E402
from gpuval.jsonl import dump_line, dump_lines, split_lines  # noqa: E402
from gpuval.results import Check, Result, Status, World  # noqa: E402
from gpuval.soak import _append  # noqa: E402

PROPERTY = settings(
    deadline=None,
    database=None,  # no .hypothesis/ folder left behind
    suppress_health_check=[HealthCheck.too_slow],
)
# Every character str.splitlines() breaks at ("\r\n" comes of two draws): the control characters JSON
# escapes, and the three it does not
BREAKS = ["\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
# A record with a function call, in Glaive's format: what prepare needs to write anything
CALLING = json.loads(render_records(synth_records(1, 0), "jsonl").splitlines()[0])
USER_TEXT = "Where is my package 1Z00777844? It's with UPS."  # CALLING's user turn

# any Unicode text but lone surrogates (no UTF-8 file can hold one), with the line breaks drawn often
texts = st.text(st.characters(blacklist_categories=("Cs",)) | st.sampled_from(BREAKS))
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-MAX_INT, MAX_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)


@settings(PROPERTY, max_examples=200)
@given(records=st.lists(json_values, max_size=6))
def test_written_records_read_back_as_written_and_one_line_each(records):
    text = dump_lines(records)
    assert len(text.splitlines()) == len(records)  # any splitter, str.splitlines() included, sees one a line
    assert [decode_json(line) for _number, line in split_lines(text)] == records


@settings(PROPERTY, max_examples=100)
@given(
    records=st.lists(json_values, min_size=1, max_size=4),
    crlf=st.booleans(),
    blanks=st.lists(st.sampled_from(["", " ", "\t", "\r"]), min_size=1, max_size=4),
)
def test_crlf_line_ends_and_blank_lines_are_tolerated_and_numbered(records, crlf, blanks):
    end = "\r\n" if crlf else "\n"
    lines = [dump_line(records[0]), *blanks, *(dump_line(value) for value in records[1:])]
    read = list(split_lines(end.join(lines) + end))
    assert [decode_json(line) for _number, line in read] == records
    assert [number for number, _line in read] == [1, *range(len(blanks) + 2, len(lines) + 1)]


def test_every_code_point_is_written_on_one_line_and_other_non_ascii_stays_readable():
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    line = dump_line({"text": every})
    assert len(line.splitlines()) == 1 and json.loads(line) == {"text": every}
    assert "é" in dump_line("café") and "雪" in dump_line("雪")  # escaped only where it must be
    assert dump_line("a\u2028b\x85c") == '"a\\u2028b\\u0085c"'


def _glaive_file(path: Path, text: str) -> None:
    """CALLING with `text` inside its user turn, written as a scraper would write it: json.dumps, the line
    breaks U+2028/U+0085 raw inside the string."""
    record = {**CALLING, "chat": CALLING["chat"].replace("It's with", f"It's{text}with")}
    assert record != CALLING
    path.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")


def _user_turn(path: Path) -> str:
    """The user turn of the one record of a prepared split, read as `finetune eval` and `train` read it."""
    [(number, record)] = read_jsonl(path, "eval split")
    assert number == 1
    return record["messages"][0]["content"]


@settings(PROPERTY, max_examples=50)
@given(
    text=st.text(st.sampled_from(["\u2028", "\u2029", "\x85", " ", "x", "é"]), min_size=1).map(" {} ".format)
)
def test_prepare_keeps_records_holding_line_separators_and_eval_reads_its_output(text):
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "glaive.jsonl"
        _glaive_file(source, text)
        stats = prepare(str(source), Path(folder) / "out", eval_fraction=0)
        assert (stats["kept"], stats["skipped"]) == (1, 0)
        assert _user_turn(Path(folder) / "out" / "train.jsonl") == USER_TEXT.replace(" with", f"{text}with")


def test_cli_prepare_of_a_record_with_u2028_and_u0085_then_the_training_reader(gpuval, tmp_path):
    _glaive_file(tmp_path / "glaive.jsonl", " line\u2028next\x85end ")
    proc = gpuval(
        ["finetune", "prepare", "--input", "glaive.jsonl", "--output", "out", "--eval-fraction", "0"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "1 of 1 records kept" in proc.stdout
    written = (tmp_path / "out" / "train.jsonl").read_text(encoding="utf-8")
    assert "\\u2028" in written and len(written.splitlines()) == 1
    assert _user_turn(tmp_path / "out" / "train.jsonl") == USER_TEXT.replace(
        " with", " line\u2028next\x85end with"
    )


def test_a_soak_iteration_holding_a_line_separator_is_one_line_of_iterations_jsonl(tmp_path):
    result = Result(
        verdict=Status.PASS,
        started_at="2026-12-06T00:00:00+00:00",
        duration_s=1.0,
        profile="p",
        world=World(),
        checks=[Check(name="c", status=Status.PASS, detail="a\u2028b\x85c\u2029")],
        command=["gpuval", "accept", "--duration", "1h"],
    )
    log = tmp_path / "iterations.jsonl"
    _append(log, result)
    _append(log, result)
    lines = log.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and all(Result.model_validate_json(line) == result for line in lines)


@pytest.mark.parametrize("text", ["{}\n{\n", '{"a": "\u2028"}\nnot json\n'])
def test_a_broken_line_is_named_by_its_number_counting_newlines_only(tmp_path, text):
    path = tmp_path / "eval.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(
        UsageError, match=rf"eval split '{re.escape(str(path))}' line 2: not JSON .*; write it with"
    ) as raised:
        read_jsonl(path, "eval split")
    assert "\n" not in str(raised.value)


def _nested(depth: int, leaf: object, shape: list[bool]) -> object:
    """`leaf` inside `depth` containers, a dict or a list at each level as `shape` draws (cycled)."""
    value = leaf
    for level in range(depth):
        value = {"k": value} if shape[level % len(shape)] else [value]
    return value


@settings(PROPERTY, max_examples=150)
@given(
    depth=st.integers(55, 70),
    leaf=st.sampled_from([1, "x", [], {}, None]),
    shape=st.lists(st.booleans(), min_size=1, max_size=5),
    siblings=json_values,
)
def test_decode_json_refuses_exactly_the_nesting_json_problem_refuses(depth, leaf, shape, siblings):
    """decode_json checks nesting level by level over the containers (a 1,000-node result in a fraction
    of the walk json_problem makes); it must refuse what json_problem, the rule, refuses, and only that."""
    from gpuval.inputs import json_problem

    value = [siblings, _nested(depth, leaf, shape)]
    text = json.dumps(value)
    rule = json_problem(value)
    try:
        decoded = decode_json(text)
    except ValueError as exc:
        assert rule is not None and "nested more than 64 levels deep" in str(exc), (depth, leaf)
    else:
        assert rule is None and decoded == value


number_texts = st.one_of(
    st.integers(-(10**60), 10**60).map(str),
    st.builds(
        lambda mantissa, exponent: f"{mantissa}e{exponent:+d}",
        st.floats(0.1, 9.99, allow_nan=False).map(lambda v: f"{v:.6f}"),
        st.integers(-400, 400),
    ),
)


@settings(PROPERTY, max_examples=200)
@given(number=number_texts, depth=st.integers(0, 60), siblings=json_values)
def test_decode_json_refuses_exactly_the_numbers_out_of_range(number, depth, siblings):
    """json.loads reads the numbers with its own parsers; decode_json's walk then refuses an integer past
    MAX_INT either way and a float past the largest double, wherever it sits, and nothing else."""
    value = float(number) if "e" in number else int(number)
    out_of_range = abs(value) > MAX_INT if isinstance(value, int) else math.isinf(value)
    text = f"[{json.dumps(siblings)}, {'[' * depth}{number}{']' * depth}]"
    try:
        decode_json(text)
    except ValueError as exc:
        assert out_of_range, (number, str(exc))
        assert "too large" in str(exc) and "\n" not in str(exc)
    else:
        assert not out_of_range, number


def test_decode_json_refuses_a_lone_surrogate_escape_and_keeps_a_pair():
    assert decode_json('["\\ud83d\\ude00"]') == ["\U0001f600"]
    with pytest.raises(ValueError, match="lone UTF-16 surrogate"):
        decode_json('{"a": ["ok", {"\\udc00": 1}]}')

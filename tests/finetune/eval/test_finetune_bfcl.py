"""The AST score against the Berkeley Function Calling Leaderboard's own checker (issue 53): every case of
tests/data/bfcl/conformance.json (made by tools/bfcl_conformance.py, which ran bfcl-eval's `ast_checker` on
each in a venv of its own) scored by gpuval as an example of `score`, the verdicts equal; and the strict
score never passes what the AST score fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuval.finetune.eval.bfcl import OPTIONAL, possible_answers, standardise
from gpuval.finetune.eval.scoring import ast_match, score

FIXTURE = Path(__file__).parents[2] / "data" / "bfcl" / "conformance.json"
DOCUMENT = json.loads(FIXTURE.read_text(encoding="utf-8"))
CASES = DOCUMENT["cases"]


def _first(answers: list[Any]) -> Any:
    value = next((a for a in answers if a != OPTIONAL), OPTIONAL)
    if isinstance(value, dict):  # a dict's answer: each key with its acceptable values
        return {key: _first(v) if isinstance(v, list) else v for key, v in value.items()}
    return value


def example(case: dict[str, Any]) -> dict[str, Any]:
    """A BFCL case as one example of `score`: the model's calls, and reference calls in gpuval's form
    (`arguments` the first acceptable value of each parameter that has one, `acceptable` BFCL's answers)."""
    predicted = [
        {"name": name, "arguments": args} for item in case["model_output"] for name, args in item.items()
    ]
    expected = []
    for item in case["possible_answer"]:
        ((name, answers),) = item.items()
        arguments = {param: _first(v) for param, v in answers.items() if _first(v) != OPTIONAL}
        expected.append({"name": name, "arguments": arguments, "acceptable": answers})
    return {"expected": expected, "predicted": predicted, "json_valid": True, "tools": case["functions"]}


def test_the_fixture_is_bfcl_evals_and_covers_every_kind_of_case():
    assert DOCUMENT["bfcl_eval"] == "2026.3.23" and len(CASES) >= 150
    categories = {case["category"] for case in CASES}
    assert {"simple", "multiple", "parallel", "parallel_multiple"} <= categories
    about = " ".join(case["about"] for case in CASES)
    kinds = [
        "strings",
        "floats",
        "integers",
        "booleans",
        "arrays",
        "tuples",
        "dicts",
        "lists of dicts",
        "any",
    ]
    kinds += ["optional", "required", "variable", "a second acceptable value", "greedy"]
    for kind in kinds:
        assert kind in about, kind
    valid = sum(case["bfcl"]["valid"] for case in CASES)
    assert 30 <= valid <= len(CASES) - 30  # both verdicts, many times


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_the_ast_score_gives_bfcls_verdict(case):
    scored = score([example(case)])
    assert bool(scored["ast_examples"]) == case["bfcl"]["valid"], (case["about"], case["bfcl"])
    # strict: an example exact_call_accuracy passes, the AST score passes
    assert scored["exact_examples"] <= scored["ast_examples"], case["about"]


def test_bfcls_string_standardisation():
    assert standardise("April 1, 2024") == standardise("april 1,2024") == "april12024"
    assert standardise("Dublin!") != standardise("Dublin")  # BFCL keeps other punctuation
    assert standardise("it's") == 'it"s'


def test_a_reference_in_gpuvals_form_gives_bfcls_answers():
    schema = {
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "default": "celsius"},
            "days": {"type": "integer", "default": 1},
            "item": {"type": "object"},
            "note": {"type": "string"},
        },
        "required": ["city", "item"],
    }
    props, required = schema["properties"], set(schema["required"])
    reference = {"name": "f", "arguments": {"city": "Dublin", "unit": "celsius", "item": {"sku": "A"}}}
    assert possible_answers(reference, props, required) == {
        "city": ["Dublin"],
        "unit": ["celsius", OPTIONAL],  # given at its default: may be left out
        "days": [1, OPTIONAL],  # left out: its default or nothing
        "item": [{"sku": ["A"]}],
        "note": [OPTIONAL],  # left out, no default: must be left out
    }
    # BFCL's answers, whole: several values for the city, the note optional, nothing else may be given
    acceptable = {"city": ["Dublin", "Baile Átha Cliath"], "item": [{"sku": ["A", "a1"]}], "note": ["hi", ""]}
    several = {**reference, "acceptable": acceptable}
    assert possible_answers(several, props, required) == acceptable
    tool = {"name": "f", "parameters": schema}
    given = {"name": "f", "arguments": {"city": "baile atha cliath", "item": {"sku": "a"}}}
    assert not ast_match(given, several, tool)  # accents are not standardised away
    given["arguments"]["city"] = "BAILE ÁTHA CLIATH"
    assert ast_match(given, several, tool) and not ast_match(given, reference, tool)


def test_strict_never_passes_what_the_ast_score_fails():
    """The issue's three: a float for an integer, punctuation BFCL keeps, a colon."""
    tool = {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}, "s": {"type": "string"}},
                                        "required": ["n", "s"]}}  # fmt: skip
    reference = {"name": "f", "arguments": {"n": 19, "s": "07:30"}}
    for given in ({"n": 19.0, "s": "07:30"}, {"n": 19, "s": "0730"}, {"n": 19, "s": "07:30!"}):
        example = {"expected": [reference], "predicted": [{"name": "f", "arguments": given}], "tools": [tool]}
        scored = score([example])
        assert scored["ast_examples"] == scored["exact_examples"] == 0, given
    right = {"expected": [reference], "predicted": [{"name": "f", "arguments": {"n": 19, "s": "07:30"}}],
             "tools": [tool]}  # fmt: skip
    assert score([right])["exact_examples"] == score([right])["ast_examples"] == 1


def test_an_openai_format_record_carries_acceptable_values_to_the_score():
    """An OpenAI-format call may carry BFCL's answer (`acceptable`): the prepared record keeps it beside the
    call, the chat template leaves it out of the text trained on, and the AST score accepts each value."""
    from gpuval.finetune.data.glaive import MalformedRecord
    from gpuval.finetune.data.openai_format import convert_record
    from gpuval.finetune.eval.scoring import examples_from_records
    from gpuval.finetune.model import load_tokenizer
    from gpuval.finetune.template import render

    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
    call = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Dublin"}'},
            "acceptable": {"city": ["Dublin", "Baile Átha Cliath"]}}  # fmt: skip
    record = convert_record({"tools": [tool], "messages": [
        {"role": "user", "content": "Weather in Dublin?"},
        {"role": "assistant", "content": "", "tool_calls": [call]}]})  # fmt: skip
    (prepared_call,) = record["messages"][1]["tool_calls"]
    assert prepared_call["acceptable"] == {"city": ["Dublin", "Baile Átha Cliath"]}
    assert "Baile" not in render(record, load_tokenizer("tiny"))
    texts = ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "baile átha cliath"}}\n</tool_call>']
    scored = score(examples_from_records([record], texts))
    assert scored["ast_examples"] == 1 and scored["exact_examples"] == 0  # strict: the reference's own value
    broken = {**call, "acceptable": ["Dublin"]}
    with pytest.raises(MalformedRecord, match="acceptable is a list, not an object of lists"):
        convert_record({"tools": [tool], "messages": [
            {"role": "user", "content": "?"},
            {"role": "assistant", "content": "", "tool_calls": [broken]}]})  # fmt: skip

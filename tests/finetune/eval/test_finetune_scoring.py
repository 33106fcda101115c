"""scoring.py: BFCL-style call matching and the eval metrics, checked against hand-computed numbers."""

from __future__ import annotations

import json

import pytest

from gpuval.finetune.eval.scoring import (
    examples_from_records,
    match_call,
    pair_calls,
    score,
    split_target,
    values_match,
)

WEATHER = {
    "name": "get_weather",
    "description": "Get the weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
CONVERT = {
    "name": "convert",
    "description": "Convert money",
    "parameters": {
        "type": "object",
        "properties": {"amount": {"type": "number"}, "unit": {"type": "string"}},
        "required": ["amount", "unit"],
    },
}
TOOLS = [WEATHER, CONVERT]


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


def block(c):
    return f"<tool_call>\n{json.dumps(c)}\n</tool_call>"


def test_exact_match():
    m = match_call(
        call("get_weather", city="Paris", days=3), call("get_weather", city="Paris", days=3), WEATHER
    )
    assert (m.exact, m.name_ok, m.true_positives, m.predicted_args, m.expected_args) == (True, True, 2, 2, 2)


def test_wrong_name_is_not_exact_and_scores_no_argument():
    m = match_call(call("get_time", city="Paris"), call("get_weather", city="Paris"), WEATHER)
    assert (m.exact, m.name_ok, m.true_positives, m.predicted_args, m.expected_args) == (
        False,
        False,
        0,
        1,
        1,
    )


def test_missing_required_argument():
    m = match_call(call("get_weather", days=3), call("get_weather", city="Paris", days=3), WEATHER)
    assert (m.exact, m.true_positives, m.predicted_args, m.expected_args) == (False, 1, 1, 2)
    # The schema's `required` is checked on its own: even a reference without `city` does not excuse it.
    assert match_call(call("get_weather", days=3), call("get_weather", days=3), None).exact is True
    assert match_call(call("get_weather", days=3), call("get_weather", days=3), WEATHER).exact is False


def test_extra_argument_outside_schema():
    m = match_call(
        call("get_weather", city="Paris", country="FR"), call("get_weather", city="Paris"), WEATHER
    )
    assert (m.exact, m.true_positives, m.predicted_args, m.expected_args) == (False, 1, 2, 1)
    # Outside the schema fails even when the reference has it too; without a schema it would pass.
    both = call("get_weather", city="Paris", country="FR")
    assert match_call(both, both, WEATHER).exact is False
    assert match_call(both, both, None).exact is True


def test_schema_accepts_parameters_object_and_function_wrapper():
    pred = call("get_weather", city="Paris", country="FR")
    exp = call("get_weather", city="Paris", country="FR")
    assert match_call(pred, exp, WEATHER["parameters"]).exact is False
    assert match_call(pred, exp, {"type": "function", "function": WEATHER}).exact is False


def test_int_accepted_for_float_and_equal_numbers():
    exp = call("convert", amount=3.0, unit="usd")
    assert match_call(call("convert", amount=3, unit="usd"), exp, CONVERT).exact is True
    assert match_call(
        call("convert", amount=3.0, unit="usd"), call("convert", amount=3, unit="usd"), CONVERT
    ).exact
    assert match_call(call("convert", amount=3.5, unit="usd"), exp, CONVERT).exact is False
    assert values_match("3", 3) is False


def test_strings_case_and_spacing_insensitive_but_never_looser_than_bfcl():
    exp = call("get_weather", city="New York")
    assert match_call(call("get_weather", city="  NEW   York. "), exp, WEATHER).exact is True
    assert match_call(call("get_weather", city="Newark"), exp, WEATHER).exact is False
    # the strict score passes only what BFCL's AST check passes: it keeps a "!" (issue 53)
    assert values_match("new york!", "New York") is True  # the argument slot still counts for F1
    assert match_call(call("get_weather", city="new york!"), exp, WEATHER).exact is False


def test_lists_in_order_element_wise():
    assert values_match([1, 2, 3], [1, 2, 3]) is True
    assert values_match([1, 2, 3], [3, 2, 1]) is False
    assert values_match([1, 2], [1, 2, 3]) is False
    assert values_match([1, "New York"], [1.0, "new york!"]) is True


def test_dicts_recursive():
    assert values_match({"a": {"b": [1, "X!"]}}, {"a": {"b": [1.0, "x"]}}) is True
    assert values_match({"a": {"b": [1, "X"]}}, {"a": {"b": [1, "y"]}}) is False
    assert values_match({"a": 1}, {"a": 1, "b": 2}) is False


def test_bool_strict():
    assert values_match(True, True) is True
    assert values_match(True, 1) is False
    assert values_match(1, True) is False
    assert values_match(0, False) is False
    assert values_match(False, True) is False


def test_two_calls_in_different_order_still_exact():
    expected = [call("get_weather", city="Paris"), call("convert", amount=3.0, unit="usd")]
    predicted = [call("convert", amount=3, unit="USD"), call("get_weather", city="paris")]
    pairs = pair_calls(predicted, expected, TOOLS)
    assert sorted((p, e) for p, e, _ in pairs) == [(0, 1), (1, 0)]
    assert all(m.exact for _, _, m in pairs)
    result = score([{"expected": expected, "predicted": predicted, "json_valid": True, "tools": TOOLS}])
    assert result["exact_call_accuracy"] == 1.0
    assert result["argument_exact_match"] == 1.0


def test_extra_or_duplicate_call_is_not_exact():
    expected = [call("get_weather", city="Paris")]
    predicted = [call("get_weather", city="Paris"), call("get_weather", city="Paris")]
    result = score([{"expected": expected, "predicted": predicted, "json_valid": True, "tools": TOOLS}])
    assert result["exact_call_accuracy"] == 0.0
    assert result["argument_exact_match"] == 1.0
    assert result["name_accuracy"] == 0.0


def _hand_set():
    """Eight records and the texts generated for them; metrics worked out by hand below."""
    user = {"role": "user", "content": "hi"}

    def record(tool_calls):
        reply = {"role": "assistant", "content": "" if tool_calls else "Sure."}
        if tool_calls:
            reply["tool_calls"] = tool_calls
        return {"tools": TOOLS, "messages": [user, reply]}

    rows = [
        # A: exact
        (
            record([call("get_weather", city="Paris", days=3)]),
            block(call("get_weather", city="Paris", days=3)),
        ),
        # B: "New York" vs "new york!" -> its argument slot matches, but the call is not exact: BFCL keeps "!"
        (record([call("get_weather", city="New York")]), block(call("get_weather", city="new york!"))),
        # C: no call expected, none produced -> correct
        (record([]), "I can't help with that."),
        # D: no call expected, a call produced -> wrong
        (record([]), block(call("get_weather", city="Rome"))),
        # E: call expected, none produced
        (record([call("get_weather", city="Oslo", days=2)]), "The weather is nice."),
        # F: call expected, only an invalid JSON block
        (record([call("get_weather", city="Oslo")]), "<tool_call>\n{'name': get_weather\n</tool_call>"),
        # G: two calls, other order, int for float, case -> exact
        (
            record([call("get_weather", city="Paris"), call("convert", amount=3.0, unit="usd")]),
            block(call("convert", amount=3, unit="USD")) + "\n" + block(call("get_weather", city="paris")),
        ),
        # H: wrong name
        (record([call("get_weather", city="Lima")]), block(call("get_time", city="Lima"))),
    ]
    return [r for r, _ in rows], [t for _, t in rows]


def test_score_hand_computed():
    records, texts = _hand_set()
    result = score(examples_from_records(records, texts))
    # made: A B D F G H; expected: A B E F G H
    assert (result["call_tp"], result["call_fp"], result["call_fn"], result["call_tn"]) == (5, 1, 1, 1)
    assert result["call_precision"] == pytest.approx(5 / 6)
    assert result["call_recall"] == pytest.approx(5 / 6)
    assert result["call_f1"] == pytest.approx(5 / 6)
    # F's block is invalid: 5 valid of 6 made
    assert (result["calls_made"], result["json_valid_count"]) == (6, 5)
    assert result["json_validity"] == pytest.approx(5 / 6)
    # names right in A B G of 6 expected
    assert (result["calls_expected"], result["name_correct"]) == (6, 3)
    assert result["name_accuracy"] == 0.5
    # expected calls A1 B1 E1 F1 G2 H1 = 7, exact A G(2) = 3
    assert (result["expected_call_count"], result["exact_call_count"]) == (7, 3)
    assert result["argument_exact_match"] == pytest.approx(3 / 7)
    # slots: expected 2+1+2+1+3+1 = 10, predicted 2+1+1+3+1 = 8, matched 2+1+3 = 6
    assert (result["argument_tp"], result["argument_predicted"], result["argument_expected"]) == (6, 8, 10)
    assert result["argument_precision"] == 0.75
    assert result["argument_recall"] == 0.6
    assert result["argument_f1"] == pytest.approx(2 / 3)
    # fully correct: A C G of 8
    assert (result["examples"], result["exact_examples"]) == (8, 3)
    assert result["exact_call_accuracy"] == 3 / 8


@pytest.mark.parametrize(
    ("index", "correct"),
    [(0, True), (1, False), (2, True), (3, False), (4, False), (5, False), (6, True), (7, False)],
)
def test_each_hand_example_alone(index, correct):
    records, texts = _hand_set()
    result = score(examples_from_records(records[index : index + 1], texts[index : index + 1]))
    assert result["exact_call_accuracy"] == (1.0 if correct else 0.0)


def test_invalid_json_counts_against_validity_even_beside_a_valid_call():
    records, _ = _hand_set()
    text = block(call("get_weather", city="Paris", days=3)) + "<tool_call>{broken</tool_call>"
    (example,) = examples_from_records(records[:1], [text])
    assert example["json_valid"] is False and example["block_count"] == 2
    result = score([example])
    assert result["json_validity"] == 0.0
    assert result["exact_call_accuracy"] == 0.0


def test_zero_denominators_are_none():
    empty = score([])
    assert empty["examples"] == 0
    for key in ("call_precision", "call_recall", "call_f1", "json_validity", "name_accuracy"):
        assert empty[key] is None
    for key in ("argument_exact_match", "argument_precision", "argument_f1", "exact_call_accuracy"):
        assert empty[key] is None
    only_no_call = score([{"expected": [], "predicted": [], "json_valid": True, "tools": TOOLS}])
    assert only_no_call["call_precision"] is None and only_no_call["call_f1"] is None
    assert only_no_call["json_validity"] is None and only_no_call["name_accuracy"] is None
    assert only_no_call["exact_call_accuracy"] == 1.0
    all_missed = score([{"expected": [call("get_weather", city="X")], "predicted": [], "json_valid": True}])
    assert all_missed["call_precision"] is None and all_missed["call_recall"] == 0.0
    assert all_missed["argument_precision"] is None and all_missed["argument_recall"] == 0.0


def test_split_target_first_assistant_turn():
    record = {
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [call("get_weather", city="Paris")]},
            {"role": "tool", "content": "{}"},
            {"role": "assistant", "content": "Sunny."},
        ],
    }
    prompt, expected = split_target(record)
    assert prompt == {"tools": TOOLS, "messages": record["messages"][:1]}
    assert expected == [call("get_weather", city="Paris")]


def test_records_helper_rejects_mismatch_and_missing_target():
    records, texts = _hand_set()
    with pytest.raises(ValueError, match="8 records but 7 predictions"):
        examples_from_records(records, texts[:7])
    with pytest.raises(ValueError, match="record 0: record has no assistant turn"):
        examples_from_records([{"tools": [], "messages": [{"role": "user", "content": "x"}]}], [""])


# --- BFCL-style AST match: hand-written cases -----------------------------------------------------------
HOTEL = {
    "name": "book_hotel",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "nights": {"type": "integer"},
            "budget": {"type": "number"},
            "breakfast": {"type": "boolean", "default": False},
            "rooms": {"type": "integer", "default": 1},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["city", "nights"],
    },
}
REFERENCE = {"name": "book_hotel", "arguments": {"city": "New York", "nights": 3, "budget": 250.0}}
NY = {"city": "New York", "nights": 3}


def _ast(arguments: dict, name: str = "book_hotel", reference: dict = REFERENCE) -> bool:
    from gpuval.finetune.eval.scoring import ast_match

    return ast_match({"name": name, "arguments": arguments}, reference, HOTEL)


@pytest.mark.parametrize(
    ("arguments", "ok", "why"),
    [
        (REFERENCE["arguments"], True, "the reference itself, optional breakfast and rooms left out"),
        (NY, False, "an optional argument the reference set, not at a default, left out"),
        ({**NY, "budget": 250.0, "breakfast": False}, True, "an optional argument at its default"),
        ({**NY, "budget": 250.0, "rooms": 1}, True, "an optional argument at its default (integer)"),
        ({**NY, "budget": 250.0, "breakfast": True}, False, "optional, neither the reference nor default"),
        ({**NY, "budget": 250.0, "rooms": 2}, False, "optional, neither the reference nor default"),
        ({**NY, "budget": 300.0}, False, "an optional argument given, not the reference's value"),
        ({"city": "New York", "budget": 250.0}, False, "a required argument missing"),
        ({**NY, "budget": 250.0, "pets": True}, False, "a parameter the function does not have"),
        ({**NY, "budget": 250}, True, "an integer for a number"),
        ({"city": "New York", "nights": 3.0, "budget": 250.0}, False, "a float for an integer"),
        ({"city": "New York", "nights": "3", "budget": 250.0}, False, "a numeric string for an integer"),
        ({"city": "New York", "nights": True, "budget": 250.0}, False, "a boolean is not an integer"),
        ({**NY, "budget": "250"}, False, "a numeric string for a number"),
        ({"city": "new-york", "nights": 3, "budget": 250.0}, True, "strings standardised: case, '-'"),
        ({"city": "NewYork", "nights": 3, "budget": 250.0}, True, "strings standardised: spaces"),
        ({"city": "New York!", "nights": 3, "budget": 250.0}, False, "'!' is not among what BFCL strips"),
        ({"city": "Newark", "nights": 3, "budget": 250.0}, False, "another string"),
    ],
)
def test_ast_match_hand_written(arguments, ok, why):
    assert _ast(arguments) is ok, why


def test_ast_match_optional_arguments_against_the_reference_and_default():
    """BFCL's possible answers: an optional argument the reference gives at its default may be left out
    (BFCL lists it with ""); one it gives at another value must be given at that value."""
    at_default = {"name": "book_hotel", "arguments": {**NY, "rooms": 1}}
    assert _ast(NY, reference=at_default)
    assert _ast({**NY, "rooms": 1}, reference=at_default)
    assert not _ast({**NY, "rooms": 3}, reference=at_default)
    other = {"name": "book_hotel", "arguments": {**NY, "rooms": 2}}
    assert _ast({**NY, "rooms": 2}, reference=other)
    assert not _ast(NY, reference=other)  # BFCL: "Optional parameter not provided"
    assert not _ast({**NY, "rooms": 1}, reference=other)  # the default is not what was asked


def test_ast_match_name_and_arrays_and_no_schema():
    from gpuval.finetune.eval.scoring import ast_match

    assert not _ast({"city": "New York", "nights": 3}, name="book_flight")
    ref = {"name": "book_hotel", "arguments": {"city": "Oslo", "nights": 1, "tags": ["Sea View", "quiet"]}}
    assert _ast({"city": "Oslo", "nights": 1, "tags": ["seaview", "Quiet"]}, reference=ref)
    assert not _ast({"city": "Oslo", "nights": 1, "tags": ["quiet", "Sea View"]}, reference=ref)  # order
    assert not _ast({"city": "Oslo", "nights": 1, "tags": ["Sea View", 2]}, reference=ref)  # item type
    assert not _ast({"city": "Oslo", "nights": 1, "tags": "Sea View, quiet"}, reference=ref)  # not a list
    # without a schema every reference argument is required, typed as the reference gives it, and nothing
    # else is allowed
    bare = {"name": "f", "arguments": {"a": 1}}
    assert ast_match({"name": "f", "arguments": {"a": 1}}, bare, None)
    assert not ast_match({"name": "f", "arguments": {"a": 1.0}}, bare, None)  # BFCL: 1.0 is no integer
    assert not ast_match({"name": "f", "arguments": {}}, bare, None)
    assert not ast_match({"name": "f", "arguments": {"a": 1, "b": 2}}, bare, None)


def test_ast_match_a_reference_typed_unlike_its_schema_passes_its_own_type():
    """BFCL accepts a value of the reference's type where it differs from the schema's (its rule for
    variables); so a dataset's reference always matches itself."""
    odd = {"name": "book_hotel", "arguments": {"city": "Oslo", "nights": "2"}}
    assert _ast({"city": "Oslo", "nights": "2"}, reference=odd)
    assert not _ast({"city": "Oslo", "nights": "3"}, reference=odd)
    assert not _ast({"city": "Oslo", "nights": 2}, reference=odd)  # a schema-typed value, unequal to "2"


def test_ast_match_wrapped_tool_schema():
    from gpuval.finetune.eval.scoring import ast_match

    wrapped = {"type": "function", "function": HOTEL}
    assert ast_match({"name": "book_hotel", "arguments": REFERENCE["arguments"]}, REFERENCE, wrapped)
    assert not ast_match({"name": "book_hotel", "arguments": {**NY, "pets": 1}}, REFERENCE, wrapped)


def test_score_reports_ast_accuracy_beside_the_strict_one():
    """Three examples: the strict score and the AST one agree on two and part on the third, where the
    model spelled out an optional argument at its default (2/3 strict, 3/3 AST)."""
    tools = [HOTEL]
    examples = [
        {"expected": [REFERENCE], "predicted": [REFERENCE], "json_valid": True, "tools": tools},
        {"expected": [], "predicted": [], "json_valid": True, "tools": tools},
        {
            "expected": [REFERENCE],
            "predicted": [{"name": "book_hotel", "arguments": {**REFERENCE["arguments"], "rooms": 1}}],
            "json_valid": True,
            "tools": tools,
        },
    ]
    result = score(examples)
    assert result["exact_call_accuracy"] == pytest.approx(2 / 3)
    assert result["ast_accuracy"] == 1.0 and result["ast_examples"] == 3
    # two calls in either order, and an extra call is wrong under both rules
    second = {"name": "book_hotel", "arguments": {"city": "Oslo", "nights": 1}}
    both = {"expected": [REFERENCE, second], "json_valid": True, "tools": tools}
    assert score([{**both, "predicted": [second, REFERENCE]}])["ast_accuracy"] == 1.0
    assert score([{**both, "predicted": [second, REFERENCE, second]}])["ast_accuracy"] == 0.0
    assert score([{**both, "predicted": [second, REFERENCE], "json_valid": False}])["ast_accuracy"] == 0.0
    assert score([{**both, "predicted": [second]}])["ast_accuracy"] == 0.0  # one call missing
    wrong_second = {"name": "book_hotel", "arguments": {"city": "Oslo", "nights": 2}}
    assert score([{**both, "predicted": [wrong_second, REFERENCE]}])["ast_accuracy"] == 0.0


def test_ast_accuracy_on_examples_that_expect_no_call():
    """A case that expects no call passes only when no call is made: no parsed call, no block, valid."""
    quiet = {"expected": [], "json_valid": True, "tools": [HOTEL]}
    assert score([{**quiet, "predicted": []}])["ast_accuracy"] == 1.0
    assert score([{**quiet, "predicted": [REFERENCE]}])["ast_accuracy"] == 0.0
    assert score([{**quiet, "predicted": [], "block_count": 1, "json_valid": False}])["ast_accuracy"] == 0.0
    # and a case that expects a call fails when the model makes none
    missed = {"expected": [REFERENCE], "predicted": [], "json_valid": True, "tools": [HOTEL]}
    assert score([missed])["ast_accuracy"] == 0.0 and score([missed])["exact_call_accuracy"] == 0.0

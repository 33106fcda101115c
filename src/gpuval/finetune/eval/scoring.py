"""Function-calling scoring after the Berkeley Function Calling Leaderboard's AST match.

The method and its source: docs/function-calling-eval.md.

Pure Python, no model. A call is `{"name": str, "arguments": dict}` (as `template.parse_tool_calls` and
prepared records give it).

`match_call` compares one predicted call with one expected call:
- the name must match exactly;
- when a schema is given, every `required` parameter must be present in the prediction and no predicted
  parameter may fall outside the schema's `properties`;
- the predicted argument names must equal the expected ones (an optional parameter the reference left out
  is not accepted), and each value must match after normalisation:
  numbers equal across int/float (3 == 3.0), strings compared case- and punctuation-insensitively with
  whitespace collapsed, lists in order element-wise, dicts recursively, booleans strictly (True != 1),
  `None` only to `None`; no other cross-type match ("3" != 3) (these count argument slots for F1);
- and the call passes `ast_match`.

`ast_match` is the Berkeley Function Calling Leaderboard's AST check (finetune/eval/bfcl.py: bfcl-eval
2026.3.23's rules, held to its verdicts): the name, then the arguments against the reference's possible
answers (its `acceptable`, or made from its arguments and the schema). `score` reports it as
`ast_accuracy` beside the strict `exact_call_accuracy`; a call is exact only when `ast_match` passes it too,
so the strict score never passes what the AST score fails.

`score` aggregates examples. Zero denominators give `None` (never 0.0 or NaN); F1 is `None` when precision
or recall is `None`, and 0.0 when both are 0.
"""

from __future__ import annotations

import math
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuval.finetune.eval.bfcl import check_call, possible_answers
from gpuval.finetune.template import parse_tool_calls


@dataclass(frozen=True)
class CallMatch:
    exact: bool  # name, schema checks and every argument matched, no argument missing or extra
    name_ok: bool
    true_positives: int  # arguments present in both with matching values (0 when the name differs)
    predicted_args: int  # argument slots in the predicted call
    expected_args: int  # argument slots in the expected call


def _parameters(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """The JSON-schema object of a tool: accepts a tool (`{"name", "parameters"}`, optionally wrapped in
    `{"type": "function", "function": ...}`) or its parameters object itself."""
    if schema is None:
        return None
    if isinstance(schema.get("function"), dict):
        schema = schema["function"]
    if isinstance(schema.get("parameters"), dict):
        return schema["parameters"]
    return schema


def _norm_string(value: str) -> str:
    text = "".join(c for c in value.casefold() if not unicodedata.category(c).startswith("P"))
    return " ".join(text.split())


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def values_match(predicted: Any, expected: Any) -> bool:
    """Whether two argument values are equal after the normalisation described in the module docstring."""
    if isinstance(expected, bool) or isinstance(predicted, bool):
        return type(predicted) is type(expected) and predicted == expected
    if _is_number(expected) or _is_number(predicted):
        if not (_is_number(expected) and _is_number(predicted)):
            return False
        return math.isclose(predicted, expected, rel_tol=1e-9, abs_tol=0.0)
    if isinstance(expected, str) or isinstance(predicted, str):
        if not (isinstance(expected, str) and isinstance(predicted, str)):
            return False
        return _norm_string(predicted) == _norm_string(expected)
    if isinstance(expected, list) or isinstance(predicted, list):
        if not (isinstance(expected, list) and isinstance(predicted, list)):
            return False
        return len(predicted) == len(expected) and all(map(values_match, predicted, expected))
    if isinstance(expected, dict) or isinstance(predicted, dict):
        if not (isinstance(expected, dict) and isinstance(predicted, dict)):
            return False
        return predicted.keys() == expected.keys() and all(
            values_match(predicted[key], expected[key]) for key in expected
        )
    return predicted is None and expected is None


def match_call(
    predicted: dict[str, Any], expected: dict[str, Any], schema: dict[str, Any] | None
) -> CallMatch:
    """Compare one predicted call with one expected call (see the module docstring for the rules)."""
    pred_args = predicted.get("arguments") or {}
    exp_args = expected.get("arguments") or {}
    name_ok = predicted.get("name") == expected.get("name")
    tp = 0
    if name_ok:
        tp = sum(1 for k, v in exp_args.items() if k in pred_args and values_match(pred_args[k], v))
    schema_ok = True
    params = _parameters(schema)
    if params is not None:
        required = params.get("required") or []
        properties = params.get("properties")
        schema_ok = all(name in pred_args for name in required)
        if isinstance(properties, dict):
            schema_ok = schema_ok and all(name in properties for name in pred_args)
    exact = name_ok and schema_ok and pred_args.keys() == exp_args.keys() and tp == len(exp_args)
    # strict means at least what BFCL asks: a call exact here passes the AST score too
    exact = exact and ast_match(predicted, expected, schema)
    return CallMatch(exact, name_ok, tp, len(pred_args), len(exp_args))


# A reference value's JSON type as a schema type, for a call whose tool has no schema
_INFERRED = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "float"),
    (str, "string"),
    (list, "array"),
    (dict, "dict"),
)


def ast_match(predicted: dict[str, Any], expected: dict[str, Any], schema: dict[str, Any] | None) -> bool:
    """One predicted call against one reference call by BFCL's AST rules (finetune/eval/bfcl.py): the name,
    then the arguments against the reference's possible answers. Without a schema the reference's arguments
    are the function's, all required, typed as the reference gives them."""
    if predicted.get("name") != expected.get("name"):
        return False
    pred_args = predicted.get("arguments") or {}
    params = _parameters(schema) or {}
    if isinstance(params.get("properties"), dict):
        properties, required = params["properties"], set(params.get("required") or [])
    else:
        exp_args = expected.get("arguments") or {}
        properties = {
            name: {"type": next((kind for cls, kind in _INFERRED if isinstance(value, cls)), None)}
            for name, value in exp_args.items()
        }
        required = set(exp_args)
    return check_call(pred_args, possible_answers(expected, properties, required), properties, required)


def _tool_schema(tools: Iterable[dict[str, Any]], name: Any) -> dict[str, Any] | None:
    for tool in tools or ():
        body = tool["function"] if isinstance(tool.get("function"), dict) else tool
        if body.get("name") == name:
            return body
    return None


def pair_calls(
    predicted: Sequence[dict[str, Any]],
    expected: Sequence[dict[str, Any]],
    tools: Iterable[dict[str, Any]] = (),
) -> list[tuple[int, int, CallMatch]]:
    """Pair predicted with expected calls as a multiset, order-insensitive: greedily, best pairs first
    (exact, then same name, then most matching arguments). Returns `(predicted_i, expected_i, match)`;
    calls left over on either side are unpaired."""
    tools = list(tools or ())
    candidates = []
    for e, exp in enumerate(expected):
        schema = _tool_schema(tools, exp.get("name"))
        for p, pred in enumerate(predicted):
            m = match_call(pred, exp, schema)
            candidates.append(((m.exact, m.name_ok, m.true_positives), p, e, m))
    candidates.sort(key=lambda c: (c[0], -c[1], -c[2]), reverse=True)
    used_p: set[int] = set()
    used_e: set[int] = set()
    pairs = []
    for _, p, e, m in candidates:
        if p not in used_p and e not in used_e:
            used_p.add(p)
            used_e.add(e)
            pairs.append((p, e, m))
    return pairs


def _ast_all(
    predicted: Sequence[dict[str, Any]], expected: Sequence[dict[str, Any]], tools: list[dict[str, Any]]
) -> bool:
    """Whether every expected call has its own predicted call that `ast_match`es it (in any order)."""
    free = list(range(len(predicted)))
    for exp in expected:
        schema = _tool_schema(tools, exp.get("name"))
        hit = next((p for p in free if ast_match(predicted[p], exp, schema)), None)
        if hit is None:
            return False
        free.remove(hit)
    return True


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def _f1(precision: float | None, recall: float | None) -> float | None:
    if precision is None or recall is None:
        return None
    if precision + recall == 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def score(examples: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate metrics over examples `{"expected": [calls], "predicted": [calls], "json_valid": bool,
    "tools": [schemas], "block_count": int (optional)}`.

    - A call is *made* when any call was parsed, any `<tool_call>` block was found, or JSON was invalid.
      Call/no-call precision/recall/F1 take "a call is expected/made" as the positive class.
    - `json_validity`: of examples where a call was made, the fraction whose blocks all parsed.
    - `name_accuracy`: of examples where a call was expected, the fraction whose predicted names equal the
      expected names as a multiset.
    - `argument_exact_match`: of expected calls, the fraction paired with an exact predicted call.
    - `argument_precision/recall/f1`: micro over argument slots; a true positive is an expected argument
      present with a matching value in the predicted call paired with it (same name); predicted slots
      count every predicted call, paired or not, in every example.
    - `ast_accuracy`: the same as `exact_call_accuracy`, but each call judged by `ast_match` (BFCL's rules).
    - `exact_call_accuracy` (headline): fraction of examples fully correct: when calls are expected, every
      expected call paired exactly, no extra predicted call and JSON valid; when none is expected, no call
      made.
    Ratios with a zero denominator are `None`.
    """
    n = tp = fp = fn = tn = 0
    made_n = valid_n = 0
    name_den = name_ok = 0
    exp_calls = exact_calls = 0
    arg_tp = arg_pred = arg_exp = 0
    exact_examples = ast_examples = 0
    for example in examples:
        n += 1
        expected = list(example.get("expected") or [])
        predicted = list(example.get("predicted") or [])
        json_valid = bool(example.get("json_valid", True))
        made = bool(predicted) or example.get("block_count", 0) > 0 or not json_valid
        wanted = bool(expected)
        tp += wanted and made
        fp += made and not wanted
        fn += wanted and not made
        tn += not wanted and not made
        if made:
            made_n += 1
            valid_n += json_valid
        arg_pred += sum(len(c.get("arguments") or {}) for c in predicted)
        arg_exp += sum(len(c.get("arguments") or {}) for c in expected)
        if not wanted:
            exact_examples += not made
            ast_examples += not made
            continue
        name_den += 1
        name_ok += Counter(c.get("name") for c in predicted) == Counter(c.get("name") for c in expected)
        tools = list(example.get("tools") or ())
        pairs = pair_calls(predicted, expected, tools)
        exact_here = sum(m.exact for _, _, m in pairs)
        exp_calls += len(expected)
        exact_calls += exact_here
        arg_tp += sum(m.true_positives for _, _, m in pairs)
        ast_here = json_valid and len(predicted) == len(expected) and _ast_all(predicted, expected, tools)
        ast_examples += ast_here
        # an example exact here passes the AST score too (BFCL pairs calls greedily in the reference's order)
        exact_examples += ast_here and exact_here == len(expected)
    call_p, call_r = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
    arg_p, arg_r = _ratio(arg_tp, arg_pred), _ratio(arg_tp, arg_exp)
    return {
        "examples": n,
        "call_tp": tp,
        "call_fp": fp,
        "call_fn": fn,
        "call_tn": tn,
        "call_precision": call_p,
        "call_recall": call_r,
        "call_f1": _f1(call_p, call_r),
        "calls_made": made_n,
        "json_valid_count": valid_n,
        "json_validity": _ratio(valid_n, made_n),
        "calls_expected": name_den,
        "name_correct": name_ok,
        "name_accuracy": _ratio(name_ok, name_den),
        "expected_call_count": exp_calls,
        "exact_call_count": exact_calls,
        "argument_exact_match": _ratio(exact_calls, exp_calls),
        "argument_tp": arg_tp,
        "argument_predicted": arg_pred,
        "argument_expected": arg_exp,
        "argument_precision": arg_p,
        "argument_recall": arg_r,
        "argument_f1": _f1(arg_p, arg_r),
        "exact_examples": exact_examples,
        "exact_call_accuracy": _ratio(exact_examples, n),
        "ast_examples": ast_examples,
        "ast_accuracy": _ratio(ast_examples, n),
    }


def split_target(record: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The prediction target of a prepared record: its first assistant turn (one target per record).

    Returns the prompt (`{"tools", "messages"}` before that turn) and the turn's expected calls (empty
    when the reply has no call: "no call expected"). Raises ValueError if the record has no assistant turn.
    """
    messages = record.get("messages") or []
    for i, message in enumerate(messages):
        if message.get("role") == "assistant":
            prompt = {"tools": record.get("tools") or [], "messages": messages[:i]}
            return prompt, list(message.get("tool_calls") or [])
    raise ValueError("record has no assistant turn to predict")


def examples_from_records(
    records: Sequence[dict[str, Any]], predictions: Sequence[str]
) -> list[dict[str, Any]]:
    """Pair each prepared record's target (see `split_target`) with the generated text for it, parsed by
    `template.parse_tool_calls`, into examples for `score`. `predictions[i]` belongs to `records[i]`."""
    if len(records) != len(predictions):
        raise ValueError(f"{len(records)} records but {len(predictions)} predictions")
    examples = []
    for i, (record, text) in enumerate(zip(records, predictions, strict=True)):
        try:
            _, expected = split_target(record)
        except ValueError as error:
            raise ValueError(f"record {i}: {error}") from None
        parsed = parse_tool_calls(text)
        examples.append(
            {
                "expected": expected,
                "predicted": parsed.calls,
                "json_valid": parsed.json_valid,
                "block_count": parsed.block_count,
                "tools": record.get("tools") or [],
            }
        )
    return examples

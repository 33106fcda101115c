"""The AST score's rules: the Berkeley Function Calling Leaderboard's checker for Python calls, as
bfcl-eval 2026.3.23 has it (`bfcl_eval/eval_checker/ast_eval/ast_checker.py`), written here from its
behaviour; docs/function-calling-eval.md maps each rule to the function of that file, and
tests/finetune/eval/test_finetune_bfcl.py holds this module to bfcl-eval's own verdicts on the cases of
tests/data/bfcl/conformance.json (made by tools/bfcl_conformance.py).

BFCL judges a call against *possible answers*: per parameter, the list of acceptable values, `""` meaning
the parameter may be left out (`{param: [value, ...]}`; a dict's acceptable value is itself
`{key: [value, ...]}`, a list of dicts' a list of such dicts). gpuval's reference call is
`{"name", "arguments"}` (what the model is trained to say), optionally with `"acceptable": {param:
[value, ...]}`: BFCL's possible answers for the call, whole (several acceptable values, `""` for "may be
left out"; a parameter it does not name may not be given, as in BFCL). Without it the answers come from
the call and the tool's schema (`possible_answers`):

- a parameter the call gives: its value (a dict's keys each with its one value); `""` too when the schema
  has it optional with that value as its `default`;
- an optional parameter the call leaves out: `""`, and the schema's `default` when it has one.

Then a predicted call passes (`check_call`) when:
- every `required` parameter is given, and every given one is in the schema and has possible answers;
- each given value has the parameter's type: strict Python types (a boolean is no integer, 2.0 no
  integer) after an integer given for a `float`/`number` became a float; or, when the possible answers are
  of another type than the schema's (a variable's name where a number is described), that type. An
  `array`/`tuple`'s items have its `items` type, one level deep, or the type of the answer's first item;
  an answer that is not a list (`""`) lets any items through;
- each value is among the possible answers: strings *standardised* (spaces and `,./-_*^` removed, lower
  case, `'` as `"`), also each top-level string of a list and each string value directly inside a dict;
  a dict's keys must all be the answer's and every key the answer needs (no `""` among its values) given;
  a list of dicts item by item, in order; anything else (numbers, booleans, nested values, a value typed
  as its answers instead of its schema) by Python equality, so 1 == 1.0 == true;
- every parameter with possible answers is given unless `""` is among them.

Schema types: BFCL's Python names (string, integer, float, boolean, array, tuple, dict, any) and the JSON
Schema ones tools use (number as float, object as dict). A property with no type, or one BFCL does not
know, is compared by equality without a type check (BFCL cannot score it: its checker stops on it).
"""

from __future__ import annotations

import re
from typing import Any

OPTIONAL = ""  # among a parameter's possible answers: it may be left out
_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "number": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "object": dict,
    "any": str,
}
_ITEMS_CHECKED = ("array", "tuple")  # the types whose items are checked, one level deep
_STRIPPED = re.compile(r"[ ,./\-_*^]")


def standardise(text: str) -> str:
    """BFCL's string standardisation: spaces and `,./-_*^` removed, lower case, `'` as `"`."""
    return _STRIPPED.sub("", text).lower().replace("'", '"')


def _python_type(spec: Any) -> type | None:
    kind = spec.get("type") if isinstance(spec, dict) else None
    return _TYPES.get(kind) if isinstance(kind, str) else None


def _items_type(spec: dict[str, Any]) -> type | None:
    if spec.get("type") not in _ITEMS_CHECKED:
        return None
    return _python_type(spec.get("items"))


def _answer_type(answers: list[Any]) -> type | None:
    """The type of the first answer that is not `""`."""
    return next((type(answer) for answer in answers if answer != OPTIONAL), None)


def _typed(value: Any, answers: list[Any], kind: type, items: type | None) -> tuple[bool, bool]:
    """(the value has its type, it is typed as its answers instead of its schema: a "variable")."""
    answer_type = _answer_type(answers)
    variable = answer_type is not None and answer_type is not kind
    if type(value) is kind:
        if items is None:
            return True, variable
        for answer in answers:
            if not isinstance(answer, list):
                return True, variable  # `""`: the items go unchecked
            if all(_typed(item, answer, items, None)[0] for item in value):
                return True, variable
        return False, variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, False


def _listed(answer: Any) -> list[Any]:
    return answer if isinstance(answer, list) else [] if answer == OPTIONAL else [answer]


def _dict_ok(value: dict[str, Any], answers: list[Any]) -> bool:
    for answer in answers:
        if answer == OPTIONAL or not isinstance(answer, dict):
            continue
        given_ok = all(
            key in answer
            and (standardise(item) if type(item) is str else item)
            in [standardise(a) if type(a) is str else a for a in _listed(answer[key])]
            for key, item in value.items()
        )
        needed = all(key in value or OPTIONAL in _listed(acceptable) for key, acceptable in answer.items())
        if given_ok and needed:
            return True
    return False


def _dicts_ok(value: list[Any], answers: list[Any]) -> bool:
    for answer in answers:
        answer = _listed(answer)
        if len(value) == len(answer) and all(
            isinstance(item, dict) and _dict_ok(item, [expected])
            for item, expected in zip(value, answer, strict=True)
        ):
            return True
    return False


def _list_ok(value: list[Any], answers: list[Any]) -> bool:
    given = [standardise(item) if type(item) is str else item for item in value]
    return any(
        given == [standardise(item) if type(item) is str else item for item in _listed(answer)]
        for answer in answers
    )


def value_ok(value: Any, answers: list[Any], spec: Any) -> bool:
    """One given value against its possible answers and its schema (module docstring)."""
    kind = _python_type(spec)
    if kind is None:
        return value in answers
    if kind is float and type(value) is int:
        value = float(value)
    items = _items_type(spec)
    typed, variable = _typed(value, answers, kind, items)
    if not typed:
        return False
    if not variable:
        if kind is dict:
            return _dict_ok(value, answers)
        if kind is list and items is dict:
            return _dicts_ok(value, answers)
        if kind is str:
            return standardise(value) in [standardise(a) for a in answers if type(a) is str]
        if kind is list:
            return _list_ok(value, answers)
    return value in answers


def _as_answer(value: Any, spec: Any) -> Any:
    """A reference value in BFCL's answer form: a dict's keys each with its one value."""
    kind = _python_type(spec)
    if kind is dict and isinstance(value, dict):
        return {key: [item] for key, item in value.items()}
    if kind is list and isinstance(spec, dict) and _items_type(spec) is dict and isinstance(value, list):
        return [_as_answer(item, {"type": "dict"}) for item in value]
    return value


def possible_answers(
    expected: dict[str, Any], properties: dict[str, Any], required: set[str]
) -> dict[str, list[Any]]:
    """The possible answers of a reference call (module docstring): its `acceptable` when it has them,
    else made from its arguments and the schema's `properties`, `required` and defaults."""
    acceptable = expected.get("acceptable")
    if isinstance(acceptable, dict):
        return {name: list(_listed(values)) or [OPTIONAL] for name, values in acceptable.items()}
    arguments = expected.get("arguments") or {}
    answers: dict[str, list[Any]] = {}
    for name in {*properties, *arguments}:
        spec = properties.get(name)
        has_default = isinstance(spec, dict) and "default" in spec
        if name in arguments:
            value = arguments[name]
            answers[name] = [_as_answer(value, spec)]
            if name not in required and has_default and _same(value, spec["default"]):
                answers[name].append(OPTIONAL)
        elif name not in required:
            answers[name] = [_as_answer(spec["default"], spec), OPTIONAL] if has_default else [OPTIONAL]
    return answers


def _same(value: Any, default: Any) -> bool:
    """A reference value equal to the schema's default, by JSON type and value."""
    if isinstance(value, bool) or isinstance(default, bool):
        return value is default
    if isinstance(value, int | float) and isinstance(default, int | float):
        return value == default
    return type(value) is type(default) and value == default


def check_call(
    given: dict[str, Any], answers: dict[str, list[Any]], properties: dict[str, Any], required: set[str]
) -> bool:
    """BFCL's verdict on one call's arguments (the names already matched; module docstring)."""
    if not required <= given.keys():
        return False  # missing required parameter
    for name, value in given.items():
        if name not in properties or name not in answers:
            return False  # unexpected parameter
        if not value_ok(value, answers[name], properties[name]):
            return False
    return all(name in given or OPTIONAL in acceptable for name, acceptable in answers.items())

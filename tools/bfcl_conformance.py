"""Issue 53: the cases gpuval's AST score is held to, with the Berkeley Function Calling Leaderboard's own
verdicts, computed by BFCL's checker in a venv of its own.

    python tools/bfcl_conformance.py                 # writes tests/data/bfcl/conformance.json
    python tools/bfcl_conformance.py --venv DIR      # the venv to make (or reuse) for bfcl-eval

What it does:
1. makes the cases (`cases()`, deterministic): BFCL's function documents (its Python types: string,
   integer, float, boolean, array, tuple, dict, any), a model's output (`[{name: {param: value}}]`) and the
   possible answer (`[{name: {param: [acceptable values...]}}]`, `""` = the parameter may be left out), with
   the category BFCL matches by substring (simple, multiple, parallel) and what each case is about;
2. creates a venv (if DIR has none) and installs `bfcl-eval==BFCL_EVAL` into it with `--no-deps`: its AST
   checker needs only the standard library, but `ast_checker.py` imports `bfcl_eval.constants.model_config`,
   which imports every model handler BFCL has (torch and CUDA among their dependencies). The judge puts a
   stand-in for that one module in `sys.modules` first; the checker reads its mapping only for function
   names with a dot, which no case has;
3. runs `ast_checker(functions, model_output, possible_answer, Language.PYTHON, category, model_name)` on
   every case in that venv and writes cases and verdicts (`valid`, `error_type`) with the bfcl-eval version.

tests/finetune/eval/test_finetune_bfcl.py scores every case with gpuval's `ast_match` and must agree with
BFCL on each, or the case names the eval option that makes the difference. bfcl-eval is Apache-2.0
(https://github.com/ShishirPatil/gorilla/tree/main/berkeley-function-call-leaderboard); none of its code is
in gpuval.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BFCL_EVAL = "2026.3.23"
FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "bfcl" / "conformance.json"

JUDGE = r"""
import json, sys, types
stub = types.ModuleType("bfcl_eval.constants.model_config")
stub.MODEL_CONFIG_MAPPING = {}
sys.modules["bfcl_eval.constants.model_config"] = stub
from importlib.metadata import version
from bfcl_eval.constants.enums import Language
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
cases = json.load(open(sys.argv[1]))
verdicts = []
for case in cases:
    result = ast_checker(case["functions"], case["model_output"], case["possible_answer"], Language.PYTHON,
                         case["category"], "gpuval-conformance")
    verdicts.append({"valid": result["valid"], "error_type": result.get("error_type", "")})
json.dump({"bfcl_eval": version("bfcl-eval"), "verdicts": verdicts}, open(sys.argv[2], "w"))
"""


def fn(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A BFCL function document."""
    return {
        "name": name,
        "description": f"{name} (a conformance case)",
        "parameters": {"type": "dict", "properties": properties, "required": required},
    }


def p(kind: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": kind, **extra}


WEATHER = fn(
    "get_weather",
    {
        "city": p("string"),
        "unit": p("string", enum=["celsius", "fahrenheit"], default="celsius"),
        "days": p("integer", default=1),
    },
    ["city"],
)
LOAN = fn(
    "calculate_loan",
    {
        "principal": p("float"),
        "rate": p("float"),
        "years": p("integer"),
        "monthly": p("boolean", default=True),
    },
    ["principal", "rate", "years"],
)
ROUTE = fn(
    "plan_route",
    {
        "stops": p("array", items={"type": "string"}),
        "avoid": p("array", items={"type": "string"}, default=[]),
        "origin": p("tuple", items={"type": "float"}),
    },
    ["stops"],
)
ORDER = fn(
    "place_order",
    {
        "item": p("dict", properties={"sku": p("string"), "qty": p("integer")}),
        "lines": p("array", items={"type": "dict"}),
        "note": p("any"),
        "gift": p("boolean", default=False),
    },
    ["item"],
)
STATS = fn(
    "summarize",
    {"values": p("array", items={"type": "float"}), "counts": p("array", items={"type": "integer"})},
    ["values"],
)
FUNCTIONS = {f["name"]: f for f in (WEATHER, LOAN, ROUTE, ORDER, STATS)}


def case(
    about: str,
    category: str,
    names: list[str],
    output: list[dict[str, Any]],
    answer: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "about": about,
        "category": category,
        "functions": [FUNCTIONS[n] for n in names],
        "model_output": output,
        "possible_answer": answer,
    }


def call(name: str, **params: Any) -> dict[str, Any]:
    return {name: params}


def simple(about: str, name: str, given: dict[str, Any], answer: dict[str, list[Any]]) -> dict[str, Any]:
    return case(about, "simple", [name], [call(name, **given)], [call(name, **answer)])


def _weather() -> list[dict[str, Any]]:
    a = {"city": ["Dublin", "Dublin, Ireland"], "unit": ["celsius", ""], "days": [1, ""]}
    out = []
    for about, given in [
        ("strings: the same", {"city": "Dublin"}),
        ("strings: case", {"city": "DUBLIN"}),
        ("strings: a second acceptable value", {"city": "dublin, ireland"}),
        ("strings: spaces and commas removed", {"city": "Dublin ,Ireland"}),
        ("strings: punctuation BFCL keeps", {"city": "Dublin!"}),
        ("strings: a colon", {"city": "Dub:lin"}),
        ("strings: single quotes as double", {"city": "Dublin'"}),
        ("strings: accents kept", {"city": "Dúblin"}),
        ("strings: hyphens and underscores removed", {"city": "Dub-lin_"}),
        ("strings: another city", {"city": "Cork"}),
        ("strings: empty", {"city": ""}),
        ("optional: given at its default", {"city": "Dublin", "unit": "celsius"}),
        ("optional: given at another value", {"city": "Dublin", "unit": "fahrenheit"}),
        ("optional: integer at its default", {"city": "Dublin", "days": 1}),
        ("optional: integer at another value", {"city": "Dublin", "days": 3}),
        ("optional: integer as a float", {"city": "Dublin", "days": 1.0}),
        ("optional: integer as a boolean", {"city": "Dublin", "days": True}),
        ("optional: integer as a string", {"city": "Dublin", "days": "1"}),
        ("required: missing", {"unit": "celsius"}),
        ("unexpected parameter", {"city": "Dublin", "country": "IE"}),
        ("types: a number for a string", {"city": 7}),
        ("types: a list for a string", {"city": ["Dublin"]}),
        ("types: null for a string", {"city": None}),
    ]:
        out.append(simple(about, "get_weather", given, a))
    strict = {"city": ["Dublin"]}  # unit and days not in the answer: giving them is unexpected
    out.append(simple("answer without the optional: left out", "get_weather", {"city": "Dublin"}, strict))
    out.append(
        simple("answer without the optional: given", "get_weather", {"city": "Dublin", "days": 1}, strict)
    )
    must = {"city": ["Dublin"], "days": [2]}  # days must be given
    out.append(simple("answer requires an optional: left out", "get_weather", {"city": "Dublin"}, must))
    out.append(
        simple("answer requires an optional: given", "get_weather", {"city": "Dublin", "days": 2}, must)
    )
    out.append(
        simple("answer requires an optional: float", "get_weather", {"city": "Dublin", "days": 2.0}, must)
    )
    var = {"city": ["Dublin"], "days": ["n_days"]}  # a variable's name where an integer is described
    out.append(simple("variable: the name given", "get_weather", {"city": "Dublin", "days": "n_days"}, var))
    out.append(simple("variable: the name's case", "get_weather", {"city": "Dublin", "days": "N_DAYS"}, var))
    out.append(simple("variable: an integer instead", "get_weather", {"city": "Dublin", "days": 2}, var))
    return out


def _loan() -> list[dict[str, Any]]:
    a = {"principal": [250000.0], "rate": [0.035, 3.5], "years": [30], "monthly": [True, ""]}
    base = {"principal": 250000.0, "rate": 0.035, "years": 30}
    out = []
    for about, change in [
        ("floats: the same", {}),
        ("floats: an integer for a float", {"principal": 250000}),
        ("floats: a second acceptable value", {"rate": 3.5}),
        ("floats: close but not equal", {"rate": 0.0350000001}),
        ("floats: a string for a float", {"rate": "0.035"}),
        ("integers: a float for an integer", {"years": 30.0}),
        ("integers: a boolean for an integer", {"years": True}),
        ("integers: a string for an integer", {"years": "30"}),
        ("integers: another value", {"years": 15}),
        ("booleans: at the default", {"monthly": True}),
        ("booleans: another value", {"monthly": False}),
        ("booleans: 1 for true", {"monthly": 1}),
        ("booleans: a string for true", {"monthly": "true"}),
        ("floats: a boolean for a float", {"rate": True}),
        ("floats: a negative zero", {"principal": -0.0}),
    ]:
        out.append(simple(about, "calculate_loan", {**base, **change}, a))
    one = {"principal": [1.0], "rate": [1.0], "years": [1], "monthly": [1, ""]}
    for about, given in [
        (
            "booleans: true against a reference of 1",
            {"principal": 1.0, "rate": 1.0, "years": 1, "monthly": True},
        ),
        ("floats: true against a reference of 1.0", {"principal": True, "rate": 1.0, "years": 1}),
        ("integers: an integer against an integer answer", {"principal": 1, "rate": 1, "years": 1}),
    ]:
        out.append(simple(about, "calculate_loan", given, one))
    return out


def _route() -> list[dict[str, Any]]:
    a = {
        "stops": [["Paris", "Lyon"], ["paris", "lyon", "nice"]],
        "avoid": [[], ""],
        "origin": [[48.8, 2.3], ""],
    }
    out = []
    for about, given in [
        ("arrays: the same", {"stops": ["Paris", "Lyon"]}),
        ("arrays: strings standardised", {"stops": ["PARIS", "ly-on"]}),
        ("arrays: order matters", {"stops": ["Lyon", "Paris"]}),
        ("arrays: a second acceptable list", {"stops": ["Paris", "Lyon", "Nice"]}),
        ("arrays: one item short", {"stops": ["Paris"]}),
        ("arrays: an item of another type", {"stops": ["Paris", 7]}),
        ("arrays: a string for an array", {"stops": "Paris, Lyon"}),
        ("arrays: an empty optional array", {"stops": ["Paris", "Lyon"], "avoid": []}),
        ("arrays: an optional array given items", {"stops": ["Paris", "Lyon"], "avoid": ["tolls"]}),
        ("arrays: an optional array of numbers", {"stops": ["Paris", "Lyon"], "avoid": [1, 2]}),
        ("tuples: as a list", {"stops": ["Paris", "Lyon"], "origin": [48.8, 2.3]}),
        ("tuples: integers for floats", {"stops": ["Paris", "Lyon"], "origin": [48, 2]}),
        ("tuples: strings for floats", {"stops": ["Paris", "Lyon"], "origin": ["48.8", "2.3"]}),
        ("tuples: one item", {"stops": ["Paris", "Lyon"], "origin": [48.8]}),
        ("arrays: nested lists", {"stops": [["Paris"], ["Lyon"]]}),
        ("arrays: an empty required array", {"stops": []}),
    ]:
        out.append(simple(about, "plan_route", given, a))
    must_avoid = {"stops": [["Paris"]], "avoid": [["tolls", "ferries"]]}
    for about, given in [
        ("arrays: a required optional array", {"stops": ["Paris"], "avoid": ["tolls", "ferries"]}),
        ("arrays: its items standardised", {"stops": ["paris"], "avoid": ["TOLLS", "ferries."]}),
        ("arrays: left out", {"stops": ["Paris"]}),
        ("arrays: items of another type", {"stops": ["Paris"], "avoid": [1, 2]}),
    ]:
        out.append(simple(about, "plan_route", given, must_avoid))
    return out


def _order() -> list[dict[str, Any]]:
    a = {
        "item": [{"sku": ["A-1", "a1"], "qty": [2]}],
        "lines": [[{"sku": ["B"], "qty": [1]}, {"sku": ["C"], "qty": [3, ""]}], ""],
        "note": ["leave at door", ""],
        "gift": [False, ""],
    }
    out = []
    for about, given in [
        ("dicts: the same", {"item": {"sku": "A-1", "qty": 2}}),
        ("dicts: a string standardised inside", {"item": {"sku": "a_1", "qty": 2}}),
        ("dicts: a second acceptable value inside", {"item": {"sku": "a1", "qty": 2}}),
        ("dicts: 2.0 for 2 inside", {"item": {"sku": "A-1", "qty": 2.0}}),
        ("dicts: true for 1 inside", {"item": {"sku": "A-1", "qty": True}}),
        ("dicts: a key missing", {"item": {"sku": "A-1"}}),
        ("dicts: an extra key", {"item": {"sku": "A-1", "qty": 2, "color": "red"}}),
        ("dicts: another value inside", {"item": {"sku": "A-1", "qty": 3}}),
        ("dicts: a string for a dict", {"item": "A-1 x2"}),
        ("dicts: an integer as a string inside", {"item": {"sku": "A-1", "qty": "2"}}),
        (
            "lists of dicts: the same",
            {"item": {"sku": "A-1", "qty": 2}, "lines": [{"sku": "B", "qty": 1}, {"sku": "C", "qty": 3}]},
        ),
        (
            "lists of dicts: an optional key left out",
            {"item": {"sku": "A-1", "qty": 2}, "lines": [{"sku": "B", "qty": 1}, {"sku": "C"}]},
        ),
        (
            "lists of dicts: order matters",
            {"item": {"sku": "A-1", "qty": 2}, "lines": [{"sku": "C", "qty": 3}, {"sku": "B", "qty": 1}]},
        ),
        ("lists of dicts: one short", {"item": {"sku": "A-1", "qty": 2}, "lines": [{"sku": "B", "qty": 1}]}),
        (
            "lists of dicts: strings standardised",
            {"item": {"sku": "A-1", "qty": 2}, "lines": [{"sku": "b", "qty": 1}, {"sku": "c.", "qty": 3}]},
        ),
        ("lists of dicts: empty", {"item": {"sku": "A-1", "qty": 2}, "lines": []}),
        ("any: a string", {"item": {"sku": "A-1", "qty": 2}, "note": "Leave at door"}),
        ("any: a number", {"item": {"sku": "A-1", "qty": 2}, "note": 5}),
        ("booleans: false at its default", {"item": {"sku": "A-1", "qty": 2}, "gift": False}),
        ("booleans: 0 for false", {"item": {"sku": "A-1", "qty": 2}, "gift": 0}),
    ]:
        out.append(simple(about, "place_order", given, a))
    nested = {"item": [{"sku": ["A"], "qty": [1], "meta": [{"color": "Red"}]}]}
    for about, given in [
        ("dicts: a nested dict equal", {"item": {"sku": "A", "qty": 1, "meta": {"color": "Red"}}}),
        ("dicts: a nested dict's string case", {"item": {"sku": "A", "qty": 1, "meta": {"color": "red"}}}),
    ]:
        out.append(simple(about, "place_order", given, nested))
    return out


def _stats() -> list[dict[str, Any]]:
    a = {"values": [[1.5, 2.0, 3.25]], "counts": [[1, 2], ""]}
    out = []
    for about, given in [
        ("array items: floats", {"values": [1.5, 2.0, 3.25]}),
        ("array items: an integer for a float", {"values": [1.5, 2, 3.25]}),
        ("array items: a string", {"values": [1.5, "2.0", 3.25]}),
        ("array items: integers, optional", {"values": [1.5, 2.0, 3.25], "counts": [1, 2]}),
        ("array items: floats for integers, optional", {"values": [1.5, 2.0, 3.25], "counts": [1.0, 2.0]}),
        ("array items: booleans for integers, optional", {"values": [1.5, 2.0, 3.25], "counts": [True, 2]}),
    ]:
        out.append(simple(about, "summarize", given, a))
    ints = {"values": [[1, 2]]}  # the answer's items are integers where floats are described
    for about, given in [
        ("array items: integers against integer answers", {"values": [1, 2]}),
        ("array items: floats against integer answers", {"values": [1.0, 2.0]}),
    ]:
        out.append(simple(about, "summarize", given, ints))
    return out


def _categories() -> list[dict[str, Any]]:
    w = {"city": ["Dublin"], "unit": ["celsius", ""], "days": [1, ""]}
    c = {"city": ["Cork"], "unit": ["celsius", ""], "days": [1, ""]}
    loan = {"principal": [1000.0], "rate": [0.05], "years": [2], "monthly": [True, ""]}
    two = ["get_weather", "calculate_loan"]
    out = [
        case(
            "multiple: the right function",
            "multiple",
            two,
            [call("get_weather", city="Dublin")],
            [call("get_weather", **w)],
        ),
        case(
            "multiple: the wrong function",
            "multiple",
            two,
            [call("calculate_loan", principal=1000.0, rate=0.05, years=2)],
            [call("get_weather", **w)],
        ),
        case(
            "multiple: two calls for one",
            "multiple",
            two,
            [call("get_weather", city="Dublin"), call("get_weather", city="Dublin")],
            [call("get_weather", **w)],
        ),
        case("multiple: no call", "multiple", two, [], [call("get_weather", **w)]),
        case(
            "simple: two calls",
            "simple",
            ["get_weather"],
            [call("get_weather", city="Dublin"), call("get_weather", city="Cork")],
            [call("get_weather", **w)],
        ),
        case(
            "simple: an unknown function",
            "simple",
            ["get_weather"],
            [call("get_wether", city="Dublin")],
            [call("get_weather", **w)],
        ),
        case(
            "parallel: in order",
            "parallel",
            ["get_weather"],
            [call("get_weather", city="Dublin"), call("get_weather", city="Cork")],
            [call("get_weather", **w), call("get_weather", **c)],
        ),
        case(
            "parallel: in another order",
            "parallel",
            ["get_weather"],
            [call("get_weather", city="Cork"), call("get_weather", city="Dublin")],
            [call("get_weather", **w), call("get_weather", **c)],
        ),
        case(
            "parallel: one missing",
            "parallel",
            ["get_weather"],
            [call("get_weather", city="Dublin")],
            [call("get_weather", **w), call("get_weather", **c)],
        ),
        case(
            "parallel: one extra",
            "parallel",
            ["get_weather"],
            [
                call("get_weather", city="Dublin"),
                call("get_weather", city="Cork"),
                call("get_weather", city="Cork"),
            ],
            [call("get_weather", **w), call("get_weather", **c)],
        ),
        case(
            "parallel: the same call twice",
            "parallel",
            ["get_weather"],
            [call("get_weather", city="Dublin"), call("get_weather", city="Dublin")],
            [call("get_weather", **w), call("get_weather", **c)],
        ),
        case(
            "parallel: two functions",
            "parallel_multiple",
            two,
            [call("calculate_loan", principal=1000, rate=0.05, years=2), call("get_weather", city="dublin")],
            [call("get_weather", **w), call("calculate_loan", **loan)],
        ),
        case(
            "parallel: two functions, one wrong",
            "parallel_multiple",
            two,
            [call("calculate_loan", principal=1000, rate=0.5, years=2), call("get_weather", city="dublin")],
            [call("get_weather", **w), call("calculate_loan", **loan)],
        ),
        case(
            "parallel: one wrong value",
            "parallel",
            ["get_weather"],
            [call("get_weather", city="Dublin", days=2), call("get_weather", city="Cork")],
            [call("get_weather", **w), call("get_weather", **c)],
        ),
    ]
    # greedy matching: the first answer takes the first output that passes it, even when another would do
    greedy_a = [call("get_weather", city=["Dublin", "Cork"]), call("get_weather", city=["Dublin"])]
    out.append(
        case(
            "parallel: greedy matching in the answer's order",
            "parallel",
            ["get_weather"],
            [call("get_weather", city="Dublin"), call("get_weather", city="Cork")],
            greedy_a,
        )
    )
    out.append(
        case(
            "parallel: greedy matching, the other order",
            "parallel",
            ["get_weather"],
            [call("get_weather", city="Cork"), call("get_weather", city="Dublin")],
            greedy_a,
        )
    )
    return out


def _sampled(count: int, seed: int) -> list[dict[str, Any]]:
    """Cases made by changing one value of a correct call at random (a fixed seed): each draws a function,
    a parameter and a change the hand-written cases above name, to cover their combinations."""
    import random

    rng = random.Random(seed)
    correct = {
        "get_weather": (
            {"city": "Galway", "unit": "fahrenheit", "days": 4},
            {"city": ["Galway"], "unit": ["fahrenheit"], "days": [4]},
        ),
        "calculate_loan": (
            {"principal": 5000.0, "rate": 0.04, "years": 5, "monthly": False},
            {"principal": [5000.0], "rate": [0.04], "years": [5], "monthly": [False]},
        ),
        "plan_route": (
            {"stops": ["Rome", "Milan"], "origin": [41.9, 12.5]},
            {"stops": [["Rome", "Milan"]], "avoid": [[], ""], "origin": [[41.9, 12.5]]},
        ),
        "place_order": (
            {"item": {"sku": "Z-9", "qty": 5}, "gift": True},
            {"item": [{"sku": ["Z-9"], "qty": [5]}], "lines": [""], "note": [""], "gift": [True]},
        ),
        "summarize": ({"values": [0.5, 1.5], "counts": [3, 4]}, {"values": [[0.5, 1.5]], "counts": [[3, 4]]}),
    }

    def change(value: Any) -> tuple[str, Any]:
        options: list[tuple[str, Any]] = [("drop", None), ("as a string", json.dumps(value))]
        if isinstance(value, bool):
            options += [("negated", not value), ("as 1/0", int(value))]
        elif isinstance(value, int):
            options += [("as a float", float(value)), ("plus one", value + 1), ("as a boolean", bool(value))]
        elif isinstance(value, float):
            options += [("as an int", int(value)), ("nudged", value + 1e-9), ("doubled", value * 2)]
        elif isinstance(value, str):
            options += [
                ("upper case", value.upper()),
                ("with a '!'", value + "!"),
                ("spaced", " ".join(value)),
            ]
            options += [("dash to dot", value.replace("-", ".")), ("another word", value + "x")]
        elif isinstance(value, list):
            options += [("reversed", value[::-1]), ("one more item", [*value, value[0]])]
            options += [("as a tuple of strings", [str(v) for v in value])]
        elif isinstance(value, dict):
            options += [
                ("a key dropped", dict(list(value.items())[:1])),
                ("a key added", {**value, "extra": 1}),
            ]
            options += [("values as strings", {k: str(v) for k, v in value.items()})]
        return rng.choice(options)

    out = []
    names = sorted(correct)
    for _ in range(count):
        name = rng.choice(names)
        given, answer = correct[name]
        param = rng.choice(sorted(given))
        what, new = change(given[param])
        args = {k: v for k, v in given.items() if k != param}
        if what != "drop":
            args[param] = new
        out.append(simple(f"sampled: {name}.{param} {what}", name, args, answer))
    return out


def cases() -> list[dict[str, Any]]:
    made = [*_weather(), *_loan(), *_route(), *_order(), *_stats(), *_categories(), *_sampled(60, seed=53)]
    for index, item in enumerate(made):
        item["id"] = f"c{index:03d}"
    return made


def judge(made: list[dict[str, Any]], venv: Path) -> dict[str, Any]:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installed = subprocess.run(
        [str(python), "-m", "pip", "show", "bfcl-eval"], capture_output=True, text=True
    )
    if f"Version: {BFCL_EVAL}" not in installed.stdout:
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--no-deps", f"bfcl-eval=={BFCL_EVAL}"], check=True
        )
    with tempfile.TemporaryDirectory() as folder:
        given, taken = Path(folder) / "cases.json", Path(folder) / "verdicts.json"
        given.write_text(json.dumps(made), encoding="utf-8")
        subprocess.run([str(python), "-c", JUDGE, str(given), str(taken)], check=True)
        return json.loads(taken.read_text(encoding="utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "gpuval-bfcl-venv")
    parser.add_argument("--output", type=Path, default=FIXTURE)
    args = parser.parse_args()
    made = cases()
    judged = judge(made, args.venv)
    for item, verdict in zip(made, judged["verdicts"], strict=True):
        item["bfcl"] = verdict
    document = {
        "about": "gpuval's AST score against BFCL's checker (tools/bfcl_conformance.py makes this file)",
        "bfcl_eval": judged["bfcl_eval"],
        "language": "python",
        "cases": made,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    valid = sum(item["bfcl"]["valid"] for item in made)
    print(f"{len(made)} cases, {valid} valid by bfcl-eval {judged['bfcl_eval']}: {args.output}")


if __name__ == "__main__":
    main()

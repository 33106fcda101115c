"""`finetune prepare` reads the OpenAI / TRL tool format as well as Glaive's: the same conversation prepares
to the same record in either; the format is detected per file or forced by --format; malformed records
are counted by reason alike; a file that gives no conversation with a tool call is a one-line error."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from gpuval.errors import UsageError
from gpuval.finetune.data.prepare import prepare

SPLIT_FILES = ("train.jsonl", "eval.jsonl", "eval_unseen.jsonl")
GLAIVE_PROMPT = "You are a helpful assistant with access to the following functions. Use them if required -"
GLAIVE_NO_TOOLS = "SYSTEM: You are a helpful assistant, with no access to external functions."
WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"],
    },
}
CONVERT = {
    "name": "convert_currency",
    "description": "Convert an amount between currencies",
    "parameters": {
        "type": "object",
        "properties": {"amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
        "required": ["amount", "from", "to"],
    },
}
TIME = {"name": "get_time", "description": "The time now", "parameters": {"type": "object", "properties": {}}}


def _glaive_system(*schemas: dict[str, Any]) -> str:
    return f"SYSTEM: {GLAIVE_PROMPT}\n" + "\n\n".join(json.dumps(s, indent=4) for s in schemas)


def _glaive_chat(*turns: str) -> str:
    return "\n\n\n".join(turns) + "\n\n\n"


def _wrapped(*schemas: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": schema} for schema in schemas]


# The same five conversations, written by hand in each format, and the records both must prepare to.
GLAIVE = [
    {  # two calls in a row, text before the first, an apostrophe inside the arguments
        "system": _glaive_system(WEATHER, CONVERT),
        "chat": _glaive_chat(
            "USER: What's the weather in St. John's, in Fahrenheit?",
            "ASSISTANT: Let me check. <functioncall> "
            '{"name": "get_weather", "arguments": \'{"city": "St. John\'s", "unit": "f"}\'} <|endoftext|>',
            'FUNCTION RESPONSE: {"temperature": 41}',
            "ASSISTANT: It is 41°F in St. John's. <|endoftext|>",
            "USER: And what are 100 USD in EUR?",
            'ASSISTANT: <functioncall> {"name": "convert_currency", '
            '"arguments": \'{"amount": 100, "from": "USD", "to": "EUR"}\'} <|endoftext|>',
            'FUNCTION RESPONSE: {"converted": 92.5}',
            "ASSISTANT: 100 USD are 92.50 EUR. <|endoftext|>",
        ),
    },
    {  # a call without arguments
        "system": _glaive_system(TIME),
        "chat": _glaive_chat(
            "USER: What time is it?",
            'ASSISTANT: <functioncall> {"name": "get_time"} <|endoftext|>',
            'FUNCTION RESPONSE: {"time": "10:00"}',
            "ASSISTANT: It is 10:00. <|endoftext|>",
        ),
    },
    {  # a refusal: tools, no call
        "system": _glaive_system(WEATHER),
        "chat": _glaive_chat(
            "USER: Can you order a pizza?",
            "ASSISTANT: I'm sorry, I can only look up the weather. <|endoftext|>",
        ),
    },
    {  # no tools at all
        "system": GLAIVE_NO_TOOLS,
        "chat": _glaive_chat("USER: Hi", "ASSISTANT: Hello! <|endoftext|>"),
    },
]
SYSTEM = {"role": "system", "content": GLAIVE_PROMPT}
OPENAI = [
    {  # arguments as JSON strings (OpenAI), call ids, tool_call_id and name on the responses
        "messages": [
            SYSTEM,
            {"role": "user", "content": "What's the weather in St. John's, in Fahrenheit?"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city": "St. John\'s", "unit": "f"}',
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "name": "get_weather",
                "content": '{"temperature": 41}',
            },
            {"role": "assistant", "content": "It is 41°F in St. John's."},
            {"role": "user", "content": "And what are 100 USD in EUR?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {
                            "name": "convert_currency",
                            "arguments": '{"amount": 100, "from": "USD", "to": "EUR"}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_2", "content": '{"converted": 92.5}'},
            {"role": "assistant", "content": "100 USD are 92.50 EUR."},
        ],
        "tools": _wrapped(WEATHER, CONVERT),
    },
    {  # arguments as an object (TRL, transformers chat templates), no ids, no system message
        "messages": [
            {"role": "user", "content": "What time is it?"},
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "get_time", "arguments": {}}}],
            },
            {"role": "tool", "name": "get_time", "content": '{"time": "10:00"}'},
            {"role": "assistant", "content": "It is 10:00."},
        ],
        "tools": _wrapped(TIME),
    },
    {
        "messages": [
            SYSTEM,
            {"role": "user", "content": "Can you order a pizza?"},
            {"role": "assistant", "content": "I'm sorry, I can only look up the weather."},
        ],
        "tools": _wrapped(WEATHER),
    },
    {  # no tools key at all
        "messages": [
            {
                "role": "system",
                "content": "You are a helpful assistant, with no access to external functions.",
            },
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
        ]
    },
]
EXPECTED = [
    {
        "tools": [WEATHER, CONVERT],
        "messages": [
            {"role": "user", "content": "What's the weather in St. John's, in Fahrenheit?"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [{"name": "get_weather", "arguments": {"city": "St. John's", "unit": "f"}}],
            },
            {"role": "tool", "content": '{"temperature": 41}'},
            {"role": "assistant", "content": "It is 41°F in St. John's."},
            {"role": "user", "content": "And what are 100 USD in EUR?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"name": "convert_currency", "arguments": {"amount": 100, "from": "USD", "to": "EUR"}}
                ],
            },
            {"role": "tool", "content": '{"converted": 92.5}'},
            {"role": "assistant", "content": "100 USD are 92.50 EUR."},
        ],
    },
    {
        "tools": [TIME],
        "messages": [
            {"role": "user", "content": "What time is it?"},
            {"role": "assistant", "content": "", "tool_calls": [{"name": "get_time", "arguments": {}}]},
            {"role": "tool", "content": '{"time": "10:00"}'},
            {"role": "assistant", "content": "It is 10:00."},
        ],
    },
    {
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": "Can you order a pizza?"},
            {"role": "assistant", "content": "I'm sorry, I can only look up the weather."},
        ],
    },
    {
        "tools": [],
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    },
]


def _write(path: Path, records: list[Any], as_list: bool = False) -> Path:
    if as_list:
        path.write_text(json.dumps(records, indent=2, ensure_ascii=False), encoding="utf-8")
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _prepared(tmp_path: Path, name: str, records: list[Any], **options: Any) -> tuple[list[dict], dict]:
    """Every kept record in input order (fractions 0: all in train.jsonl), and the stats."""
    source = _write(tmp_path / name, records, as_list=name.endswith(".json"))
    stats = prepare(str(source), tmp_path / f"{name}.out", eval_fraction=0, **options)
    return _lines(tmp_path / f"{name}.out" / "train.jsonl"), stats


def test_hand_written_conversations_prepare_to_the_same_records_in_both_formats(tmp_path):
    glaive, glaive_stats = _prepared(tmp_path, "glaive.jsonl", GLAIVE)
    openai, openai_stats = _prepared(tmp_path, "openai.jsonl", OPENAI)
    openai_list, _ = _prepared(tmp_path, "openai.json", OPENAI)  # a JSON list too
    assert glaive == openai == openai_list == EXPECTED
    assert (glaive_stats["format"], openai_stats["format"]) == ("glaive", "openai")
    assert openai_stats["skipped_by_reason"] == {} and openai_stats["kept"] == len(OPENAI)


def test_arguments_as_a_string_or_an_object_prepare_alike(tmp_path):
    """Each call written both ways (and `function` left out, as chat templates allow) gives one record."""
    as_objects = json.loads(json.dumps(OPENAI))
    for message in as_objects[0]["messages"]:
        for call in message.get("tool_calls", ()):
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    bare = json.loads(json.dumps(OPENAI))
    for message in bare[0]["messages"]:
        if message.get("tool_calls"):
            message["tool_calls"] = [call["function"] for call in message["tool_calls"]]
    bare[1]["tools"] = [TIME]  # a bare schema in tools as well
    assert _prepared(tmp_path, "objects.jsonl", as_objects)[0] == EXPECTED
    assert _prepared(tmp_path, "bare.jsonl", bare)[0] == EXPECTED


def test_parallel_calls_text_parts_and_a_tools_string(tmp_path):
    """OpenAI-only shapes: two calls in one message (Glaive cannot say it), content as text parts, the tools
    column as one JSON string, and a tool response stored as an object."""
    record = {
        "messages": [
            {"role": "developer", "content": "Answer briefly."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Weather in Oslo "},
                    {"type": "text", "text": "and Rome?"},
                ],
            },
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    },
                    {
                        "id": "b",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": '{"temperature": 3}'},
            {"role": "tool", "tool_call_id": "b", "content": {"temperature": 18}},
            {"role": "assistant", "content": "3 °C in Oslo, 18 °C in Rome."},
        ],
        "tools": json.dumps(_wrapped(WEATHER)),
    }
    assert _prepared(tmp_path, "parallel.jsonl", [record])[0] == [
        {
            "tools": [WEATHER],
            "messages": [
                {"role": "user", "content": "Weather in Oslo and Rome?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"name": "get_weather", "arguments": {"city": "Oslo"}},
                        {"name": "get_weather", "arguments": {"city": "Rome"}},
                    ],
                },
                {"role": "tool", "content": '{"temperature": 3}'},
                {"role": "tool", "content": '{"temperature": 18}'},
                {"role": "assistant", "content": "3 °C in Oslo, 18 °C in Rome."},
            ],
        }
    ]


def test_a_datasets_name_of_openai_records_with_the_nulls_a_table_adds(tmp_path, monkeypatch):
    """A `datasets` table gives every row every column: null tool_calls, type, tools where a row has none."""
    rows = json.loads(json.dumps(OPENAI))
    for row in rows:
        row.setdefault("tools", None)
        for message in row["messages"]:
            for column in ("content", "tool_calls", "tool_call_id", "name"):
                message.setdefault(column, None)
            for call in message["tool_calls"] or ():
                call.setdefault("id", None)
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda name, split: rows))
    stats = prepare("someone/tool-calls", tmp_path / "out", eval_fraction=0)
    assert _lines(tmp_path / "out" / "train.jsonl") == EXPECTED and stats["format"] == "openai"


def test_format_is_detected_per_file_from_its_first_records(tmp_path):
    """A broken first line or a minority of the other shape does not change what a file is read as."""
    mostly_openai = ["{broken", *OPENAI, GLAIVE[0]]
    mostly_glaive = [OPENAI[0], *GLAIVE]
    source = tmp_path / "mixed.jsonl"
    source.write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r) for r in mostly_openai), encoding="utf-8"
    )
    stats = prepare(str(source), tmp_path / "a", eval_fraction=0)
    assert stats["format"] == "openai" and stats["kept"] == len(OPENAI)
    assert stats["skipped_by_reason"] == {"missing_field": 1, "not_json": 1}
    assert stats["skipped_examples"]["missing_field"] == [f"line {len(mostly_openai)}: messages"]
    _kept, stats = _prepared(tmp_path, "glaive.jsonl", mostly_glaive)
    assert stats["format"] == "glaive" and stats["skipped_examples"] == {"missing_field": ["line 1: system"]}


def test_format_flag_forces_the_reading(tmp_path, gpuval, assert_usage_error):
    _write(tmp_path / "openai.jsonl", OPENAI)
    _write(tmp_path / "glaive.jsonl", GLAIVE)
    args = ["--output", "out", "--format", "openai", "--eval-fraction", "0", "--json"]
    proc = gpuval(["finetune", "prepare", "--input", "openai.jsonl", *args], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["format"] == "openai"
    assert _lines(tmp_path / "out" / "train.jsonl") == EXPECTED
    for wrong, right, source in (("glaive", "openai", "openai.jsonl"), ("openai", "glaive", "glaive.jsonl")):
        proc = gpuval(
            ["finetune", "prepare", "--input", source, "--output", "forced", "--format", wrong], tmp_path
        )
        names = {"glaive": "Glaive format", "openai": "OpenAI tool format"}
        assert_usage_error(
            proc,
            f"--input '{source}': no usable conversation with a tool call in 4 records",
            f"read as {names[wrong]};",
            f"the records look like {names[right]}: pass --format {right}",
        )
        assert not (tmp_path / "forced").exists()


def test_malformed_openai_records_are_skipped_and_counted_by_reason(tmp_path):
    def call(arguments: Any, name: Any = "get_time") -> dict[str, Any]:
        return {
            "messages": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
                },
            ],
            "tools": _wrapped(TIME),
        }

    lines = [
        json.dumps(OPENAI[1]),
        "{not json",
        json.dumps([OPENAI[1]]),  # a list, not a record
        json.dumps({"tools": _wrapped(TIME)}),  # no messages
        json.dumps({"messages": "hi"}),
        json.dumps({**OPENAI[1], "tools": {"get_time": TIME}}),
        json.dumps({**OPENAI[1], "tools": [{"type": "function", "function": {"description": "no name"}}]}),
        json.dumps({**OPENAI[1], "tools": '[{"type": "function", '}),
        json.dumps({"messages": []}),
        json.dumps(
            {"messages": [{"role": "narrator", "content": "x"}, {"role": "assistant", "content": "y"}]}
        ),
        json.dumps({"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "y"}]}),
        json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None}]}),
        json.dumps(call('{"zone": ')),  # arguments that are not JSON
        json.dumps(call('["Paris"]')),  # arguments that are not an object
        json.dumps(call({}, name="")),
        json.dumps(call('{"zone": "\\ud800"}')),  # a lone surrogate inside the arguments string
        json.dumps({"messages": [SYSTEM, {"role": "user", "content": "x"}]}),
        "",
        json.dumps(OPENAI[0]),
    ]
    source = tmp_path / "openai.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    stats = prepare(str(source), tmp_path / "out", eval_fraction=0)
    assert (stats["format"], stats["total"], stats["kept"], stats["skipped"]) == ("openai", 18, 2, 16)
    assert stats["skipped_by_reason"] == {
        "bad_turn": 3,
        "broken_call": 3,
        "empty_chat": 1,
        "missing_field": 2,
        "no_assistant_turn": 1,
        "not_an_object": 1,
        "not_json": 2,
        "tools_unparseable": 3,
    }
    assert stats["skipped_examples"]["broken_call"] == [
        "line 13: message 2: arguments: not JSON (EOF while parsing a value)",
        "line 14: message 2: arguments are a list, not an object",
        "line 15: message 2: a tool call without a function name",
    ]
    assert stats["skipped_examples"]["bad_turn"] == [
        "line 10: message 1 has role 'narrator'",
        "line 11: message 1 (user) has content that is a number, not text",
        "line 12: message 2 (assistant) has no content",
    ]
    assert stats["skipped_examples"]["not_json"][0] == "line 2"
    assert json.loads((tmp_path / "out" / "stats.json").read_text(encoding="utf-8")) == stats
    assert _lines(tmp_path / "out" / "train.jsonl") == [EXPECTED[1], EXPECTED[0]]


# nothing usable: one line, exit 2, no output folder half-written


@pytest.mark.parametrize(
    ("records", "args", "fragments"),
    [
        (
            OPENAI[2:],
            [],
            [
                "no usable conversation with a tool call in 2 records read as OpenAI tool format",
                "2 kept, none calls",
            ],
        ),
        (
            [{"conversations": [{"from": "human", "value": "hi"}], "id": 1}] * 3,
            [],
            [
                "--input 'in.jsonl': 3 records in neither Glaive format",
                "nor OpenAI tool format",
                "the first is an object with keys 'conversations', 'id'",
            ],
        ),
        (
            [{"conversations": []}],
            ["--format", "openai"],
            ["read as OpenAI tool format; the records look like neither format: the first is an object"],
        ),
        (
            [json.loads(json.dumps(OPENAI[1]).replace('"arguments": {}', '"arguments": "{oops"'))] * 2,
            [],
            ["every record was skipped (broken_call 2), e.g. line 1: message 2: arguments: not JSON"],
        ),
        (["just text", 3], [], ["neither Glaive format", "the first is a string"]),
    ],
    ids=["no-calls", "neither-format", "forced-on-neither", "all-malformed", "not-records"],
)
def test_cli_nothing_usable_is_one_line_and_writes_nothing(
    gpuval, assert_usage_error, tmp_path, records, args, fragments
):
    _write(tmp_path / "in.jsonl", records)
    proc = gpuval(["finetune", "prepare", "--input", "in.jsonl", "--output", "new/out", *args], tmp_path)
    assert_usage_error(proc, *fragments)
    assert not (tmp_path / "new").exists()  # the folders prepare made for it are gone again


def test_nothing_usable_keeps_an_earlier_output_as_it_was(tmp_path):
    out = tmp_path / "out"
    prepare(str(_write(tmp_path / "good.jsonl", OPENAI)), out, eval_fraction=0)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(UsageError, match="none calls a function"):
        prepare(str(_write(tmp_path / "no_calls.jsonl", OPENAI[2:])), out, eval_fraction=0)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# many records: Glaive from `finetune synth`, converted to OpenAI format here, prepare identically


_CALL = re.compile(r'\A\{"name": ("(?:[^"\\]|\\.)*")(?:, "arguments": (.*))?\}\Z', re.S)


def _glaive_to_openai(record: dict[str, str], index: int) -> dict[str, Any]:
    """An OpenAI / TRL record of one synthetic Glaive record, parsed here on its own (not by glaive.py).
    Even records give arguments as JSON strings with ids and a system message, odd ones as objects with
    neither. A turn repeated back to back (a Glaive quirk) is written once."""
    prompt, _, schemas = record["system"].removeprefix("SYSTEM: ").partition("\n")
    tools = [json.loads(block) for block in schemas.split("\n\n")] if schemas else []
    turns = [t for t in record["chat"].split("\n\n\n") if t]
    turns = [t for i, t in enumerate(turns) if i == 0 or t != turns[i - 1]]
    messages: list[dict[str, Any]] = [{"role": "system", "content": prompt}] if index % 2 == 0 else []
    call_id = None
    for number, turn in enumerate(turns):
        role, _, text = turn.partition(": ")
        if role == "USER":
            messages.append({"role": "user", "content": text})
        elif role == "FUNCTION RESPONSE":
            messages.append(
                {"role": "tool", "content": text, **({"tool_call_id": call_id} if call_id else {})}
            )
        elif "<functioncall>" not in text:
            messages.append({"role": "assistant", "content": text.removesuffix(" <|endoftext|>")})
        else:
            before, _, call = text.removesuffix(" <|endoftext|>").partition("<functioncall> ")
            name, arguments = _CALL.match(call).groups()
            if arguments is None:
                arguments = {}
            else:
                arguments = json.loads(arguments[1:-1] if arguments.startswith("'") else arguments)
            function = {
                "name": json.loads(name),
                "arguments": json.dumps(arguments) if index % 2 == 0 else arguments,
            }
            call_id = f"call_{index}_{number}" if index % 2 == 0 else None
            entry = {"type": "function", "function": function, **({"id": call_id} if call_id else {})}
            messages.append({"role": "assistant", "content": before.strip() or None, "tool_calls": [entry]})
    return {"messages": messages, "tools": _wrapped(*tools)}


def test_synth_records_converted_to_openai_format_prepare_identically(gpuval, tmp_path):
    proc = gpuval(["finetune", "synth", "--n", "400", "--seed", "7", "--output", "glaive.jsonl"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    glaive = _lines(tmp_path / "glaive.jsonl")
    openai = [_glaive_to_openai(record, index) for index, record in enumerate(glaive)]
    _write(tmp_path / "openai.jsonl", openai)
    _write(tmp_path / "openai.json", openai, as_list=True)
    stats = {}
    for name in ("glaive.jsonl", "openai.jsonl", "openai.json"):
        args = ["--input", name, "--output", f"{name}.out", "--eval-fraction", "0.1", "--seed", "3", "--json"]
        proc = gpuval(["finetune", "prepare", *args], tmp_path)
        assert proc.returncode == 0, proc.stderr
        stats[name] = json.loads(proc.stdout)
    assert [stats[n]["format"] for n in stats] == ["glaive", "openai", "openai"]
    same = ("total", "kept", "skipped", "splits", "excluded_mixed", "unseen_functions")
    assert all({k: s[k] for k in same} == {k: stats["glaive.jsonl"][k] for k in same} for s in stats.values())
    assert stats["glaive.jsonl"]["kept"] == 400 and stats["glaive.jsonl"]["splits"]["eval_unseen"] > 0
    for split in SPLIT_FILES:
        expected = (tmp_path / "glaive.jsonl.out" / split).read_text(encoding="utf-8")
        assert (tmp_path / "openai.jsonl.out" / split).read_text(encoding="utf-8") == expected
        assert (tmp_path / "openai.json.out" / split).read_text(encoding="utf-8") == expected
    calls = [m for r in openai for m in r["messages"] if m.get("tool_calls")]
    assert {type(m["tool_calls"][0]["function"]["arguments"]) for m in calls} == {str, dict}
    assert any(m["content"] for m in calls) and any(m["content"] is None for m in calls)
    # synth's own OpenAI output: the same records once the acceptable answers its calls carry are set aside
    args = ["--n", "400", "--seed", "7", "--format", "openai", "--output", "synth-openai.jsonl"]
    assert gpuval(["finetune", "synth", *args], tmp_path).returncode == 0
    args = ["--input", "synth-openai.jsonl", "--output", "synth.out", "--eval-fraction", "0.1", "--seed", "3"]
    assert gpuval(["finetune", "prepare", *args], tmp_path).returncode == 0
    for split in SPLIT_FILES:
        prepared = _lines(tmp_path / "synth.out" / split)
        made = [c for r in prepared for m in r["messages"] for c in m.get("tool_calls") or []]
        assert made and all(isinstance(c.pop("acceptable"), dict) for c in made)
        assert prepared == _lines(tmp_path / "glaive.jsonl.out" / split)

"""Synthetic records in Glaive function-calling v2's own format, quirks included (docs/glaive-format.md).

A record is `{"system": str, "chat": str}`. Kinds: a function call (one to three functions in the system
prompt, sometimes text before the call, a function response, an answer; sometimes a second call or a
closing thank-you), a refusal (functions present but the request is out of their scope), and a chat with
no functions. Quirks: arguments as a JSON object in single quotes (apostrophes and escaped double quotes
inside), occasionally a raw object instead, a call with no "arguments" key when there are none, and an
occasionally repeated consecutive turn.

`openai_record` writes one in the OpenAI tool format instead, its calls carrying BFCL-style acceptable
answers: the catalogue's other spellings of a value and the optional parameters a call may leave out.

Record `i` of seed `s` depends on (s, i) alone: `--n 10` is a prefix of `--n 1000`. Argument values come
from the pools of `catalogue.py`; `values="train"` / `"holdout"` draw from disjoint parts of every pool.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any, Literal

from gpuval import jsonl
from gpuval.finetune.data.catalogue import CATALOGUE, FunctionSpec, MadeUp, Param, Values, alternatives, draw

SYSTEM_WITH_TOOLS = (
    "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -"
)
SYSTEM_NO_TOOLS = "SYSTEM: You are a helpful assistant, with no access to external functions."
TURN_SEPARATOR = "\n\n\n"
END_OF_TEXT = " <|endoftext|>"

OPTIONAL_PROBABILITY = 0.4  # each optional argument
TEXT_BEFORE_CALL_PROBABILITY = 0.25
RAW_OBJECT_PROBABILITY = 0.06  # arguments as a JSON object instead of a single-quoted string
REPEATED_TURN_PROBABILITY = 0.04
KIND_WEIGHTS = {"call": 0.65, "refusal": 0.15, "no_tools": 0.20}

BEFORE_CALL = (
    "Sure, let me check that for you.",
    "Let me look that up.",
    "I'll take care of that right away.",
    "Of course! Give me a moment.",
    "Sure, I can help with that.",
)
OUT_OF_SCOPE = (
    ("Can you order a pizza for me?", "order food"),
    ("Please book a taxi to the airport for 6 am.", "book a taxi"),
    ("Could you turn off the lights in my living room?", "control devices in your home"),
    ("Can you pay my electricity bill?", "make payments"),
    ("Please call my dentist and move my appointment.", "make phone calls"),
    ("Can you water my plants tomorrow?", "perform physical tasks"),
    ("Could you write my history essay and submit it for me?", "submit work on your behalf"),
)
GENERAL_QUESTIONS = (
    ("What is the capital of Australia?", "The capital of Australia is Canberra."),
    ("Who wrote 'Pride and Prejudice'?", "'Pride and Prejudice' was written by Jane Austen."),
    ("Why is the sky blue?", "Sunlight scatters off air molecules, and blue light scatters the most."),
    ("How many continents are there?", "There are seven continents."),
    ("What's the boiling point of water at sea level?", "Water boils at 100 degrees Celsius at sea level."),
    ("Can you explain what a prime number is?", "A prime number has exactly two divisors: 1 and itself."),
    ("Tell me a fun fact.", "Octopuses have three hearts."),
    ("What does CPU stand for?", "CPU stands for central processing unit."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci painted the Mona Lisa."),
    ("How do I say hello in Spanish?", "You say 'hola'."),
)
NO_TOOLS_DECLINES = (
    ("Can you check the weather in {city} for me?", "city",
     "I'm sorry, but I don't have access to real-time data like the weather in {city}. "
     "A weather service or app can tell you."),
    ("Could you convert {amount} dollars to euros?", "amount",
     "I'm sorry, but I can't access live exchange rates, so I can't convert {amount} dollars for you."),
    ("Please send an email to {email}.", "email",
     "I'm sorry, but I can't send emails. You'll need to write to {email} yourself."),
)  # fmt: skip
THANKS = ("Thank you!", "Thanks, that's helpful.", "Great, thanks a lot!")
WELCOME = (
    "You're welcome! Let me know if you need anything else.",
    "Happy to help!",
    "Anytime! Is there anything else I can do?",
)


def synth_records(n: int, seed: int = 0, values: Values = "all") -> list[dict[str, str]]:
    """`n` Glaive records, deterministic for (seed, values)."""
    return [synth_record(seed, index, values) for index in range(n)]


def synth_record(seed: int, index: int, values: Values = "all") -> dict[str, str]:
    rng = random.Random(f"gpuval-synth:{seed}:{index}")
    kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
    if kind == "no_tools":
        return {"system": SYSTEM_NO_TOOLS, "chat": _join_turns(_no_tools_turns(rng, values))}
    tools = rng.sample(CATALOGUE, rng.randint(1, 3))
    turns = _call_turns(tools, rng, values) if kind == "call" else _refusal_turns(tools, rng)
    return {"system": system_prompt([t.schema() for t in tools]), "chat": _join_turns(turns)}


def system_prompt(schemas: list[dict[str, Any]]) -> str:
    """Glaive's system field: pretty-printed schemas separated by blank lines, not a JSON list."""
    if not schemas:
        return SYSTEM_NO_TOOLS
    return (
        SYSTEM_WITH_TOOLS + "\n" + "\n\n".join(json.dumps(s, indent=4, ensure_ascii=False) for s in schemas)
    )


def format_call(name: str, arguments: dict[str, Any], raw_object: bool = False) -> str:
    """`{"name": ..., "arguments": '{...}'}`: the arguments JSON in single quotes, as Glaive writes it."""
    encoded = json.dumps(arguments, ensure_ascii=False)
    quoted = encoded if raw_object else f"'{encoded}'"
    return f'{{"name": {json.dumps(name)}, "arguments": {quoted}}}'


def _join_turns(turns: list[str]) -> str:
    return TURN_SEPARATOR.join(turns) + TURN_SEPARATOR


def _user(text: str) -> str:
    return f"USER: {text}"


def _assistant(text: str) -> str:
    return f"ASSISTANT: {text}{END_OF_TEXT}"


def _call_turns(tools: list[FunctionSpec], rng: random.Random, values: Values) -> list[str]:
    turns = _one_call(tools[0], rng, values)
    if len(tools) > 1 and rng.random() < 0.2:
        turns += _one_call(tools[1], rng, values)
    if rng.random() < REPEATED_TURN_PROBABILITY:
        turns.append(turns[-1])
    if rng.random() < 0.25:
        turns += [_user(rng.choice(THANKS)), _assistant(rng.choice(WELCOME))]
    return turns


def _one_call(spec: FunctionSpec, rng: random.Random, values: Values) -> list[str]:
    arguments = _arguments(spec, rng, values)
    texts = {p.name: _text(p, arguments[p.name]) for p in spec.params if p.name in arguments}
    request = rng.choice(spec.asks).format(**texts) + "".join(
        p.phrase.format(**texts) for p in spec.params if not p.required and p.name in arguments
    )
    if not arguments and rng.random() < 0.5:
        call = json.dumps({"name": spec.name})  # Glaive's "missing arguments" quirk
    else:
        call = format_call(spec.name, arguments, raw_object=rng.random() < RAW_OBJECT_PROBABILITY)
    before = rng.choice(BEFORE_CALL) + " " if rng.random() < TEXT_BEFORE_CALL_PROBABILITY else ""
    result = spec.result(arguments, rng)
    answer = spec.answer.format(**{**texts, **{k: _plain(v) for k, v in result.items()}})
    return [
        _user(request),
        _assistant(f"{before}<functioncall> {call}"),
        f"FUNCTION RESPONSE: {json.dumps(result, ensure_ascii=False)}",
        _assistant(answer),
    ]


def _arguments(spec: FunctionSpec, rng: random.Random, values: Values) -> dict[str, Any]:
    arguments: dict[str, Any] = {}
    for param in spec.params:
        if not param.required and rng.random() >= OPTIONAL_PROBABILITY:
            continue
        value = _value(param, rng, values)
        for _ in range(10):  # from and to of one call differ: "convert 5 USD to USD" is nonsense
            if param.type == "boolean" or value not in arguments.values():
                break
            value = _value(param, rng, values)
        arguments[param.name] = value
    return arguments


def _value(param: Param, rng: random.Random, values: Values) -> Any:
    if param.type == "boolean":
        return rng.random() < 0.5
    if param.enum:
        return rng.choice(param.enum)
    if param.type == "array":
        return draw(param.pool, rng, values, k=rng.randint(2, 4))
    return draw(param.pool, rng, values)


def _text(param: Param, value: Any) -> str:
    """How a request writes an argument's value."""
    if param.type == "boolean":
        return param.bool_text[int(value)]
    return _plain(value)


def _plain(value: Any) -> str:
    if isinstance(value, list):
        items = [_plain(v) for v in value]
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
    return str(value)


def _refusal_turns(tools: list[FunctionSpec], rng: random.Random) -> list[str]:
    request, action = rng.choice(OUT_OF_SCOPE)
    abilities = "; ".join(t.description[0].lower() + t.description[1:] for t in tools)
    return [
        _user(request),
        _assistant(
            f"I'm sorry, but I can't {action}. My capabilities are limited to the functions I have: "
            f"{abilities}."
        ),
    ]


def _no_tools_turns(rng: random.Random, values: Values) -> list[str]:
    turns: list[str] = []
    for _ in range(2 if rng.random() < 0.3 else 1):
        if rng.random() < 0.3:
            request, pool, reply = rng.choice(NO_TOOLS_DECLINES)
            value = {pool: draw(pool, rng, values)}
            turns += [_user(request.format(**value)), _assistant(reply.format(**value))]
        else:
            question, answer = rng.choice(GENERAL_QUESTIONS)
            turns += [_user(question), _assistant(answer)]
    return turns


def rename_names(
    record: dict[str, str], rng: random.Random, pieces: tuple[str, ...], function_share: float = 0.5
) -> dict[str, str]:
    """`record` with every parameter of its functions, and with `function_share` each function too, given
    a made-up snake_case name from word `pieces`, in the schemas and the calls alike
    (`departure_date` -> `brov_elsik`): a name that can only be read from the schema, as a call to a
    function never seen in training must read it. Tool-free records come back unchanged."""
    from gpuval.finetune.data.glaive import parse_call

    if not record["system"].startswith(SYSTEM_WITH_TOOLS + "\n"):
        return record
    # Pretty-printed schemas, one blank line apart: a string inside one never holds a raw newline.
    schemas = [json.loads(part) for part in record["system"][len(SYSTEM_WITH_TOOLS) + 1 :].split("\n\n")]
    words = [piece.lower() for piece in pieces if piece.isascii() and piece.isalpha()]
    if not words:
        raise ValueError("no ASCII word pieces to make names from")
    taken = {s["name"] for s in schemas} | {p for s in schemas for p in s["parameters"]["properties"]}

    def made_up(n_words: int) -> str:
        for attempt in range(1000):  # a longer name once short ones run out (few pieces)
            name = "_".join(rng.choice(words) for _ in range(n_words + attempt // 100))
            if name not in taken:
                taken.add(name)
                return name
        raise ValueError("too few word pieces to make distinct names from")

    functions: dict[str, str] = {}
    params: dict[str, dict[str, str]] = {}  # per function, under its new name
    for schema in schemas:
        if rng.random() < function_share:
            functions[schema["name"]] = made_up(rng.randint(2, 3))
        new_name = functions.get(schema["name"], schema["name"])
        parameters = schema["parameters"]
        names = params[new_name] = {old: made_up(old.count("_") + 1) for old in parameters["properties"]}
        schema["name"] = new_name
        parameters["properties"] = {names[old]: prop for old, prop in parameters["properties"].items()}
        parameters["required"] = [names[old] for old in parameters["required"]]

    def call(match: re.Match[str]) -> str:
        name, arguments = parse_call(match.group(1))
        name = functions.get(name, name)
        if "arguments" not in match.group(1):  # Glaive's call without arguments stays so
            return f"<functioncall> {json.dumps({'name': name})}{END_OF_TEXT}"
        arguments = {params[name].get(key, key): value for key, value in arguments.items()}
        raw = not re.search(r'"arguments":\s*\'', match.group(1))
        return f"<functioncall> {format_call(name, arguments, raw_object=raw)}{END_OF_TEXT}"

    chat = re.sub(r"<functioncall> (.*?)" + re.escape(END_OF_TEXT), call, record["chat"], flags=re.S)
    return {"system": system_prompt(schemas), "chat": chat}


def openai_record(record: dict[str, str]) -> dict[str, Any]:
    """A synthetic Glaive record in the OpenAI tool format (docs/openai-tool-format.md): the same
    conversation, call ids linking each call to its response, and every call carrying `acceptable`, BFCL's
    possible answers for it (docs/function-calling-eval.md): each argument it gives, with the catalogue's
    other spellings of that value (catalogue.alternatives), and `""` ("may be left out") for each optional
    parameter it does not give."""
    from gpuval.finetune.data.glaive import convert_record

    converted = convert_record(record)
    schemas = {schema["name"]: schema for schema in converted["tools"]}
    messages: list[dict[str, Any]] = []
    ids: list[str] = []  # calls not yet answered, oldest first
    for message in converted["messages"]:
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                ids.append(f"call_{len(messages)}_{len(calls)}")
                calls.append(_openai_call(call, schemas[call["name"]], ids[-1]))
            message = {"role": "assistant", "content": message["content"] or None, "tool_calls": calls}
        elif message["role"] == "tool" and ids:
            message = {**message, "tool_call_id": ids.pop(0)}
        messages.append(message)
    tools = [{"type": "function", "function": schema} for schema in converted["tools"]]
    return {"messages": messages, **({"tools": tools} if tools else {})}


def _openai_call(call: dict[str, Any], schema: dict[str, Any], call_id: str) -> dict[str, Any]:
    parameters = schema.get("parameters") or {}
    required = set(parameters.get("required") or ())
    arguments = call["arguments"]
    acceptable: dict[str, list[Any]] = {}
    for name in parameters.get("properties") or {}:
        if name in arguments:
            acceptable[name] = [arguments[name], *alternatives(arguments[name])]
        elif name not in required:
            acceptable[name] = [""]
    function = {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}
    return {"id": call_id, "type": "function", "function": function, "acceptable": acceptable}


Format = Literal["jsonl", "json", "openai"]


def render_records(records: list[dict[str, str]], fmt: Format) -> str:
    """Glaive records as JSONL or a JSON list, or as OpenAI tool-format JSONL (`openai_record`)."""
    if fmt == "openai":
        return jsonl.dump_lines([openai_record(record) for record in records])
    if fmt == "json":
        return json.dumps(records, indent=2, ensure_ascii=False) + "\n"
    return jsonl.dump_lines(records)


def write_synth(n: int, output: Path, seed: int = 0, fmt: Format = "jsonl", values: Values = "all") -> Path:
    """Synthesise `n` records into `output` (written atomically); bad paths are usage errors."""
    from gpuval.atomic import ensure_writable_dir, write_text_atomic
    from gpuval.errors import UsageError

    if output.is_dir():
        raise UsageError(f"--output '{output}' is a directory; give a file name, e.g. {output}/glaive.jsonl")
    ensure_writable_dir(output.parent)
    return write_text_atomic(output, render_records(synth_records(n, seed, values), fmt))


def word_pieces(tokenizer: Any) -> tuple[str, ...]:
    """The vocabulary's tokens of two letters or more, to make up values from (catalogue.MadeUp)."""
    return tuple(
        piece
        for piece in (tokenizer.decode([i]) for i in range(len(tokenizer)))
        if len(piece) > 1 and piece.isalpha()
    )


def value_part(values: str, tokenizer: str | Path) -> Values:
    """A synth `values` setting as catalogue.draw takes it: "pieces" is the "synthetic" part with half the
    made-up text values built from `tokenizer`'s word pieces, as pretraining with `--pieces` makes them;
    any other setting is itself."""
    if values != "pieces":
        return values  # type: ignore[return-value]
    from gpuval.finetune.model import load_tokenizer

    return MadeUp(word_pieces(load_tokenizer(tokenizer)))

"""One OpenAI / TRL tool-format record → `{"tools": [...], "messages": [...]}` (docs/openai-tool-format.md).

The output has exactly the shape glaive.py gives, so a conversation prepares to the same record whichever
format it came in: `tools` holds the bare function schemas (`{"name", "description", "parameters"}`, the
`{"type": "function", "function": ...}` wrapper removed); messages have roles user, assistant and tool; an
assistant call is `{"role": "assistant", "content": <text or "">, "tool_calls": [{"name", "arguments"}]}`
with `arguments` always a dict, whether the record held a JSON string (OpenAI) or an object (TRL and
transformers chat templates); a tool message is `{"role": "tool", "content": <its text>}`.

Dropped on the way, as the Glaive path drops them: system (and developer) messages, since the prepared
record carries the tools and the model's chat template writes its own system prompt around them (Glaive's
system field is that prompt); call ids, `tool_call_id` and a tool message's `name`, which the Qwen tool
format has no place for (responses follow the calls in order).

A record that cannot be converted raises glaive.MalformedRecord with the reasons Glaive records use, so
stats.json counts both formats alike.
"""

from __future__ import annotations

import json
from typing import Any

from gpuval.finetune.data.glaive import (
    BAD_TURN,
    BROKEN_CALL,
    EMPTY_CHAT,
    MISSING_FIELD,
    NO_ASSISTANT_TURN,
    NOT_AN_OBJECT,
    NOT_JSON,
    TOOLS_UNPARSEABLE,
    MalformedRecord,
)
from gpuval.inputs import decode_json

SYSTEM_ROLES = ("system", "developer")  # developer: the OpenAI API's newer name for system instructions
KEPT_ROLES = ("user", "assistant", "tool")


def convert_record(record: Any) -> dict[str, Any]:
    """`{"messages": [...], "tools": [...]}` (tools optional) → tools and messages."""
    if not isinstance(record, dict):
        raise MalformedRecord(NOT_AN_OBJECT, type(record).__name__)
    messages = record.get("messages")
    if not isinstance(messages, list):
        raise MalformedRecord(MISSING_FIELD, "messages")
    tools = parse_tools(record.get("tools"))
    if not messages:
        raise MalformedRecord(EMPTY_CHAT)
    converted = []
    for number, message in enumerate(messages, start=1):
        kept = _message(message, number)
        if kept is not None:
            converted.append(kept)
    if not any(m["role"] == "assistant" for m in converted):
        raise MalformedRecord(NO_ASSISTANT_TURN)
    return {"tools": tools, "messages": converted}


def parse_tools(tools: Any) -> list[dict[str, Any]]:
    """The bare function schemas of a `tools` field: absent or null is no tools; a JSON string holding the
    list is read too (datasets on the Hub often store the column so, as one schema per row does not fit a
    table); each entry is `{"type": "function", "function": schema}` or the schema itself."""
    if tools is None:
        return []
    if isinstance(tools, str):
        tools = _decode(tools, TOOLS_UNPARSEABLE, "the tools string") if tools.strip() else []
    if not isinstance(tools, list):
        raise MalformedRecord(TOOLS_UNPARSEABLE, f"tools is {json_kind(tools)}, not a list")
    schemas = []
    for entry in tools:
        schema = _function_part(entry)
        if isinstance(entry, dict) and entry.get("type") not in (None, "function"):
            raise MalformedRecord(TOOLS_UNPARSEABLE, f"a {entry['type']!r} tool, not a function")
        if not isinstance(schema, dict) or not isinstance(schema.get("name"), str) or not schema["name"]:
            raise MalformedRecord(TOOLS_UNPARSEABLE, "a function schema without a name")
        schemas.append(schema)
    return schemas


def _message(message: Any, number: int) -> dict[str, Any] | None:
    """One prepared message, or None for a system message."""
    if not isinstance(message, dict):
        raise MalformedRecord(BAD_TURN, f"message {number} is {json_kind(message)}, not an object")
    role = message.get("role")
    if role in SYSTEM_ROLES:
        return None
    if role not in KEPT_ROLES:
        raise MalformedRecord(BAD_TURN, f"message {number} has role {role!r}")
    calls = message.get("tool_calls") if role == "assistant" else None
    if calls is not None and not isinstance(calls, list):
        raise MalformedRecord(BROKEN_CALL, f"message {number}: tool_calls is not a list")
    content = message.get("content")
    if content is None and calls:  # OpenAI: an assistant message that calls may have null content
        content = ""
    text = _text(content, role, number)
    if calls:
        return {"role": role, "content": text, "tool_calls": [parse_call(c, number) for c in calls]}
    return {"role": role, "content": text}


def _text(content: Any, role: str, number: int) -> str:
    """A message's text: a string, or a list of `{"type": "text", "text": ...}` parts joined; a tool
    message may hold a JSON value instead (some datasets store the response object), written as JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        texts = [part.get("text") for part in content]
        if all(isinstance(t, str) for t in texts):
            return "".join(texts)
    if role == "tool" and isinstance(content, dict | list | int | float | bool):
        return json.dumps(content, ensure_ascii=False)
    what = "no content" if content is None else f"content that is {json_kind(content)}, not text"
    raise MalformedRecord(BAD_TURN, f"message {number} ({role}) has {what}")


def parse_call(call: Any, number: int) -> dict[str, Any]:
    """`{"type": "function", "id": ..., "function": {"name", "arguments"}}`, or the bare function part that
    chat templates also accept → `{"name": str, "arguments": dict}`. Arguments may be a JSON string holding
    an object (OpenAI), an object (TRL), or absent, null or "" (no arguments: {}, as Glaive's missing
    ones). A call may carry `acceptable` (gpuval's own key: BFCL's possible answers, `{param: [value,
    ...]}`, docs/function-calling-eval.md): kept for the evaluation, never trained on."""
    where = f"message {number}"
    if not isinstance(call, dict):
        raise MalformedRecord(BROKEN_CALL, f"{where}: a tool call that is {json_kind(call)}")
    if call.get("type") not in (None, "function"):
        raise MalformedRecord(BROKEN_CALL, f"{where}: a {call['type']!r} tool call, not a function")
    function = _function_part(call)
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise MalformedRecord(BROKEN_CALL, f"{where}: a tool call without a function name")
    arguments = function.get("arguments")
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}
    if isinstance(arguments, str):
        arguments = _decode(arguments, BROKEN_CALL, f"{where}: arguments")
    if not isinstance(arguments, dict):
        raise MalformedRecord(BROKEN_CALL, f"{where}: arguments are {json_kind(arguments)}, not an object")
    parsed = {"name": name, "arguments": arguments}
    acceptable = call.get("acceptable")
    if acceptable is not None:  # BFCL's possible answers for the call (eval/bfcl.py), for scoring only
        if not isinstance(acceptable, dict) or not all(isinstance(v, list) for v in acceptable.values()):
            raise MalformedRecord(
                BROKEN_CALL, f"{where}: acceptable is {json_kind(acceptable)}, not an object of lists"
            )
        parsed["acceptable"] = acceptable
    return parsed


def _decode(text: str, reason: str, what: str) -> Any:
    """JSON text inside a record. Broken syntax is `reason`; NaN, a lone surrogate or too deep a nesting is
    not_json, as convert_all counts those anywhere else in a record."""
    try:
        return decode_json(text)
    except json.JSONDecodeError as exc:
        raise MalformedRecord(reason, f"{what}: not JSON ({exc.msg})") from None
    except ValueError as exc:
        raise MalformedRecord(NOT_JSON, f"{what}: {exc}") from None


def json_kind(value: Any) -> str:
    """A decoded JSON value's kind in JSON's words, for messages: "a list", "null", "a number"."""
    if value is None:
        return "null"
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return kinds.get(type(value), "a number")


def _function_part(entry: Any) -> Any:
    """The `function` of a wrapped tool or call, else the entry itself. A null `function` or `type` counts
    as absent: a `datasets` table gives every row every column, null where a row has none."""
    if isinstance(entry, dict) and entry.get("function") is not None:
        return entry["function"]
    return entry

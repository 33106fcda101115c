"""One Glaive function-calling v2 record → `{"tools": [...], "messages": [...]}` (docs/glaive-format.md).

Messages have roles user, assistant and tool. An assistant call becomes
`{"role": "assistant", "content": <text before the call or "">, "tool_calls": [{"name", "arguments"}]}`
with `arguments` always a dict; a FUNCTION RESPONSE becomes `{"role": "tool", "content": <its text>}`.
No Glaive marker is left in any content. Identical consecutive turns (a Glaive quirk) are kept once.
A record that cannot be converted raises `MalformedRecord` with a short reason, counted by the caller.
"""

from __future__ import annotations

import json
import re
from typing import Any

FUNCTION_CALL = "<functioncall>"
END_OF_TEXT = "<|endoftext|>"
MARKERS = (FUNCTION_CALL, END_OF_TEXT)
TOOLS_PREFIX = "Use them if required -"
NO_TOOLS_PHRASE = "no access to external functions"

# reasons a record is skipped: the keys of stats.json's skipped_by_reason
NOT_JSON = "not_json"
NOT_AN_OBJECT = "not_an_object"
MISSING_FIELD = "missing_field"
TOOLS_UNPARSEABLE = "tools_unparseable"
EMPTY_CHAT = "empty_chat"
BAD_TURN = "bad_turn"
BROKEN_CALL = "broken_call"
NO_ASSISTANT_TURN = "no_assistant_turn"

ROLES = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "tool"}
# a turn starts at the beginning of the chat or after a blank line
_TURN = re.compile(r"(?:\A|\n[ \t]*\n)\s*(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?")
_CALL = re.compile(r'\A\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*(?:,\s*"arguments"\s*:\s*(.*?))?\s*\}\Z', re.S)


class MalformedRecord(ValueError):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def convert_record(record: Any) -> dict[str, Any]:
    """A Glaive record (a dict with string fields `system` and `chat`) → tools and messages."""
    if not isinstance(record, dict):
        raise MalformedRecord(NOT_AN_OBJECT, type(record).__name__)
    for field in ("system", "chat"):
        if not isinstance(record.get(field), str):
            raise MalformedRecord(MISSING_FIELD, field)
    return {"tools": parse_tools(record["system"]), "messages": parse_chat(record["chat"])}


def parse_tools(system: str) -> list[dict[str, Any]]:
    """The function schemas of a system field: JSON objects one after another, separated by whitespace."""
    if NO_TOOLS_PHRASE in system and TOOLS_PREFIX not in system:
        return []
    _, found, rest = system.partition(TOOLS_PREFIX)
    if not found:
        raise MalformedRecord(TOOLS_UNPARSEABLE, "neither a function list nor the no-functions prompt")
    decoder = json.JSONDecoder()
    tools: list[dict[str, Any]] = []
    position = 0
    while True:
        while position < len(rest) and rest[position].isspace():
            position += 1
        if position == len(rest):
            break
        try:
            schema, position = decoder.raw_decode(rest, position)
        except json.JSONDecodeError as exc:
            raise MalformedRecord(TOOLS_UNPARSEABLE, exc.msg) from None
        if not isinstance(schema, dict) or not isinstance(schema.get("name"), str):
            raise MalformedRecord(TOOLS_UNPARSEABLE, "a function schema without a name")
        tools.append(schema)
    if not tools:
        raise MalformedRecord(TOOLS_UNPARSEABLE, "no function schema after the prompt")
    return tools


def parse_chat(chat: str) -> list[dict[str, Any]]:
    if not chat.strip():
        raise MalformedRecord(EMPTY_CHAT)
    pieces = _TURN.split(chat)
    if pieces[0].strip():
        raise MalformedRecord(BAD_TURN, "text before the first USER/ASSISTANT/FUNCTION RESPONSE turn")
    messages: list[dict[str, Any]] = []
    for marker, text in zip(pieces[1::2], pieces[2::2], strict=True):
        message = _message(ROLES[marker], text)
        if messages and messages[-1] == message:
            continue
        messages.append(message)
    if not any(m["role"] == "assistant" for m in messages):
        raise MalformedRecord(NO_ASSISTANT_TURN)
    return messages


def _message(role: str, text: str) -> dict[str, Any]:
    text = text.strip()
    if text.endswith(END_OF_TEXT):
        text = text[: -len(END_OF_TEXT)].rstrip()
    if role == "assistant" and FUNCTION_CALL in text:
        before, _, call = text.partition(FUNCTION_CALL)
        name, arguments = parse_call(call)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": before.strip(),
            "tool_calls": [{"name": name, "arguments": arguments}],
        }
    else:
        message = {"role": role, "content": text}
    if any(marker in message["content"] for marker in MARKERS):
        raise MalformedRecord(BAD_TURN, f"a Glaive marker inside a {role} turn")
    return message


def parse_call(text: str) -> tuple[str, dict[str, Any]]:
    """`{"name": "f", "arguments": '{"k": "v"}'}` → ("f", {"k": "v"}).

    Arguments may be single-quoted JSON (apostrophes inside are fine: only the outer quotes are removed;
    `\\'` escapes are undone), a raw JSON object, a JSON string holding an object, or absent ({}).
    """
    text = text.strip()
    try:  # a raw object or a JSON-string arguments field: the whole call is JSON
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict) and isinstance(whole.get("name"), str) and whole["name"]:
        arguments = whole.get("arguments", {})
        return whole["name"], _object(_loads(arguments) if isinstance(arguments, str) else arguments)
    match = _CALL.match(text)
    if match is None:
        raise MalformedRecord(BROKEN_CALL, 'not a {"name": ..., "arguments": ...} object')
    name = json.loads(match.group(1))
    raw = (match.group(2) or "").strip()
    if not name:
        raise MalformedRecord(BROKEN_CALL, "empty function name")
    if not raw:
        return name, {}
    if not (len(raw) >= 2 and raw[0] == raw[-1] == "'"):
        raise MalformedRecord(BROKEN_CALL, "arguments are neither JSON nor single-quoted JSON")
    return name, _object(_loads(raw[1:-1]))


def _object(arguments: Any) -> dict[str, Any]:
    if not isinstance(arguments, dict):
        raise MalformedRecord(BROKEN_CALL, f"arguments are a {type(arguments).__name__}, not an object")
    return arguments


def _loads(text: str) -> Any:
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return json.loads(text.replace("\\'", "'"))  # \' is not a JSON escape
    except json.JSONDecodeError as exc:
        raise MalformedRecord(BROKEN_CALL, f"arguments are not JSON ({exc.msg})") from None

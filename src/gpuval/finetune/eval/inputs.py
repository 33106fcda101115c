"""What `finetune eval` reads, checked before a model loads: the records of an eval split, and whether each
prompt fits the model's context.

A record is what `finetune prepare` writes (data.py): `{"tools": [schema, ...], "messages": [...]}`, each
message `{"role", "content"}` and an assistant call `{"tool_calls": [{"name", "arguments": {...}}]}`. The
chat template and the scorer read those fields as such: a line of another shape (a JSON array, tools as
strings, tool_calls as an object) is refused naming its line, rather than skipped or met as a TypeError
midway through generation.

A prompt longer than the model's context (less eval.max_new_tokens) cannot be generated from: attention
over a million tokens takes gigabytes and minutes inside one C++ call that no signal interrupts. Such a
record is left out of the scores, and the command says so in one line per split.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuval.errors import UsageError, first_line
from gpuval.finetune.data.openai_format import json_kind
from gpuval.finetune.eval.scoring import split_target
from gpuval.finetune.template import render_prompt

ROLES = ("system", "user", "assistant", "tool")
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 30 else text[:27] + "..."


def _tool_problem(number: int, tool: Any) -> str | None:
    body = tool.get("function") if isinstance(tool, dict) and isinstance(tool.get("function"), dict) else tool
    if not isinstance(body, dict):
        return f"tool {number} is {json_kind(tool)}, not a function schema (an object)"
    if not isinstance(body.get("name"), str):
        return f"tool {number} has no string 'name', as a function schema does"
    return None


def _calls_problem(number: int, calls: Any) -> str | None:
    if not isinstance(calls, list):
        return f"message {number}'s tool_calls is {json_kind(calls)}, not a list of calls"
    for index, call in enumerate(calls, start=1):
        if not (
            isinstance(call, dict)
            and isinstance(call.get("name"), str)
            and isinstance(call.get("arguments"), dict)
        ):
            return (
                f"message {number}'s call {index} is {_shown(call)}, not "
                '{"name": "...", "arguments": {...}}'
            )
    return None


def _message_problem(number: int, message: Any) -> str | None:
    if not isinstance(message, dict):
        return f"message {number} is {json_kind(message)}, not an object"
    role = message.get("role")
    if role not in ROLES:
        return f"message {number} has role {_shown(role)}, not one of {', '.join(ROLES)}"
    calls = message.get("tool_calls")
    if calls is not None:
        problem = _calls_problem(number, calls)
        if problem:
            return problem
    content = message.get("content")
    if not isinstance(content, str) and not (content is None and calls):  # a call may come without text
        return f"message {number} ({role}) has {json_kind(content)} as content, not text"
    return None


def record_problem(record: Any) -> str | None:
    """Why a decoded line is not a prepared record the template and the scorer can read, or None."""
    if not isinstance(record, dict):
        return f'is {json_kind(record)}, not a {{"tools", "messages"}} object'
    tools = record.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return f"'tools' is {json_kind(tools)}, not a list of function schemas"
        problem = _first_problem(tools, _tool_problem)
        if problem:
            return problem
    messages = record.get("messages")
    if not isinstance(messages, list):
        return f"'messages' is {json_kind(messages)}, not a list of messages"
    return _first_problem(messages, _message_problem)


def _first_problem(items: list[Any], problem: Callable[[int, Any], str | None]) -> str | None:
    """The first of `items`' problems (each numbered from 1), or None."""
    return next((said for number, item in enumerate(items, start=1) if (said := problem(number, item))), None)


def has_target(record: dict[str, Any]) -> bool:
    """Whether a checked record has an assistant turn to predict (scoring.split_target)."""
    return any(message["role"] == "assistant" for message in record["messages"])


def read_eval_split(
    path: str | Path, limit: int | None, fits: Callable[[dict[str, Any]], bool] | None = None
) -> tuple[list[dict[str, Any]], list[int]]:
    """The first `limit` records of a prepared JSONL split that have an assistant turn to predict and whose
    prompt `fits`, and the line numbers of those left out for not fitting. Every line is checked, also
    past the limit: a broken file is refused whatever the limit."""
    from gpuval.finetune.data.prepare import read_jsonl

    records: list[dict[str, Any]] = []
    too_long: list[int] = []
    for line, record in read_jsonl(path, "eval split"):
        problem = record_problem(record)
        if problem:
            raise UsageError(
                f"eval split '{path}' line {line}: {problem}; write the split with `finetune prepare`"
            )
        if (limit is not None and len(records) >= limit) or not has_target(record):
            continue
        if fits is not None and not fits(record):
            too_long.append(line)
            continue
        records.append(record)
    return records, too_long


def model_context(model: str) -> int | None:
    """The model's context in tokens as its config.json states it, or None where it states none."""
    from transformers import AutoConfig

    from gpuval.finetune.model import resolve_model

    try:
        config = AutoConfig.from_pretrained(resolve_model(model))
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"model '{model}': its config.json cannot be read ({first_line(exc)})") from None
    for field in CONTEXT_FIELDS:
        value = getattr(config, field, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class PromptFit:
    """Whether a record's prompt leaves `max_new_tokens` of the model's `context` (None: no bound)."""

    def __init__(self, tokenizer: Any, context: int | None, max_new_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.limit = None if context is None else context - max_new_tokens
        if self.limit is not None and self.limit < 1:
            raise UsageError(
                f"eval.max_new_tokens {max_new_tokens} leaves no room for a prompt in the model's context "
                f"of {context} tokens; lower it"
            )
        # A token stands for at most as many characters as its longest vocabulary entry (byte-level BPE
        # spells one byte per character): a text longer than that many per allowed token is too long
        # without tokenizing it, which for megabytes would take seconds and hundreds of megabytes.
        self.chars_per_token = max((len(token) for token in tokenizer.get_vocab()), default=1)

    def __call__(self, record: dict[str, Any]) -> bool:
        if self.limit is None:
            return True
        text = render_prompt(split_target(record)[0], self.tokenizer)
        if len(text) > self.limit * self.chars_per_token:
            return False
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) <= self.limit

    def note(self, split: str, lines: list[int]) -> str:
        """One line saying which records of `split` were left out."""
        shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
        records = "1 record" if len(lines) == 1 else f"{len(lines)} records"
        return (
            f"eval {split}: left out {records} whose prompt is longer than the model's context less "
            f"eval.max_new_tokens ({self.limit} tokens): line {shown}"
        )

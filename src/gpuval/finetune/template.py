"""Prepared conversations → Qwen2.5 tool-format text → token ids and labels; `<tool_call>` parsing.

A prepared conversation is `{"tools": [schema, ...], "messages": [...]}` (data.py). It is rendered by the
tokenizer's own chat template when that template knows about tools (Qwen2.5's does), and otherwise by
`QWEN25_TOOL_TEMPLATE` below — Qwen2-7B-Instruct's own template silently drops `tools` (docs/qwen2-7b.md). The
bundled tiny tokenizer ships the same template, so one code path serves both.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy's default ignore_index
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tools>", "</tools>", "<tool_response>", "</tool_response>")
ASSISTANT_HEADER = f"{IM_START}assistant\n"

# Qwen2.5-Instruct's chat template (tokenizer_config.json of Qwen/Qwen2.5-7B-Instruct), verbatim.
QWEN25_TOOL_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments \
within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": \
<args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\
<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or \
(message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def chat_template_for(tokenizer: Any) -> str:
    """The tokenizer's own chat template when it renders tools, else Qwen2.5's tool template."""
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, str) and "tools" in own:
        return own
    return QWEN25_TOOL_TEMPLATE


def qwen_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Glaive schemas → the OpenAI-style entries Qwen2.5 was trained on: `{"type": "function", ...}`."""
    return [{"type": "function", "function": schema} for schema in tools]


def render(example: dict[str, Any], tokenizer: Any, add_generation_prompt: bool = False) -> str:
    """One prepared conversation as text; arguments stay dicts so the template writes them once as JSON."""
    tools = qwen_tools(example.get("tools") or [])
    return tokenizer.apply_chat_template(
        example["messages"],
        tools=tools or None,
        chat_template=chat_template_for(tokenizer),
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )


def render_prompt(example: dict[str, Any], tokenizer: Any) -> str:
    """The text a model continues at evaluation: the conversation plus `<|im_start|>assistant\\n`."""
    return render(example, tokenizer, add_generation_prompt=True)


def assistant_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of assistant replies: after `<|im_start|>assistant\\n`, through `<|im_end|>`."""
    spans = []
    position = text.find(ASSISTANT_HEADER)
    while position != -1:
        start = position + len(ASSISTANT_HEADER)
        end = text.find(IM_END, start)
        end = len(text) if end == -1 else end + len(IM_END)
        spans.append((start, end))
        position = text.find(ASSISTANT_HEADER, end)
    return spans


@dataclass(frozen=True)
class Encoded:
    input_ids: list[int]
    labels: list[int]  # IGNORE_INDEX except on assistant tokens (incl. their <|im_end|>)
    truncated: bool  # the conversation was longer than max_len and was cut

    @property
    def label_count(self) -> int:
        return sum(label != IGNORE_INDEX for label in self.labels)


def label_spans(tokenizer: Any, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Token ids of `text` (tokenized whole, as at inference) and labels: a token is labelled when it starts
    inside one of the character `spans`, else IGNORE_INDEX."""
    batch = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    input_ids = list(batch["input_ids"])
    labels = []
    for token_id, (start, _end) in zip(input_ids, batch["offset_mapping"], strict=True):
        inside = any(span_start <= start < span_end for span_start, span_end in spans)
        labels.append(token_id if inside else IGNORE_INDEX)
    return input_ids, labels


def encode(example: dict[str, Any], tokenizer: Any, max_len: int) -> Encoded:
    """Token ids and labels of one conversation.

    The whole rendered text is tokenized at once (as at inference); a token is labelled when it starts
    inside an assistant span, which special tokens at both ends of each span make exact. The header
    `<|im_start|>assistant\\n` and everything outside assistant turns get IGNORE_INDEX.

    Truncation cuts: a conversation longer than `max_len` tokens keeps its first `max_len` tokens and is
    marked `truncated`; one whose cut leaves no labelled token (`label_count == 0`) teaches nothing, and
    the caller should drop it.
    """
    text = render(example, tokenizer)
    input_ids, labels = label_spans(tokenizer, text, assistant_spans(text))
    truncated = len(input_ids) > max_len
    return Encoded(input_ids[:max_len], labels[:max_len], truncated)


_TOOL_CALL_BLOCK = re.compile(
    re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|\Z)", re.S
)


@dataclass(frozen=True)
class ParsedCalls:
    calls: list[dict[str, Any]]  # {"name": str, "arguments": dict}, in order of appearance
    json_valid: bool  # every <tool_call> block held a JSON object with a string name and dict arguments
    block_count: int  # <tool_call> blocks found, valid or not


def parse_tool_calls(text: str) -> ParsedCalls:
    """The `<tool_call>` JSON blocks of generated text; junk around or between them is ignored.

    An unclosed last block (generation stopped early) is still read to the end of the text. A block that
    is not a JSON object with a string `name` is not a call and makes `json_valid` false. Arguments given as
    a JSON string holding an object (double-encoded) are decoded, since a scorer compares values. Text with
    no block gives no calls and `json_valid` true: there was nothing to be invalid.
    """
    calls: list[dict[str, Any]] = []
    valid = True
    blocks = _TOOL_CALL_BLOCK.findall(text)
    for block in blocks:
        call = _parse_call(block.strip())
        if call is None:
            valid = False
        else:
            calls.append(call)
    return ParsedCalls(calls, valid, len(blocks))


def _parse_call(block: str) -> dict[str, Any] | None:
    try:
        value = json.loads(block)
    except (json.JSONDecodeError, RecursionError):  # generated text nested past the parser's reach
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return {"name": value["name"], "arguments": arguments}

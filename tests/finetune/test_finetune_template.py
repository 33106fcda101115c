"""template.py with the bundled tiny tokenizer: Qwen2.5 tool-format text, labels, <tool_call> parsing."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("transformers")

from tiny_model import SPECIAL_TOKENS  # noqa: E402  (tools/, on pytest's pythonpath)

from gpuval.finetune.model import TINY_MODEL_DIR  # noqa: E402
from gpuval.finetune.template import (  # noqa: E402
    IGNORE_INDEX,
    QWEN25_TOOL_TEMPLATE,
    TOOL_TAGS,
    encode,
    parse_tool_calls,
    render,
    render_prompt,
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
EXAMPLE = {
    "tools": [WEATHER],
    "messages": [
        {"role": "user", "content": "Weather in Zürich for 2 days?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [{"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}],
        },
        {"role": "tool", "content": '{"temperature_c": 3}'},
        {"role": "assistant", "content": "It is 3 °C in Zürich."},
    ],
}
CALL_REPLY = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}\n'
    "</tool_call><|im_end|>"
)
ANSWER_REPLY = "It is 3 °C in Zürich.<|im_end|>"
EXPECTED = (
    "<|im_start|>system\n"
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n"
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": '
    '"integer"}}, "required": ["city"]}}}\n'
    "</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\nWeather in Zürich for 2 days?<|im_end|>\n"
    "<|im_start|>assistant\n" + CALL_REPLY + "\n"
    "<|im_start|>user\n<tool_response>\n"
    '{"temperature_c": 3}\n'
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n" + ANSWER_REPLY + "\n"
)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR))


def _labelled_runs(encoded, tokenizer) -> list[str]:
    """The decoded text of each contiguous run of labelled tokens."""
    runs: list[list[int]] = []
    previous = IGNORE_INDEX
    for token_id, label in zip(encoded.input_ids, encoded.labels, strict=True):
        if label != IGNORE_INDEX:
            assert label == token_id
            if previous == IGNORE_INDEX:
                runs.append([])
            runs[-1].append(token_id)
        previous = label
    return [tokenizer.decode(run) for run in runs]


def test_render_is_the_qwen25_tool_format_exactly(tokenizer):
    assert render(EXAMPLE, tokenizer) == EXPECTED
    assert render_prompt(EXAMPLE, tokenizer) == EXPECTED + "<|im_start|>assistant\n"


def test_a_tokenizer_whose_template_ignores_tools_gets_the_qwen25_template(tokenizer):
    # Qwen2-7B-Instruct's own template is plain ChatML: it would silently drop the tools.
    plain = tokenizer.chat_template
    tokenizer.chat_template = (
        "{% for message in messages %}{{ '<|im_start|>' + message.role + '\\n' + message.content"
        " + '<|im_end|>\\n' }}{% endfor %}"
    )
    try:
        assert render(EXAMPLE, tokenizer) == EXPECTED
    finally:
        tokenizer.chat_template = plain
    assert plain == QWEN25_TOOL_TEMPLATE


def test_rendered_arguments_are_a_json_object_not_a_string(tokenizer):
    blocks = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", render(EXAMPLE, tokenizer), re.S)
    call = json.loads(blocks[-1])  # the first block is the instruction's own placeholder
    assert call == {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}


def test_labels_cover_exactly_the_assistant_replies_with_their_im_end(tokenizer):
    encoded = encode(EXAMPLE, tokenizer, max_len=4096)
    assert not encoded.truncated and len(encoded.input_ids) == len(encoded.labels)
    assert tokenizer.decode(encoded.input_ids) == EXPECTED
    assert _labelled_runs(encoded, tokenizer) == [CALL_REPLY, ANSWER_REPLY]


def test_truncation_cuts_to_max_len(tokenizer):
    full = encode(EXAMPLE, tokenizer, max_len=4096)
    cut = encode(EXAMPLE, tokenizer, max_len=20)
    assert cut.truncated and cut.input_ids == full.input_ids[:20] and cut.labels == full.labels[:20]
    assert cut.label_count == 0  # the system turn alone: nothing to learn, the caller drops it


def test_special_tokens_are_single_ids(tokenizer):
    ids = [tokenizer.encode(token, add_special_tokens=False) for token in (*SPECIAL_TOKENS, *TOOL_TAGS)]
    assert all(len(single) == 1 for single in ids)
    assert len({single[0] for single in ids}) == len(ids)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_tiny_tokenizer_round_trips_text_like_its_tokenizer_json(tokenizer):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(TINY_MODEL_DIR / "tokenizer.json"))
    text = "Convert 1234.5 EUR to JPY, s'il vous plaît — naïve café\n\n\t<tool_call>{}</tool_call> 🙂"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == raw.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == text
    assert 2000 <= len(tokenizer) <= 4000


def test_parse_tool_calls_reads_good_blocks_among_junk():
    text = (
        'Sure!<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call> junk '
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": [1, 2]}"}</tool_call><|im_end|>'
    )
    parsed = parse_tool_calls(text)
    assert parsed.calls == [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": [1, 2]}}]
    assert parsed.json_valid and parsed.block_count == 2


@pytest.mark.parametrize(
    "block",
    [
        '{"name": "a", "arguments": {"x": 1}',  # cut JSON
        "{'name': 'a', 'arguments': {}}",  # not JSON
        '{"arguments": {"x": 1}}',  # no name
        '{"name": "a", "arguments": [1]}',  # arguments not an object
        '["a"]',
    ],
)
def test_parse_tool_calls_flags_a_bad_block_and_keeps_the_good_ones(block):
    good = '<tool_call>\n{"name": "ok", "arguments": {}}\n</tool_call>'
    parsed = parse_tool_calls(f"{good}\n<tool_call>\n{block}\n</tool_call>")
    assert parsed.calls == [{"name": "ok", "arguments": {}}]
    assert not parsed.json_valid and parsed.block_count == 2


def test_parse_tool_calls_reads_an_unclosed_last_block_and_nothing_from_plain_text():
    parsed = parse_tool_calls('<tool_call>\n{"name": "a", "arguments": {"q": "x"}}\n')
    assert parsed.calls == [{"name": "a", "arguments": {"q": "x"}}] and parsed.json_valid
    none = parse_tool_calls("I'm sorry, I can't order a pizza.<|im_end|>")
    assert none.calls == [] and none.json_valid and none.block_count == 0

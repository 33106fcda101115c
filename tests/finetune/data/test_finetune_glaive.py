"""glaive.py: hand-written Glaive v2 records, one per quirk, each converted to the exact expected messages."""

from __future__ import annotations

import json

import pytest

from gpuval.finetune.data.glaive import MalformedRecord, convert_record, parse_call

WEATHER_SCHEMA = """{
    "name": "get_current_weather",
    "description": "Get the current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {
                "type": "string",
                "description": "The city name"
            }
        },
        "required": [
            "city"
        ]
    }
}"""
EMAIL_SCHEMA = """{
    "name": "send_email",
    "description": "Send an email",
    "parameters": {
        "type": "object",
        "properties": {
            "recipient": {"type": "string"},
            "body": {"type": "string"}
        },
        "required": ["recipient", "body"]
    }
}"""
WEATHER_TOOL = {
    "name": "get_current_weather",
    "description": "Get the current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name"}},
        "required": ["city"],
    },
}
EMAIL_TOOL = {
    "name": "send_email",
    "description": "Send an email",
    "parameters": {
        "type": "object",
        "properties": {"recipient": {"type": "string"}, "body": {"type": "string"}},
        "required": ["recipient", "body"],
    },
}
TOOLS_PROMPT = (
    "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -"
)
SYSTEM_WEATHER = f"{TOOLS_PROMPT}\n{WEATHER_SCHEMA}"
SYSTEM_BOTH = f"{TOOLS_PROMPT}\n{WEATHER_SCHEMA}\n\n{EMAIL_SCHEMA}\n"
SYSTEM_NONE = "SYSTEM: You are a helpful assistant, with no access to external functions."


def test_call_with_function_response_and_answer():
    chat = (
        "USER: What's the weather in Paris?\n\n\n"
        'ASSISTANT: <functioncall> {"name": "get_current_weather", "arguments": \'{"city": "Paris"}\'} '
        "<|endoftext|>\n\n\n"
        'FUNCTION RESPONSE: {"temperature": 21, "condition": "sunny"}\n\n\n'
        "ASSISTANT: It's 21 degrees and sunny in Paris. <|endoftext|>\n\n\n"
    )
    assert convert_record({"system": SYSTEM_WEATHER, "chat": chat}) == {
        "tools": [WEATHER_TOOL],
        "messages": [
            {"role": "user", "content": "What's the weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"name": "get_current_weather", "arguments": {"city": "Paris"}}],
            },
            {"role": "tool", "content": '{"temperature": 21, "condition": "sunny"}'},
            {"role": "assistant", "content": "It's 21 degrees and sunny in Paris."},
        ],
    }


def test_several_schemas_separated_by_blank_lines():
    chat = "USER: Hi\n\n\nASSISTANT: Hello! How can I help? <|endoftext|>"
    assert convert_record({"system": SYSTEM_BOTH, "chat": chat})["tools"] == [WEATHER_TOOL, EMAIL_TOOL]


def test_text_before_the_call_and_apostrophes_inside_the_arguments():
    chat = (
        "USER: Weather in Xi'an, please.\n\n"
        "ASSISTANT: Sure, let me check that for you. <functioncall> "
        '{"name": "get_current_weather", "arguments": \'{"city": "Xi\'an"}\'} <|endoftext|>'
    )
    assert convert_record({"system": SYSTEM_WEATHER, "chat": chat})["messages"] == [
        {"role": "user", "content": "Weather in Xi'an, please."},
        {
            "role": "assistant",
            "content": "Sure, let me check that for you.",
            "tool_calls": [{"name": "get_current_weather", "arguments": {"city": "Xi'an"}}],
        },
    ]


def test_raw_object_arguments():
    chat = (
        "USER: Email bob@example.com: I'll be late.\n\n\n"
        'ASSISTANT: <functioncall> {"name": "send_email", "arguments": '
        '{"recipient": "bob@example.com", "body": "I\'ll be late."}} <|endoftext|>'
    )
    assert convert_record({"system": SYSTEM_BOTH, "chat": chat})["messages"][1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"name": "send_email", "arguments": {"recipient": "bob@example.com", "body": "I'll be late."}}
        ],
    }


@pytest.mark.parametrize(
    ("call", "arguments"),
    [
        # escaped double quotes inside the single-quoted JSON
        ('{"name": "send_email", "arguments": \'{"body": "He said \\"hi\\""}\'}', {"body": 'He said "hi"'}),
        # \' is not a JSON escape; Glaive writes it now and then
        ('{"name": "send_email", "arguments": \'{"body": "Don\\\'t"}\'}', {"body": "Don't"}),
        # arguments as a JSON string holding an object
        ('{"name": "send_email", "arguments": "{\\"body\\": \\"ok\\"}"}', {"body": "ok"}),
        # no arguments key, and empty single-quoted arguments
        ('{"name": "get_random_quote"}', {}),
        ('{"name": "get_random_quote", "arguments": \'{}\'}', {}),
        ('{"name": "get_random_quote", "arguments": \'\'}', {}),
        # nested values survive as they are
        (
            '{"name": "f", "arguments": \'{"n": [1, 2.5], "flag": true, "o": {"k": null}}\'}',
            {"n": [1, 2.5], "flag": True, "o": {"k": None}},
        ),
    ],
)
def test_arguments_end_up_a_dict(call, arguments):
    assert parse_call(call)[1] == arguments


def test_refusal_with_tools_present():
    chat = (
        "USER: Can you order a pizza for me?\n\n\n"
        "ASSISTANT: I'm sorry, but I can't order food. I can only check the weather. <|endoftext|>\n\n\n"
    )
    assert convert_record({"system": SYSTEM_WEATHER, "chat": chat}) == {
        "tools": [WEATHER_TOOL],
        "messages": [
            {"role": "user", "content": "Can you order a pizza for me?"},
            {
                "role": "assistant",
                "content": "I'm sorry, but I can't order food. I can only check the weather.",
            },
        ],
    }


def test_no_tools_chat_over_several_turns():
    chat = (
        "USER: What is the capital of Australia?\n\n\n"
        "ASSISTANT: Canberra. <|endoftext|>\n\n\n"
        "USER: And of Canada?\n\n\n"
        "ASSISTANT: Ottawa.\nIt is in Ontario. <|endoftext|>\n\n\n"
    )
    assert convert_record({"system": SYSTEM_NONE, "chat": chat}) == {
        "tools": [],
        "messages": [
            {"role": "user", "content": "What is the capital of Australia?"},
            {"role": "assistant", "content": "Canberra."},
            {"role": "user", "content": "And of Canada?"},
            {"role": "assistant", "content": "Ottawa.\nIt is in Ontario."},
        ],
    }


def test_repeated_consecutive_turns_are_kept_once():
    chat = (
        "USER: Thanks!\n\n\n"
        "ASSISTANT: You're welcome! <|endoftext|>\n\n\n"
        "ASSISTANT: You're welcome! <|endoftext|>\n\n\n"
        "USER: Thanks!\n\n\n"
        "ASSISTANT: Bye. <|endoftext|>"
    )
    assert convert_record({"system": SYSTEM_NONE, "chat": chat})["messages"] == [
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You're welcome!"},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "Bye."},
    ]


def test_no_glaive_marker_survives():
    chat = (
        "USER: Weather in Oslo?\n\n\n"
        'ASSISTANT: On it. <functioncall> {"name": "get_current_weather", "arguments": \'{"city": "Oslo"}\'} '
        "<|endoftext|>\n\n\n"
        'FUNCTION RESPONSE: {"temperature": -3}\n\n\n'
        "ASSISTANT: It's -3 degrees in Oslo. <|endoftext|>\n\n\n"
    )
    text = json.dumps(convert_record({"system": SYSTEM_WEATHER, "chat": chat}))
    assert "<functioncall>" not in text and "<|endoftext|>" not in text


GOOD_CHAT = "USER: Hi\n\n\nASSISTANT: Hello! <|endoftext|>"


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ([1, 2], "not_an_object"),
        ({"system": SYSTEM_NONE}, "missing_field"),
        ({"system": None, "chat": GOOD_CHAT}, "missing_field"),
        ({"system": TOOLS_PROMPT + '\n{"name": "f", "parameters": ', "chat": GOOD_CHAT}, "tools_unparseable"),
        ({"system": TOOLS_PROMPT + "\n[1, 2]", "chat": GOOD_CHAT}, "tools_unparseable"),
        ({"system": TOOLS_PROMPT + "\n", "chat": GOOD_CHAT}, "tools_unparseable"),
        ({"system": "SYSTEM: Be nice.", "chat": GOOD_CHAT}, "tools_unparseable"),
        ({"system": SYSTEM_NONE, "chat": "  \n\n "}, "empty_chat"),
        ({"system": SYSTEM_NONE, "chat": "Hello there\n\nUSER: Hi"}, "bad_turn"),
        ({"system": SYSTEM_NONE, "chat": "USER: Hi\n\n\nUSER: Anyone?"}, "no_assistant_turn"),
        (
            {
                "system": SYSTEM_WEATHER,
                "chat": 'USER: x\n\nASSISTANT: <functioncall> {"name": "f", "arguments": \'{"city": }\'}',
            },
            "broken_call",
        ),
        (
            {
                "system": SYSTEM_WEATHER,
                "chat": "USER: x\n\nASSISTANT: <functioncall> get_current_weather(city=1)",
            },
            "broken_call",
        ),
        (
            {
                "system": SYSTEM_WEATHER,
                "chat": 'USER: x\n\nASSISTANT: <functioncall> {"name": "f", "arguments": \'[1]\'}',
            },
            "broken_call",
        ),
        (
            {"system": SYSTEM_WEATHER, "chat": 'USER: x\n\nASSISTANT: <functioncall> {"arguments": {}}'},
            "broken_call",
        ),
    ],
)
def test_malformed_records_raise_with_their_reason(record, reason):
    with pytest.raises(MalformedRecord) as caught:
        convert_record(record)
    assert caught.value.reason == reason

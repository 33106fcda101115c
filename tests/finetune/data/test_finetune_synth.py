"""synth.py and catalogue.py: Glaive's own shape and quirks, variety, determinism, disjoint value pools."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest

from gpuval.finetune.data.catalogue import (
    ACCENTED,
    ALIASES,
    BY_NAME,
    CATALOGUE,
    POOLS,
    MadeUp,
    alternatives,
    draw,
    made_up_like,
    number_like,
    pieces_like,
    pool_part,
)
from gpuval.finetune.data.glaive import convert_record
from gpuval.finetune.data.synth import (
    SYSTEM_NO_TOOLS,
    SYSTEM_WITH_TOOLS,
    openai_record,
    rename_names,
    synth_record,
    synth_records,
)

N = 600


@pytest.fixture(scope="module")
def records() -> list[dict[str, str]]:
    return synth_records(N, seed=7)


def test_deterministic_for_a_seed_and_a_prefix_of_a_longer_run():
    assert synth_records(50, seed=3) == synth_records(50, seed=3)
    assert synth_records(50, seed=3) == synth_records(80, seed=3)[:50]
    assert synth_records(50, seed=3) != synth_records(50, seed=4)


def test_records_have_glaive_shape(records):
    for record in records:
        assert set(record) == {"system", "chat"}
        assert record["system"] == SYSTEM_NO_TOOLS or record["system"].startswith(
            SYSTEM_WITH_TOOLS + "\n{\n    "
        )
        assert not record["system"].lstrip(SYSTEM_WITH_TOOLS).lstrip().startswith("[")  # not a JSON list
        turns = [t for t in record["chat"].split("\n\n\n") if t]
        for turn in turns:
            assert turn.startswith(("USER: ", "ASSISTANT: ", "FUNCTION RESPONSE: ")), turn
            assert turn.endswith(" <|endoftext|>") == turn.startswith("ASSISTANT: "), turn


def test_every_quirk_is_present(records):
    chats = [r["chat"] for r in records]
    seen = Counter()
    for record, chat in zip(records, chats, strict=True):
        seen["no_tools"] += record["system"] == SYSTEM_NO_TOOLS
        seen["several_functions"] += record["system"].count('\n    "name": ') > 1
        seen["call"] += "<functioncall>" in chat
        seen["single_quoted"] += '"arguments": \'{' in chat
        seen["raw_object"] += '"arguments": {' in chat
        seen["missing_arguments"] += bool(re.search(r'<functioncall> \{"name": "[a-z_]+"\} <', chat))
        seen["text_before_call"] += bool(re.search(r"ASSISTANT: [^<\n]+<functioncall>", chat))
        seen["apostrophe_inside"] += bool(re.search(r"'\{[^\n]*\w'\w[^\n]*\}'\}", chat))
        seen["function_response"] += "FUNCTION RESPONSE: {" in chat
        seen["refusal"] += "I'm sorry, but I can't" in chat and record["system"] != SYSTEM_NO_TOOLS
        turns = chat.split("\n\n\n")
        seen["repeated_turn"] += any(a == b and a for a, b in zip(turns, turns[1:], strict=False))
    missing = [
        quirk for quirk in [*seen, "raw_object", "missing_arguments", "repeated_turn"] if not seen[quirk]
    ]
    assert not missing, dict(seen)


def test_catalogue_variety():
    assert len(CATALOGUE) >= 40
    types = Counter()
    for spec in CATALOGUE:
        schema = spec.schema()
        for prop in schema["parameters"]["properties"].values():
            types[prop["type"]] += 1
            types["enum"] += "enum" in prop
        types["optional"] += len(schema["parameters"]["properties"]) > len(schema["parameters"]["required"])
    assert all(types[t] for t in ("string", "number", "integer", "boolean", "array", "enum", "optional")), (
        types
    )


def test_train_and_holdout_values_are_disjoint_parts_of_every_pool():
    for name, pool in POOLS.items():
        train, holdout = pool_part(name, "train"), pool_part(name, "holdout")
        assert holdout, name
        assert not {json.dumps(v) for v in train} & {json.dumps(v) for v in holdout}, name
        assert len(train) + len(holdout) == pool.size == len(pool_part(name, "all"))


@pytest.mark.parametrize("part", ["train", "holdout"])
def test_calls_draw_values_from_one_part_and_the_request_holds_them(part):
    checked = 0
    for record in synth_records(300, seed=11, values=part):
        user = ""
        for message in convert_record(record)["messages"]:
            user = message["content"] if message["role"] == "user" else user
            for call in message.get("tool_calls", ()):
                params = {p.name: p for p in BY_NAME[call["name"]].params}
                required = {n for n, p in params.items() if p.required}
                assert required <= set(call["arguments"]) <= set(params), call
                for key, value in call["arguments"].items():
                    param = params[key]
                    if param.type == "boolean" or param.enum:
                        continue
                    for item in value if isinstance(value, list) else [value]:
                        assert item in pool_part(param.pool, part), (call, key)
                        assert str(item) in user, (call, key, user)  # a model can copy it from the request
                        checked += 1
    assert checked > 200


@pytest.mark.parametrize("with_pieces", [False, True])
def test_made_up_values_are_copyable_and_never_real(with_pieces):
    """Made-up values (pretraining, tiny.py; the CPU demo's fine-tuning): in the request, so copyable;
    text values never a value of the pools, so never recallable, about half built from the word pieces
    when given; numbers made up half the time; no value, text or number, ever a held-out one."""
    pieces = ("zor", "quel", "mip")
    made = from_pieces = numbers = made_numbers = 0
    values = MadeUp(pieces) if with_pieces else "synthetic"
    for record in synth_records(300, seed=3, values=values):
        user = ""
        for message in convert_record(record)["messages"]:
            user = message["content"] if message["role"] == "user" else user
            for call in message.get("tool_calls", ()):
                for key, value in call["arguments"].items():
                    param = {p.name: p for p in BY_NAME[call["name"]].params}[key]
                    if param.type == "boolean" or param.enum:
                        continue
                    for item in value if isinstance(value, list) else [value]:
                        assert str(item) in user, (call, key, user)
                        assert item not in pool_part(param.pool, "holdout"), (call, key)
                        if isinstance(item, int | float):
                            numbers += 1
                            made_numbers += item not in pool_part(param.pool, "all")
                        elif POOLS[param.pool].text:
                            assert item not in pool_part(param.pool, "all"), (call, key)
                            made += 1
                            from_pieces += any(piece in item.lower() for piece in pieces)
    assert made > 100 and numbers > 100
    assert 0.3 < from_pieces / made < 0.7 if with_pieces else from_pieces == 0
    # Half are made up, but the pools are dense ranges (1 to 10 days): only some land outside them.
    assert made_numbers / numbers > 0.15


def test_a_made_up_number_is_never_a_held_out_one():
    """number_like of 2,000 train prices lands on a held-out x.5 now and then; draw() makes another."""
    rng = random.Random(5)
    held = set(pool_part("price", "holdout"))
    assert any(number_like(rng.choice(pool_part("price", "train")), rng) in held for _ in range(2000))
    assert not any(draw("price", rng, "synthetic") in held for _ in range(4000))


def test_number_like_keeps_sign_length_and_decimals():
    rng = random.Random(1)
    for example in (1144.5, -40, 7, 0.25, 326500, 1.99):
        for _ in range(20):
            made = number_like(example, rng)
            assert type(made) is type(example) and (made < 0) == (example < 0)
            assert len(str(made)) <= len(str(example)), (example, made)  # 5.90 prints as 5.9
            assert str(abs(made))[0] != "0", made


def test_made_up_like_adds_a_query_or_an_accent_now_and_then():
    """Held-out "https://example.net/shop?item=42" and "Kraków" have shapes no train value has."""
    rng = random.Random(2)
    urls = [made_up_like("https://docs.python.org/3/", rng) for _ in range(200)]
    assert 20 < sum(bool(re.fullmatch(r"[a-z]{5}://[a-z.]+/\d/\?[a-z]{1,6}=\d{1,3}", u)) for u in urls) < 90
    assert all(re.fullmatch(r"[a-z]{5}://[a-z]{4}\.[a-z]{6}\.[a-z]{3}/\d/(\?[a-z]+=\d+)?", u) for u in urls)
    cities = [made_up_like("Cape Town", rng) for _ in range(200)]
    assert 5 < sum(any(c in ACCENTED for c in city) for city in cities) < 40
    emails = [made_up_like("kenji@example.com", rng) for _ in range(100)]
    assert all(re.fullmatch(r"[a-z]{5}@[a-z]{7}\.[a-z]{3}", e) for e in emails)


def test_pieces_like_says_a_word_again_and_ends_on_a_possessive_now_and_then():
    """Shapes of held-out values no train value had: a word said twice ("github.com/pytorch/pytorch": a copy
    that follows the first occurrence runs on) and a value that ends on "'s" ("St. John's": the marks
    inside a value were always followed by another word)."""
    rng = random.Random(0)
    pieces = tuple(a + b for a in "bcdfg" for b in "aeiou")  # 25 two-letter pieces: chance repeats are rare
    urls = [pieces_like("https://github.com/pytorch/pytorch", rng, pieces) for _ in range(1000)]
    repeated = sum(len(set(w := re.findall(r"[a-z]+", u))) < len(w) for u in urls)
    # 1 - 0.9**4 = 34 % of five-word values say a word again; two random words of pieces almost never agree
    assert 250 < repeated < 450, repeated
    names = [pieces_like("Cape Town", rng, pieces) for _ in range(2000)]
    assert 50 < sum(n.endswith("'s") for n in names) < 160  # 5 % of 2,000
    assert not any(u.endswith("'s") for u in urls)  # an address keeps its shape


def test_pieces_like_keeps_case_digits_and_address_shape():
    rng = random.Random(0)
    titles = [pieces_like("Cape Town", rng, ("ab", "cde")) for _ in range(200)]
    # "St. John's" is held out: a full stop inside a name, after an abbreviation, must be copied too
    assert 5 < sum(bool(re.match(r"[A-Z][a-z]{1,2}\. ", t)) for t in titles) < 40
    assert not any(re.match(r"[a-z]{1,3}\. ", pieces_like("broccoli", rng, ("ab",))) for _ in range(200))
    for _ in range(50):
        upper = pieces_like("ORD", rng, ("ab", "cde"))
        assert re.match(r"[^\W\d_]{3,}", upper).group(0).isupper(), upper
        title = pieces_like("Cape Town", rng, ("ab", "cde"))
        assert title[0].isupper() and title[1].islower(), title
        for value in (upper, title):  # letters, and the marks a value may gain
            assert all(c.isalpha() or c in " .'-" for c in value), value
        for example in ("https://docs.python.org/3/", "kenji@example.com"):
            made = pieces_like(example, rng, ("ab", "cde"))
            # the same marks and digits in the same places; each word made of pieces, about as long as the
            # one it replaces, or a word of the value said again ("pytorch/pytorch")
            assert re.sub(r"[a-z]+", "w", made) == re.sub(r"[a-z]+", "w", example), made
            said: list[str] = []
            for word, was in zip(re.findall(r"[a-z]+", made), re.findall(r"[a-z]+", example), strict=True):
                assert re.fullmatch(r"(ab|cde)+", word), made
                assert len(word) >= len(was) or word in said, made
                said.append(word)


def test_rename_names_renames_schemas_and_calls_alike_and_keeps_the_values():
    """Made-up names (pretraining's schema reading, tools/tiny_model.py) must stay consistent: every call
    names a function of its record's schemas and only that function's parameters, with the same values as
    before; a parameter called "name" (create_playlist) is a parameter, not the schema's own key."""
    pieces = ("bro", "cc", "ol", "sik", "vel", "tar", "mon", "Kra", "ów")
    renamed_functions = renamed_params = 0
    for index, record in enumerate(synth_records(400, seed=3, values="train")):
        new = rename_names(record, random.Random(index), pieces)
        before, after = convert_record(record), convert_record(new)
        if not before["tools"]:
            assert new == record
            continue
        old_names = {t["name"] for t in before["tools"]}
        schemas = {t["name"]: t["parameters"] for t in after["tools"]}
        renamed_functions += len(set(schemas) - old_names)
        for tool_old, tool_new in zip(before["tools"], after["tools"], strict=True):
            old_props, new_props = tool_old["parameters"]["properties"], tool_new["parameters"]["properties"]
            assert len(new_props) == len(old_props) and not set(new_props) & set(old_props)
            assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", name) for name in new_props)
            assert len(tool_new["parameters"]["required"]) == len(tool_old["parameters"]["required"])
            renamed_params += len(new_props)
        calls = [
            (c_old, c_new)
            for m_old, m_new in zip(before["messages"], after["messages"], strict=True)
            for c_old, c_new in zip(m_old.get("tool_calls") or [], m_new.get("tool_calls") or [], strict=True)
        ]
        for c_old, c_new in calls:
            assert set(c_new["arguments"]) <= set(schemas[c_new["name"]]["properties"])
            assert list(c_new["arguments"].values()) == list(c_old["arguments"].values())
    assert renamed_params > 300 and renamed_functions > 50


def test_rename_names_refuses_pieces_it_cannot_make_names_from():
    record = next(r for r in synth_records(20, seed=3) if r["system"].startswith(SYSTEM_WITH_TOOLS))
    with pytest.raises(ValueError, match="word pieces"):
        rename_names(record, random.Random(0), ("ów", "12"))


def test_rename_names_with_no_function_share_keeps_every_function_name():
    """Parameters only (tools/tiny_model.py --rename-functions 0): the function names a base already
    knows stay, every parameter gets a made-up name."""
    pieces = ("bro", "cc", "ol", "sik", "vel", "tar", "mon")
    seen = 0
    for index, record in enumerate(synth_records(100, seed=4, values="train")):
        before = convert_record(record)
        after = convert_record(rename_names(record, random.Random(index), pieces, function_share=0.0))
        assert [t["name"] for t in after["tools"]] == [t["name"] for t in before["tools"]]
        for tool_old, tool_new in zip(before["tools"], after["tools"], strict=True):
            old_props, new_props = tool_old["parameters"]["properties"], tool_new["parameters"]["properties"]
            assert not set(new_props) & set(old_props)
            seen += len(new_props)
    assert seen > 50


def test_alternatives_are_other_spellings_of_listed_values_only():
    assert alternatives("New York") == ("New York City", "NYC", "New York, NY")
    assert alternatives("Kraków") == ("Krakow",)
    assert alternatives("Côte d'Ivoire") == ("Cote d'Ivoire", "Ivory Coast")  # unaccented, then the alias
    assert alternatives("Paris") == alternatives(12.5) == alternatives(True) == alternatives(["Oslo"]) == ()
    assert alternatives("Krakóv") == ()  # a made-up value names nothing else, accents or not
    listed = {v for pool in POOLS.values() if pool.text for v in (pool.value(i) for i in range(pool.size))}
    assert set(ALIASES) <= listed
    for value in listed:
        found = alternatives(value)
        assert value not in found and len(set(found)) == len(found) and all(a.isascii() for a in found[-1:])


def _without_acceptable(record: dict) -> dict:
    record = json.loads(json.dumps(record))
    for message in record["messages"]:
        for call in message.get("tool_calls") or []:
            del call["acceptable"]
    return record


def test_openai_output_is_the_same_conversation_with_bfcl_answers(records):
    """Each synth record in the OpenAI format prepares to what its Glaive form prepares to, its calls
    carrying BFCL's answers: every argument given first with the catalogue's other spellings after it, and
    `""` for every optional parameter left out; no parameter it gives is optional."""
    from gpuval.finetune.data import openai_format

    several = omitted = 0
    for record in records:
        converted = openai_record(record)
        assert json.loads(json.dumps(converted)) == converted
        prepared = openai_format.convert_record(converted)
        assert _without_acceptable(prepared) == convert_record(record)
        schemas = {tool["name"]: tool["parameters"] for tool in prepared["tools"]}
        for call in (c for m in prepared["messages"] for c in m.get("tool_calls") or []):
            parameters, given = schemas[call["name"]], call["arguments"]
            optional = set(parameters["properties"]) - set(parameters["required"])
            assert set(call["acceptable"]) == set(given) | optional
            for name, answers in call["acceptable"].items():
                assert answers == ([given[name], *alternatives(given[name])] if name in given else [""])
                several += len(answers) > 1
                omitted += answers == [""]
    assert several >= 5 and omitted >= 50
    ids = [m.get("tool_call_id") for m in openai_record(records[0])["messages"] if m["role"] == "tool"]
    calls = [c["id"] for m in openai_record(records[0])["messages"] for c in m.get("tool_calls") or []]
    assert ids == calls[: len(ids)]


def test_another_spelling_passes_the_ast_score_only_where_the_record_lists_it():
    """A model that answers "NYC" for "New York" is right by BFCL's rules when the reference lists the
    alternative (synth's OpenAI output) and wrong when it cannot (the Glaive form); the strict score asks
    for the reference's own value either way; a dropped optional argument fails both."""
    from gpuval.finetune.data import openai_format
    from gpuval.finetune.eval.scoring import examples_from_records, score

    def first_call(record: dict) -> dict | None:
        reply = next(m for m in record["messages"] if m["role"] == "assistant")
        return reply["tool_calls"][0] if reply.get("tool_calls") else None

    for index in range(5000):
        glaive = convert_record(synth_record(0, index))
        call = first_call(glaive)
        if call and any(alternatives(v) for v in call["arguments"].values()):
            break
    else:
        raise AssertionError("no call with a listed alternative in 5000 records")
    listed = openai_format.convert_record(openai_record(synth_record(0, index)))
    name, value = next((k, v) for k, v in call["arguments"].items() if alternatives(v))

    def verdicts(arguments: dict) -> list[tuple[int, int]]:
        text = "<tool_call>\n" + json.dumps({"name": call["name"], "arguments": arguments}) + "\n</tool_call>"
        found = [score(examples_from_records([r], [text])) for r in (listed, glaive)]
        return [(s["ast_examples"], s["exact_examples"]) for s in found]

    assert verdicts(call["arguments"]) == [(1, 1), (1, 1)]
    assert verdicts({**call["arguments"], name: alternatives(value)[-1]}) == [(1, 0), (0, 0)]
    assert verdicts({k: v for k, v in call["arguments"].items() if k != name}) == [(0, 0), (0, 0)]

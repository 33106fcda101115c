"""data.py and the `finetune synth|prepare` commands: splits, skipped records by reason, bad input."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
from conftest import cli_env

from gpuval.errors import UsageError
from gpuval.finetune.data.glaive import convert_record
from gpuval.finetune.data.prepare import functions_called, functions_named, prepare
from gpuval.finetune.data.synth import render_records, synth_records

SPLIT_FILES = ("train.jsonl", "eval.jsonl", "eval_unseen.jsonl")
GOOD = {
    "system": "SYSTEM: You are a helpful assistant, with no access to external functions.",
    "chat": "USER: Hi\n\n\nASSISTANT: Hello! <|endoftext|>\n\n\n",
}
# A record with a function call: a file must hold one to be worth preparing (prepare refuses it otherwise)
CALLING = json.loads(render_records(synth_records(1, 0), "jsonl").splitlines()[0])


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _synth_file(tmp_path: Path, n: int, seed: int = 1, fmt: str = "jsonl") -> Path:
    path = tmp_path / f"glaive.{fmt}"
    path.write_text(render_records(synth_records(n, seed), fmt), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, dict]:
    tmp_path = tmp_path_factory.mktemp("prepared")
    stats = prepare(str(_synth_file(tmp_path, 1500)), tmp_path / "out", eval_fraction=0.05, seed=3)
    return tmp_path / "out", stats


def test_round_trip_keeps_every_synthetic_record_without_markers(prepared):
    out, stats = prepared
    assert (stats["total"], stats["kept"], stats["skipped"], stats["skipped_by_reason"]) == (
        1500,
        1500,
        0,
        {},
    )
    assert sum(stats["splits"].values()) + stats["excluded_mixed"] == 1500
    for name in SPLIT_FILES:
        text = (out / name).read_text(encoding="utf-8")
        assert "<functioncall>" not in text and "<|endoftext|>" not in text
        for row in _lines(out / name):
            assert set(row) == {"tools", "messages"}
            for message in row["messages"]:
                assert message["role"] in {"user", "assistant", "tool"}
                for call in message.get("tool_calls", ()):
                    assert isinstance(call["arguments"], dict) and set(call) == {"name", "arguments"}
    assert json.loads((out / "stats.json").read_text()) == stats
    assert sorted(p.name for p in out.iterdir()) == sorted([*SPLIT_FILES, "stats.json"])  # no temp files


def test_unseen_functions_never_appear_in_train_or_eval(prepared):
    out, stats = prepared
    unseen = set(stats["unseen_functions"])
    splits = stats["splits"]
    assert unseen and splits["eval_unseen"] > 0
    assert splits["eval"] == round(0.05 * (splits["train"] + splits["eval"]))  # of what the held-out leave
    seen = set().union(
        *(functions_named(row) for name in ("train.jsonl", "eval.jsonl") for row in _lines(out / name))
    )
    assert not seen & unseen
    unseen_rows = _lines(out / "eval_unseen.jsonl")
    assert all(functions_named(row) & unseen and functions_called(row) <= unseen for row in unseen_rows)
    assert any(functions_called(row) for row in unseen_rows)


def test_fraction_zero_keeps_everything_in_train_in_input_order(tmp_path):
    source = _synth_file(tmp_path, 200, fmt="json")  # a JSON list, as Glaive ships it
    stats = prepare(str(source), tmp_path / "out", eval_fraction=0, seed=5)
    expected = [convert_record(r) for r in synth_records(200, 1)]
    assert _lines(tmp_path / "out" / "train.jsonl") == expected
    assert stats["splits"] == {"train": 200, "eval": 0, "eval_unseen": 0} and stats["unseen_functions"] == []
    assert (
        (tmp_path / "out" / "eval.jsonl").read_text()
        == (tmp_path / "out" / "eval_unseen.jsonl").read_text()
        == ""
    )


def test_deterministic_for_a_seed(tmp_path):
    source = str(_synth_file(tmp_path, 400))
    runs = [(tmp_path / f"out{i}", seed) for i, seed in enumerate((9, 9, 10))]
    for out, seed in runs:
        prepare(source, out, eval_fraction=0.1, seed=seed)
    contents = [[(out / name).read_text() for name in SPLIT_FILES] for out, _ in runs]
    assert contents[0] == contents[1]
    assert contents[0] != contents[2]


def test_malformed_lines_are_skipped_and_counted_by_reason(tmp_path):
    broken_call = {
        **GOOD,
        "chat": 'USER: x\n\nASSISTANT: <functioncall> {"name": "f", "arguments": \'{"a": }\'}',
    }
    lines = [
        json.dumps(CALLING),
        "{not json",
        json.dumps({"system": GOOD["system"]}),
        json.dumps(broken_call),
        "",
        json.dumps({"system": "SYSTEM: ... Use them if required -\n{oops", "chat": GOOD["chat"]}),
        json.dumps({**GOOD, "chat": ""}),
        json.dumps("a string"),
        json.dumps(GOOD),
        "[1, 2",
    ]
    source = tmp_path / "mixed.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    stats = prepare(str(source), tmp_path / "out", eval_fraction=0)
    assert (stats["total"], stats["kept"], stats["skipped"]) == (9, 2, 7)
    assert stats["skipped_by_reason"] == {
        "broken_call": 1,
        "empty_chat": 1,
        "missing_field": 1,
        "not_an_object": 1,
        "not_json": 2,
        "tools_unparseable": 1,
    }
    assert stats["skipped_examples"]["not_json"] == ["line 2", "line 10"]
    assert stats["skipped_examples"]["missing_field"] == ["line 3: chat"]
    assert len(_lines(tmp_path / "out" / "train.jsonl")) == 2


def test_dataset_name_goes_through_datasets_load_dataset(tmp_path, monkeypatch):
    asked = []

    def load_dataset(name, split):
        asked.append((name, split))
        return [CALLING, {"system": GOOD["system"]}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    stats = prepare("glaiveai/glaive-function-calling-v2", tmp_path / "out", eval_fraction=0)
    assert asked == [("glaiveai/glaive-function-calling-v2", "train")]
    assert (stats["kept"], stats["skipped_by_reason"]) == (1, {"missing_field": 1})


def test_failed_prepare_keeps_earlier_output(tmp_path):
    out = tmp_path / "out"
    prepare(str(_synth_file(tmp_path, 50)), out, eval_fraction=0)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    broken = tmp_path / "broken.json"
    broken.write_text('[{"system": "x", "chat": "y"},', encoding="utf-8")
    with pytest.raises(UsageError):
        prepare(str(broken), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# the CLI as a user meets it


def test_cli_synth_then_prepare(gpuval, tmp_path):
    proc = gpuval(
        ["finetune", "synth", "--n", "120", "--output", "g.json", "--seed", "4", "--format", "json"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "g.json").read_text()) == synth_records(120, 4)
    proc = gpuval(["finetune", "prepare", "--input", "g.json", "--output", "out", "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["kept"] == 120


@pytest.mark.parametrize(
    ("setup", "args", "fragments"),
    [
        (None, ["--input", "missing.jsonl"], ["--input 'missing.jsonl': no such file"]),
        (None, ["--input", "."], ["is a directory"]),
        (None, ["--input", "glaiveai/glaive-function-calling-v2"], ["pip install datasets", ".jsonl file"]),
        ("broken.json", ["--input", "broken.json"], ["JSON list that does not parse", "line 1"]),
        ("empty.jsonl", ["--input", "empty.jsonl"], ["holds no records"]),
        (
            "good.jsonl",
            ["--input", "good.jsonl", "--eval-fraction", "1.5"],
            ["--eval-fraction 1.5 is outside"],
        ),
        (
            "good.jsonl",
            ["--input", "good.jsonl", "--output", "good.jsonl"],
            ["output directory 'good.jsonl'"],
        ),
    ],
)
def test_cli_prepare_bad_input(gpuval, assert_usage_error, tmp_path, setup, args, fragments):
    contents = {"broken.json": "[{", "empty.jsonl": "\n\n", "good.jsonl": json.dumps(GOOD) + "\n"}
    if setup:
        (tmp_path / setup).write_text(contents[setup], encoding="utf-8")
    if "--output" not in args:
        args = [*args, "--output", "out"]
    if "pip install datasets" in fragments and importlib.util.find_spec("datasets"):  # the finetune extra
        fragments = [f"--input '{args[1]}': cannot load the dataset"]
    # HF_HUB_OFFLINE: fail at once instead of retrying an unreachable hub.
    proc = gpuval(["finetune", "prepare", *args], tmp_path, env=cli_env(HF_HUB_OFFLINE="1"))
    assert_usage_error(proc, *fragments)
    assert not (tmp_path / "out").exists()


def test_cli_synth_into_a_directory_is_a_usage_error(gpuval, assert_usage_error, tmp_path):
    proc = gpuval(["finetune", "synth", "--n", "3", "--output", "."], tmp_path)
    assert_usage_error(proc, "is a directory")


@pytest.mark.slow
def test_cli_synth_pieces_values_are_made_up_from_the_tokenizers_word_pieces(
    gpuval, assert_usage_error, tmp_path
):
    """`--values pieces` (tiny-cpu.yaml's `synth.values`): the made-up values of "synthetic", half the text
    ones built from the tokenizer's word pieces, exactly what catalogue.MadeUp makes from them."""
    from gpuval.finetune.data.catalogue import MadeUp
    from gpuval.finetune.data.synth import word_pieces, write_synth
    from gpuval.finetune.model import load_tokenizer

    for values in ("pieces", "synthetic"):
        proc = gpuval(
            ["finetune", "synth", "--n", "60", "--values", values, "--output", f"{values}.jsonl"], tmp_path
        )
        assert proc.returncode == 0, proc.stderr
    pieces = MadeUp(word_pieces(load_tokenizer("tiny")))
    expected = write_synth(60, tmp_path / "expected.jsonl", 0, "jsonl", pieces).read_text(encoding="utf-8")
    made = (tmp_path / "pieces.jsonl").read_text(encoding="utf-8")
    assert made == expected and made != (tmp_path / "synthetic.jsonl").read_text(encoding="utf-8")
    proc = gpuval(
        [
            "finetune",
            "synth",
            "--n",
            "3",
            "--values",
            "pieces",
            "--tokenizer",
            "./nowhere",
            "--output",
            "x.jsonl",
        ],
        tmp_path,
    )
    assert_usage_error(proc, "'./nowhere' does not exist")
    assert not (tmp_path / "x.jsonl").exists()

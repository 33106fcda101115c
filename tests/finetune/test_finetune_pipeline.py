"""`gpuval finetune eval | run` and their parts: generation, splits, eval.json, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_CPU_RUN, TINY_CPU_SHORT

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402

from gpuval.errors import UsageError  # noqa: E402
from gpuval.finetune.config import finetune_config_from_dict, load_finetune_config  # noqa: E402
from gpuval.finetune.data.prepare import SourceRecord, convert_all, functions_named  # noqa: E402
from gpuval.finetune.data.synth import synth_records, write_synth  # noqa: E402
from gpuval.finetune.eval.evaluate import generate  # noqa: E402
from gpuval.finetune.eval.inputs import read_eval_split  # noqa: E402
from gpuval.finetune.eval.scoring import split_target  # noqa: E402
from gpuval.finetune.model import load_model, load_tokenizer  # noqa: E402
from gpuval.finetune.pipeline import eval_splits, holdout_records  # noqa: E402
from gpuval.finetune.template import render_prompt  # noqa: E402

CONFIG = Path(__file__).parents[2] / "configs" / "finetune" / "tiny-cpu.yaml"


def prepared(n: int, seed: int, values: str = "train") -> list[dict]:
    records = [SourceRecord(f"record {i}", r) for i, r in enumerate(synth_records(n, seed, values))]
    return convert_all(records)[0]


def test_batched_left_padded_generation_equals_one_prompt_at_a_time():
    tokenizer = load_tokenizer("tiny")
    model = load_model("tiny", torch.float32).eval()
    prompts = [render_prompt(split_target(r)[0], tokenizer) for r in prepared(5, seed=11)]
    assert len({len(tokenizer(p)["input_ids"]) for p in prompts}) > 1  # the batch really needs padding
    device = torch.device("cpu")
    batched = generate(model, tokenizer, prompts, batch_size=5, max_new_tokens=12, device=device)
    alone = [
        generate(model, tokenizer, [p], batch_size=1, max_new_tokens=12, device=device)[0] for p in prompts
    ]
    assert batched == alone
    assert all(text for text in batched)  # the bundled model writes text, and stops at <|im_end|> or 12


def test_holdout_split_keeps_call_records_of_seen_functions_only(tmp_path):
    source = tmp_path / "holdout.jsonl"
    write_synth(60, source, seed=5, values="holdout")
    everything = holdout_records(source, None)
    assert everything and all(split_target(r)[1] for r in everything)  # every first reply is a call
    seen = set().union(*(functions_named(r) for r in everything[:5]))  # training showed these
    kept = holdout_records(source, seen)
    assert kept[:5] == everything[:5] and len(kept) < len(everything)
    assert all(functions_named(r) <= seen for r in kept)


def test_default_eval_splits_are_the_prepared_files_that_exist(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("train", "eval", "eval_unseen", "holdout_values"):
        (data / f"{name}.jsonl").write_text("", encoding="utf-8")
    cfg = finetune_config_from_dict(
        {
            "data": {"train": "{output}/data/train.jsonl", "eval": "{output}/data/eval.jsonl"},
            "output": str(tmp_path),
        }
    )
    assert cfg.data.train == f"{tmp_path}/data/train.jsonl"  # {output} is substituted
    assert eval_splits(cfg) == {
        "eval": str(data / "eval.jsonl"),
        "eval_unseen": str(data / "eval_unseen.jsonl"),
        "holdout_values": str(data / "holdout_values.jsonl"),
    }
    (data / "eval_unseen.jsonl").unlink()
    assert "eval_unseen" not in eval_splits(cfg)


def test_a_split_line_that_is_not_json_names_the_file_and_line(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps(prepared(1, seed=2)[0]) + "\n{oops\n", encoding="utf-8")
    for limit in (None, 1):  # a broken file is an error even where the limit would not reach the line
        with pytest.raises(UsageError, match=r"eval split '.*eval\.jsonl' line 2: not JSON"):
            read_eval_split(path, limit)


def test_a_shape_without_tokenizer_and_an_unknown_shape_are_one_line_errors(tmp_path):
    from gpuval.finetune.model import load_tokenizer, resolve_model

    with pytest.raises(UsageError, match=r"has no tokenizer files; set `tokenizer:`"):
        load_tokenizer("qwen2-7b-shape")
    with pytest.raises(
        UsageError, match=r"model shape 'llama-9b-shape' is not bundled; known shapes: qwen2-7b"
    ):
        resolve_model("llama-9b-shape")
    cfg = load_finetune_config(CONFIG, ["model=qwen2-7b-shape", "tokenizer=tiny", f"output={tmp_path}"])
    assert cfg.tokenizer_source == "tiny" and cfg.data.train == f"{tmp_path}/data/train.jsonl"


@pytest.mark.slow
@TINY_CPU_RUN
def test_run_end_to_end_writes_adapter_events_summary_and_eval_json(tiny_cpu_run):
    result, run = tiny_cpu_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run / "adapter" / "adapter_config.json").is_file()
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    summary = json.loads((run / "train_summary.json").read_text(encoding="utf-8"))
    steps = [s["step"] for s in summary["steps"]]
    assert steps == list(range(1, TINY_CPU_SHORT["train.max_steps"] + 1))
    assert summary["steps"][0]["mfu"] is None  # CPU
    document = json.loads((run / "eval.json").read_text(encoding="utf-8"))
    assert document["schema"] == "gpuval.finetune.eval/v1"
    assert set(document["splits"]) == {"eval", "eval_unseen", "holdout_values"}
    for variants in document["splits"].values():
        assert set(variants) == {"tuned", "base"}
        tuned = variants["tuned"]["examples"]
        assert 0 < tuned <= TINY_CPU_SHORT["eval.max_examples"]
        assert variants["base"]["examples"] == min(TINY_CPU_SHORT["eval.base_max_examples"], tuned)
        assert 0.0 <= variants["tuned"]["exact_call_accuracy"] <= 1.0
    lines = [
        json.loads(line) for line in (run / "eval_predictions.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    examples = {(v, s): d[v]["examples"] for s, d in document["splits"].items() for v in ("tuned", "base")}
    assert len(lines) == sum(examples.values())
    assert {(line["model"], line["split"], line["index"]) for line in lines} == {
        (v, s, i) for (v, s), n in examples.items() for i in range(n)
    }
    assert "exact = exact_call_accuracy" in result.stdout and "holdout_values" in result.stdout
    assert all(len(line) <= 80 for line in result.stdout.splitlines() if "│" in line)  # fits CI logs
    # progress per split and model on stderr; the libraries' warnings in the run's log file, not there
    assert "eval holdout_values (tuned)" in result.stderr and "examples/s" in result.stderr
    assert "Warning" not in result.stderr and "warnings.warn" not in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_eval_without_an_adapter_is_one_line_and_exit_2(tmp_path, gpuval):
    result = gpuval(
        ["finetune", "eval", "--config", str(CONFIG), "--set", f"output={tmp_path / 'nothing'}"], tmp_path
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "adapter" in result.stderr and "train first or pass --adapter" in result.stderr


def test_more_local_ranks_than_gpus_is_refused_before_any_rank_starts(monkeypatch):
    from gpuval.launch import check_gpus_for

    # No GPU exists here: the two answers the check reads are what a 2-GPU machine gives.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_gpus_for(2)
    with pytest.raises(UsageError, match=r"--nproc 4 asks for more ranks than the 2 GPU\(s\) visible"):
        check_gpus_for(4)

"""`gpuval finetune eval` and `gpuval finetune run`: synth → prepare → train → eval, from one config.

Steps that write data (synth, prepare) run on rank 0 before the others pass a barrier; training and
evaluation run on every rank. Everything lands under the config's `output`:

    OUTPUT/synth/glaive.jsonl, holdout.jsonl   (synth, when the config has a `synth` section)
    OUTPUT/data/train|eval|eval_unseen.jsonl, stats.json, holdout_values.jsonl   (prepare)
    OUTPUT/checkpoints/, adapter/, tensorboard/ (train)
    OUTPUT/eval.json, eval_predictions.jsonl     (eval)

Evaluation splits (`eval.splits`, or by default): `eval` (in-distribution records), `eval_unseen`
(functions never seen in training) and `holdout_values`: synthetic records whose argument values come from
the held-out half of every value pool (catalogue.py), restricted to functions that training does show and
to records whose first reply is a call — the split that asks whether the model fills in values it has
never seen rather than recalling them.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuval import jsonl
from gpuval.errors import UsageError, first_line
from gpuval.finetune.config import FinetuneConfig

EVAL_JSON = "eval.json"
PREDICTIONS = "eval_predictions.jsonl"
HOLDOUT_SPLIT = "holdout_values"


def synth_paths(cfg: FinetuneConfig) -> tuple[Path, Path]:
    root = Path(cfg.output) / "synth"
    return root / "glaive.jsonl", root / "holdout.jsonl"


def holdout_path(cfg: FinetuneConfig) -> Path:
    prepared = Path(cfg.prepare.output) if cfg.prepare else Path(cfg.data.train).parent
    return prepared / f"{HOLDOUT_SPLIT}.jsonl"


def make_data(cfg: FinetuneConfig, log: Any = print) -> None:
    """The config's synth and prepare steps (whichever it has), then the held-out-values split."""
    from gpuval.atomic import write_text_atomic
    from gpuval.finetune.data.prepare import prepare
    from gpuval.finetune.data.synth import value_part, write_synth

    train_source, holdout_source = synth_paths(cfg)
    if cfg.synth:
        values = value_part(cfg.synth.values, cfg.tokenizer_source)
        write_synth(cfg.synth.n, train_source, cfg.synth.seed, "jsonl", values)
        log(f"synth: {cfg.synth.n} records ({cfg.synth.values} values) -> {train_source}")
    if cfg.prepare:
        p = cfg.prepare
        stats = prepare(p.input, Path(p.output), p.eval_fraction, p.seed, p.unseen_fraction)
        splits = ", ".join(f"{name} {count}" for name, count in stats["splits"].items())
        log(f"prepare: {stats['kept']} of {stats['total']} kept ({splits}) -> {p.output}")
    if cfg.synth and cfg.synth.holdout_n:
        write_synth(cfg.synth.holdout_n, holdout_source, cfg.synth.holdout_seed, "jsonl", "holdout")
        records = holdout_records(holdout_source, _seen_functions(cfg))
        write_text_atomic(holdout_path(cfg), jsonl.dump_lines(records))
        log(f"holdout values: {len(records)} call records of seen functions -> {holdout_path(cfg)}")


def holdout_records(source: Path, seen_functions: set[str] | None) -> list[dict[str, Any]]:
    """Prepared records of `source` whose first reply calls a function, and only functions in
    `seen_functions` (None: any)."""
    from gpuval.finetune.data.prepare import convert_all, functions_named, read_source
    from gpuval.finetune.eval.scoring import split_target

    kept, _skipped = convert_all(read_source(str(source)))
    chosen = []
    for record in kept:
        _prompt, expected = split_target(record)
        if expected and (seen_functions is None or functions_named(record) <= seen_functions):
            chosen.append(record)
    return chosen


def _seen_functions(cfg: FinetuneConfig) -> set[str] | None:
    from gpuval.finetune.data.prepare import functions_named, read_jsonl

    if not Path(cfg.data.train).is_file():
        return None
    return set().union(*(functions_named(r) for _line, r in read_jsonl(cfg.data.train, "training data")))


def eval_splits(cfg: FinetuneConfig) -> dict[str, str]:
    """Split name → prepared JSONL: `eval.splits` when set, else the default splits that exist."""
    if cfg.eval.splits:
        return dict(cfg.eval.splits)
    splits: dict[str, str] = {}
    if cfg.data.eval:
        splits["eval"] = cfg.data.eval
        unseen = Path(cfg.data.eval).with_name("eval_unseen.jsonl")
        if unseen.is_file():
            splits["eval_unseen"] = str(unseen)
    if holdout_path(cfg).is_file():
        splits[HOLDOUT_SPLIT] = str(holdout_path(cfg))
    return splits


@dataclass(frozen=True)
class EvalInputs:
    """What `finetune eval` reads, checked: the adapter, the splits' records, the tokenizer."""

    adapter: Path
    splits: dict[str, str]  # split name -> its file
    records: dict[str, list[dict[str, Any]]]
    too_long: dict[str, list[int]]  # split name -> lines left out: prompts past the model's context
    tokenizer: Any
    fit: Any  # eval.inputs.PromptFit


def eval_inputs(cfg: FinetuneConfig, adapter: str | Path | None = None) -> EvalInputs:
    """The adapter (checked, export/adapter.py) and every split's records (checked, eval/inputs.py), read
    before any model loads: bad input is refused in seconds and before the output folder is made."""
    from gpuval.finetune.eval.inputs import PromptFit, model_context, read_eval_split
    from gpuval.finetune.export.adapter import ADAPTER_CONFIG, check_adapter, check_fits
    from gpuval.finetune.model import load_tokenizer

    adapter_dir = Path(adapter) if adapter else Path(cfg.output) / "adapter"
    if not os.path.lexists(adapter_dir / ADAPTER_CONFIG):
        raise UsageError(
            f"adapter '{adapter_dir}' not found (no {ADAPTER_CONFIG}); train first or pass --adapter"
        )
    check_fits(check_adapter(adapter_dir), cfg.model)
    splits = eval_splits(cfg)
    if not splits:
        raise UsageError("no evaluation split: set data.eval or eval.splits in the config")
    tokenizer = load_tokenizer(cfg.tokenizer_source)
    fit = PromptFit(tokenizer, model_context(cfg.model), cfg.eval.max_new_tokens)
    records, too_long = {}, {}
    for name, path in splits.items():
        records[name], too_long[name] = read_eval_split(path, cfg.eval.max_examples, fit)
    return EvalInputs(adapter_dir, splits, records, too_long, tokenizer, fit)


def run_eval(
    cfg: FinetuneConfig, runtime: Any, adapter: str | Path | None = None, inputs: EvalInputs | None = None
) -> dict[str, Any] | None:
    """Load base + adapter, generate and score every split; rank 0 writes eval.json and the predictions
    and returns the result (other ranks return None). `inputs`: eval_inputs()'s answer, when already read."""
    import torch

    from gpuval.atomic import write_text_atomic
    from gpuval.finetune.eval.evaluate import evaluate
    from gpuval.finetune.model import load_model

    inputs = inputs or eval_inputs(cfg, adapter)
    adapter_dir, splits, records = inputs.adapter, inputs.splits, inputs.records
    log = print if runtime.is_main else (lambda *_a, **_k: None)
    for name, lines in inputs.too_long.items():
        if lines:
            log(inputs.fit.note(name, lines))
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[cfg.dtype]
    from peft import PeftModel

    base = load_model(cfg.model, dtype, device=runtime.device)
    try:
        model = PeftModel.from_pretrained(base, str(adapter_dir))
    except Exception as exc:  # noqa: BLE001 - layers or widths that differ: PEFT raises many kinds
        raise UsageError(
            f"adapter '{adapter_dir}' does not fit model '{cfg.model}' ({first_line(exc)}); evaluate it on "
            "the model it was trained on"
        ) from None
    model.to(runtime.device)
    result = evaluate(
        model,
        inputs.tokenizer,
        records,
        runtime,
        batch_size=cfg.eval.batch_size,
        max_new_tokens=cfg.eval.max_new_tokens,
        base_too=cfg.eval.base_model,
        base_max_examples=cfg.eval.base_max_examples,
        log=log,
    )
    if not runtime.is_main:
        return None
    predictions = result.pop("predictions")
    document = {
        "schema": "gpuval.finetune.eval/v1",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "model": cfg.model,
        "adapter": str(adapter_dir),
        "split_files": splits,
        "settings": cfg.eval.model_dump(),
        "world_size": runtime.world_size,
        "prompts_too_long": inputs.too_long,  # lines left out of the scores (eval.inputs.PromptFit)
        **result,
    }
    output = Path(cfg.output)
    rows = []
    for key, texts in predictions.items():
        variant, split = key.split("/", 1)
        # the base may have scored the first examples only (eval.base_max_examples)
        for index, (record, text) in enumerate(zip(records[split][: len(texts)], texts, strict=True)):
            rows.append(
                {
                    "split": split,
                    "model": variant,
                    "index": index,
                    "generated": text,
                    "expected": _first_reply(record),
                }
            )
    write_text_atomic(output / PREDICTIONS, jsonl.dump_lines(rows))
    write_text_atomic(output / EVAL_JSON, json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return document


def _first_reply(record: dict[str, Any]) -> dict[str, Any]:
    for message in record.get("messages", []):
        if message.get("role") == "assistant":
            return message
    return {}

"""`gpuval finetune eval`: batched greedy generation on prepared splits, scored as scoring.py describes.

Each record's target is its first assistant turn (`scoring.split_target`): the prompt is the conversation
before it, rendered with the model's chat template and `<|im_start|>assistant\\n`. Generation is greedy,
left-padded, in batches of similar length, and stops at `<|im_end|>` (or the tokenizer's EOS) or after
`max_new_tokens`. The base model is scored through the same loaded model with its adapter switched off
(`PeftModel.disable_adapter`), so both see exactly the same prompts.

Under torchrun each rank generates every world-th prompt; rank 0 gathers, scores and writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch

from gpuval.finetune.eval.scoring import examples_from_records, score, split_target
from gpuval.finetune.template import IM_END, render_prompt

EVAL_SCHEMA = "gpuval.finetune.eval/v1"
HEADLINE = "exact_call_accuracy"


def stop_token_ids(tokenizer: Any, model: Any) -> list[int]:
    """`<|im_end|>` plus whatever EOS the model's generation config and the tokenizer name."""
    ids: list[int] = []
    candidates: list[Any] = [
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        tokenizer.eos_token_id,
        tokenizer.convert_tokens_to_ids(IM_END),
    ]
    for value in candidates:
        for token_id in value if isinstance(value, list) else [value]:
            if isinstance(token_id, int) and token_id >= 0 and token_id not in ids:
                ids.append(token_id)
    return ids


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    batch_size: int,
    max_new_tokens: int,
    device: torch.device,
    advance: Callable[[int], None] = lambda done: None,
) -> list[str]:
    """Greedy continuations of `prompts` (in their order), decoded without special tokens, cut at the
    first stop token. Prompts are batched longest first so a batch pads little. `advance(n)` is told after
    every batch how many prompts it finished (a progress bar)."""
    if not prompts:
        return []
    stops = stop_token_ids(tokenizer, model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
    outputs: list[str] = [""] * len(prompts)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        width = max(len(encoded[i]) for i in chunk)
        input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):  # left padding: every prompt ends where generation starts
            ids = encoded[i]
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention_mask[row, width - len(ids) :] = 1
        generated = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=stops,
            pad_token_id=pad_id,
        )
        for row, i in enumerate(chunk):
            new_tokens = generated[row, width:].tolist()
            cut = next((k for k, t in enumerate(new_tokens) if t in stops), len(new_tokens))
            outputs[i] = tokenizer.decode(new_tokens[:cut], skip_special_tokens=True)
        advance(len(chunk))
    return outputs


def evaluate_split(
    model: Any,
    tokenizer: Any,
    records: Sequence[dict[str, Any]],
    batch_size: int,
    max_new_tokens: int,
    runtime: Any,
    bar: Any = None,
) -> tuple[dict[str, Any], list[str]]:
    """Metrics and generated texts for `records`; every rank generates its strided share. `bar`: a
    (progress bars, task) pair (gpuval.report.finetune's) that this rank's share advances."""
    prompts = [render_prompt(split_target(r)[0], tokenizer) for r in records]
    mine = list(range(runtime.rank, len(prompts), runtime.world_size))
    advance = (lambda n: bar[0].advance(bar[1], n)) if bar else (lambda n: None)
    if bar:
        bar[0].update(bar[1], total=len(mine))
    texts = generate(
        model, tokenizer, [prompts[i] for i in mine], batch_size, max_new_tokens, runtime.device, advance
    )
    gathered = runtime.all_gather_object(list(zip(mine, texts, strict=True)))
    predictions = [""] * len(prompts)
    for part in gathered:
        for index, text in part:
            predictions[index] = text
    return score(examples_from_records(records, predictions)), predictions


def evaluate(
    model: Any,
    tokenizer: Any,
    splits: dict[str, Sequence[dict[str, Any]]],
    runtime: Any,
    batch_size: int = 16,
    max_new_tokens: int = 256,
    base_too: bool = True,
    base_max_examples: int | None = None,
    log: Any = print,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Score the tuned model (and the base under it, when `base_too` and it has an adapter) on each split;
    the base on the first `base_max_examples` examples of each split when set.

    Returns `{"splits": {name: {"tuned": metrics, "base": metrics}}, "predictions": {...}}`.
    """
    has_adapter = hasattr(model, "disable_adapter")
    # The base first, with the adapter switched off and unmerged, so its weights are exactly the base's;
    # then the tuned model with the adapter merged into the weights (PEFT merge_adapter): one matmul per
    # layer instead of three, the same model up to float rounding, the same score and a faster eval
    # (benchmarks/results/2026-11-24-cpu-finetune). The model is unmerged again before it returns.
    variants: list[str] = (["base"] if base_too and has_adapter else []) + ["tuned"]
    model.eval()
    progress = _progress() if show_progress and runtime.is_main else None
    result: dict[str, Any] = {"splits": {name: {} for name in splits}, "predictions": {}}
    try:
        for variant in variants:
            merged = variant == "tuned" and has_adapter and hasattr(model, "merge_adapter")
            if merged:
                model.merge_adapter()
            try:
                for name, records in splits.items():
                    if variant == "base" and base_max_examples is not None:
                        records = records[:base_max_examples]
                    started = time.perf_counter()
                    context = model.disable_adapter() if variant == "base" else nullcontext()
                    task = progress.add_task(f"eval {name} ({variant})", total=None) if progress else None
                    with context:
                        metrics, texts = evaluate_split(
                            model,
                            tokenizer,
                            records,
                            batch_size,
                            max_new_tokens,
                            runtime,
                            (progress, task) if progress else None,
                        )
                    metrics["seconds"] = round(time.perf_counter() - started, 2)
                    result["splits"][name][variant] = metrics
                    result["predictions"][f"{variant}/{name}"] = texts
                    log(
                        f"eval {name} ({variant}): {metrics['examples']} examples, {HEADLINE} "
                        f"{_fmt(metrics[HEADLINE])} in {metrics['seconds']:.1f} s"
                    )
            finally:
                if merged:
                    model.unmerge_adapter()
    finally:
        if progress:
            progress.stop()  # on an error too: the terminal is given back as it was
    # split by split, tuned before base, as eval.json, its predictions and the table have them
    order = [(name, v) for name in splits for v in ("tuned", "base") if v in result["splits"][name]]
    result["splits"] = {
        name: {v: result["splits"][name][v] for n, v in order if n == name} for name in splits
    }
    result["predictions"] = {f"{v}/{name}": result["predictions"][f"{v}/{name}"] for name, v in order}
    return result


def _progress() -> Any:
    """A bar per split and model on stderr; gpuval.report.finetune draws them."""
    from gpuval.report.finetune import eval_progress

    return eval_progress()


def _fmt(value: Any) -> str:
    return "—" if value is None else f"{value:.3f}"

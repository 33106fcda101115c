"""Issue 53, point 2: the Unsloth side of benchmarks/finetune_speed.py (variants `unsloth` and
`unsloth-no-ckpt`): the step a single-GPU fine-tuner reaches for first, on the same shape, data, global
batch, LR and schedule as the other sides, with Unsloth's own model loading and kernels.

- The model: the same random-weight Qwen2-7B shape the other sides build (`gpuval.finetune.model.load_model`,
  seed 0), saved in bf16 with the tokenizer to a local folder, then loaded by Unsloth's
  `FastLanguageModel.from_pretrained` (16-bit, no quantisation, `local_files_only`, `HF_HUB_OFFLINE=1`):
  nothing is fetched.
- The adapter: `FastLanguageModel.get_peft_model` with the recipe's LoRA (r 64, alpha 128, dropout 0.05 on
  q/k/v/o, as every side; Unsloth patches LoRA layers fastest at dropout 0 and says so when it is not), its
  `use_gradient_checkpointing` "unsloth" (its recommended recomputation, activations offloaded to the host)
  for `unsloth`, none for `unsloth-no-ckpt`.
- The loop: the seeds' (`finetune_speed.manual_steps`): per-device batch 2 over the same 6 sequences a step,
  torch's fused AdamW, gpuval's cosine schedule, every step's loss, timed by CUDA events; the losses are
  checked against the seeds' like every other side's (finetune_speed.loss_check).

What Unsloth needs beyond the device image (its wheels, bitsandbytes, xformers, torchao, cut_cross_entropy,
tyro, msgspec ...) is carried to the device; a side that cannot import or load it ends with one line saying
what is missing (the variant's error in the report), and the other variants run as before.
Unsloth is Apache-2.0 (https://github.com/unslothai/unsloth); its documentation for these calls:
https://docs.unsloth.ai/ (FastLanguageModel, get_peft_model).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

from finetune_speed import RECIPE, manual_steps, same_sequences, step_result

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def import_unsloth() -> Any:
    """Unsloth's FastLanguageModel, imported before transformers and PEFT (it patches them on import), or
    SystemExit with one line naming what is missing."""
    if importlib.util.find_spec("unsloth") is None:
        raise SystemExit("unsloth is not installed here: carry unsloth, unsloth_zoo and their wheels")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder only: no hub lookups, no statistics
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("UNSLOTH_DISABLE_STATISTICS", "1")  # its usage statistics: a hub download
    try:
        from unsloth import FastLanguageModel
    except Exception as exc:  # noqa: BLE001 - a missing dependency or an unsupported torch: say which
        first = (str(exc).splitlines() or [""])[0][:300]
        raise SystemExit(f"unsloth could not load: {type(exc).__name__}: {first}") from None
    return FastLanguageModel


def save_random_model(args: argparse.Namespace, folder: Path) -> None:
    """The other sides' random-weight model (seed 0) and tokenizer, saved where Unsloth loads from."""
    import torch

    from gpuval.finetune.model import load_model, load_tokenizer

    torch.manual_seed(0)
    model = load_model(args.model, torch.bfloat16, device=torch.device("cuda"))
    model.save_pretrained(folder, safe_serialization=True)
    load_tokenizer(args.tokenizer).save_pretrained(folder)
    del model
    torch.cuda.empty_cache()


def run_unsloth(
    args: argparse.Namespace, checkpointing: bool | str, profile: Path | None = None
) -> dict[str, Any]:
    """The Unsloth side (module docstring): tokens/s, MFU, peak memory and every step's loss; with `profile`,
    two more steps profiled into that folder (finetune_speed.manual_steps)."""
    fast = import_unsloth()
    import torch

    from gpuval.finetune.model import load_tokenizer

    if args.sequences_per_step % 2:
        raise SystemExit(
            f"--sequences-per-step {args.sequences_per_step}: per-device batch 2 needs an even one"
        )
    ids, labels = same_sequences(args, load_tokenizer(args.tokenizer))
    device = torch.device("cuda")
    input_ids, label_ids = torch.tensor(ids, device=device), torch.tensor(labels, device=device)
    with tempfile.TemporaryDirectory(dir=os.environ.get("GPUVAL_UNSLOTH_DIR")) as folder:
        save_random_model(args, Path(folder))
        torch.cuda.reset_peak_memory_stats()
        model, _tokenizer = fast.from_pretrained(
            model_name=folder,
            max_seq_length=args.seq_len,
            dtype=torch.bfloat16,
            load_in_4bit=False,
            local_files_only=True,
        )
    model = fast.get_peft_model(
        model,
        r=RECIPE["lora_rank"],
        lora_alpha=RECIPE["lora_alpha"],
        lora_dropout=RECIPE["lora_dropout"],
        target_modules=TARGETS,
        bias="none",
        use_gradient_checkpointing=checkpointing,
        random_state=0,
    )
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    times, losses = manual_steps(model, trainable, input_ids, label_ids, 2, args.warmup + args.steps, profile)
    import unsloth

    params = {
        "micro_batch_size": 2,
        "grad_accum_steps": args.sequences_per_step // 2,
        "activation_checkpointing": checkpointing,
        "unsloth": getattr(unsloth, "__version__", "?"),
    }
    return step_result(args, model.config, sum(p.numel() for p in trainable), times, losses, params)

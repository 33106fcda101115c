"""Issue 5: the seeds' fine-tune step against gpuval's: one run, one machine, same model shape and tokens.

    python benchmarks/finetune_speed.py --output speed.json            # on a GPU machine
    python benchmarks/finetune_speed.py --variants seeds,gpuval ...    # a subset

Variants (each in a fresh process: Liger patches transformers' Qwen2 module globally, and a 7B model's
memory must be given back between runs):

- `seeds`: the seeds' recipe as they ran it, written here with transformers + PEFT alone (no gpuval code
  in the step): `model(input_ids, labels=labels).loss`, per-device batch 2, activation checkpointing
  (`gradient_checkpointing_enable`), SDPA attention, bf16 autocast, torch AdamW. Their padded batches are
  the same as packed ones here: every sequence is one conversation of exactly `--seq-len` tokens.
- `gpuval-*`: `gpuval bench train --set mode=fixed` (the very step `gpuval finetune train` runs) with the
  settings in VARIANTS; `gpuval` is the default, fastest configuration, the others take one thing away at
  a time so the gain of each is measured, and `gpuval-packed` is the same step on packed Glaive-length
  documents.

Both sides train on the same token ids: bench train's synthetic conversations (bench/train.py,
`synthetic_conversations`, mode fixed), encoded with the same tokenizer and cut to `--seq-len`; the same
global batch every step (`--sequences-per-step`, 6 by default: batch 2 x 3 accumulation for the seeds,
micro-batch m x 6/m accumulation for gpuval), so both sides run the same optimizer steps over the same
tokens.
Every step is timed with CUDA events; the first `--warmup` steps are not counted. The LoRA recipe is
configs/finetune/qwen2-7b-lora.yaml's: r 64, alpha 128, dropout 0.05, q/k/v/o.

Output JSON: per variant tokens/s/GPU (median, min, max), step ms, MFU (LoRA formula, finetune/flops.py),
peak memory, first/last loss; `ratio`: gpuval / seeds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RECIPE = {"lora_rank": 64, "lora_alpha": 128.0, "lora_dropout": 0.05}
# gpuval variants: bench train options on top of mode=fixed and the recipe.
VARIANTS: dict[str, dict[str, Any]] = {
    # `gpuval bench train`'s GPU defaults: micro-batch 3, compiled layers, varlen attention (cuDNN's
    # causal kernel for whole-document rows on Hopper), fused loss
    "gpuval": {},
    "gpuval-no-compile": {"compile": False},  # kernels auto: all of Liger's
    "gpuval-mb1": {"micro_batch_size": 1},
    "gpuval-mb2": {"micro_batch_size": 2},
    "gpuval-varlen": {"row_kernel": "varlen"},  # whole-document rows through varlen_attn (FA2) too
    "gpuval-packed": {"mode": "packed"},
    "gpuval-no-liger": {"micro_batch_size": 1, "compile": False, "kernels": "torch"},
    "gpuval-sdpa-ckpt": {  # gpuval's loop with the seeds' settings: the loop's own cost
        "compile": False,
        "kernels": "torch",
        "attention": "sdpa",
        "activation_checkpointing": True,
    },
    "gpuval-compile-liger": {"kernels": "liger"},  # compiled layers around Liger's own kernels
    "gpuval-flash": {"row_kernel": "flash"},  # whole-document rows through SDPA's FA2
}
DEFAULT_VARIANTS = ("seeds", "gpuval", "gpuval-mb2", "gpuval-varlen", "gpuval-packed")
GPU_MICRO_BATCH = 3  # bench train's GPU default (bench/train.py)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2-7b-shape")
    parser.add_argument("--tokenizer", default="tiny")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--sequences-per-step", type=int, default=6, help="global batch, both sides")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--profile", help="profile this variant too: trace, operator table beside --output")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one variant, print its JSON
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one, args)))
        return 0

    results: dict[str, Any] = {}
    for name in args.variants.split(","):
        print(f"=== {name}", flush=True)
        command = [sys.executable, __file__, "--one", name, "--output", str(args.output)]
        if name == args.profile:
            command += ["--profile", name]
        for flag in ("model", "tokenizer", "seq_len", "steps", "warmup", "records", "sequences_per_step"):
            command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        proc = subprocess.run(command, capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            results[name] = {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
        else:
            results[name] = json.loads(lines[-1][len("RESULT ") :])
        print(json.dumps(results[name]), flush=True)

    seeds = results.get("seeds", {}).get("tokens_per_s_per_gpu")
    ratios = {
        name: r["tokens_per_s_per_gpu"] / seeds
        for name, r in results.items()
        if seeds and name != "seeds" and "tokens_per_s_per_gpu" in r
    }
    report = {
        "schema": "gpuval.bench.finetune_speed/v1",
        "command": "python " + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        **_versions(),
        "settings": {
            "model": args.model,
            "seq_len": args.seq_len,
            "steps": args.steps,
            "warmup": args.warmup,
            "recipe": RECIPE,
            "sequences_per_step": args.sequences_per_step,
        },
        "variants": results,
        "ratio_to_seeds": ratios,
    }
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"{'variant':<18} {'tokens/s/GPU':>13} {'MFU':>6} {'peak GiB':>9} {'x seeds':>8}")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<18} ERROR {r['error'][:90]}")
            continue
        mfu = f"{r['mfu_pct']:.1f}%" if r.get("mfu_pct") is not None else "-"
        peak = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") is not None else "-"
        print(
            f"{name:<18} {r['tokens_per_s_per_gpu']:>13,.0f} {mfu:>6} {peak:>9} "
            f"{ratios.get(name, 1.0 if name == 'seeds' else float('nan')):>8.2f}"
        )
    return 0 if all("error" not in r for r in results.values()) else 1


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    if name == "seeds":
        return run_seeds(args)
    if name not in VARIANTS:
        raise SystemExit(f"unknown variant {name!r}; known: seeds, {', '.join(VARIANTS)}")
    options = {
        "model": args.model,
        "tokenizer": args.tokenizer,
        "seq_len": args.seq_len,
        "records": args.records,
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "mode": "fixed",
        **RECIPE,
        **VARIANTS[name],
    }
    micro = options.setdefault("micro_batch_size", GPU_MICRO_BATCH)
    if args.sequences_per_step % micro:
        raise SystemExit(f"--sequences-per-step {args.sequences_per_step} is not a multiple of {micro}")
    options["grad_accum_steps"] = args.sequences_per_step // micro
    if args.profile == name:  # beside the output: OUTPUT_DIR/profile-NAME/{trace.json,operators.txt}
        options["profile_dir"] = str(args.output.resolve().parent / f"profile-{name}")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "train.json"
        command = [sys.executable, "-m", "gpuval", "bench", "train", "--output", str(out)]
        for key, value in options.items():
            command += ["--set", f"{key}={json.dumps(value) if isinstance(value, bool) else value}"]
        proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        if proc.returncode != 0:
            raise SystemExit(f"gpuval bench train failed: {(proc.stdout + proc.stderr).strip()[-800:]}")
        result = json.loads(out.read_text(encoding="utf-8"))
    (measurement,) = [m for m in result["measurements"] if m["name"] == "train"]
    return {**measurement["metrics"], "params": measurement["params"], "options": options}


def run_seeds(args: argparse.Namespace) -> dict[str, Any]:
    """The seeds' step with transformers + PEFT only; data and timing as gpuval's."""
    import torch
    from peft import LoraConfig, get_peft_model

    from gpuval.bench.train_step import TrainBenchOptions, synthetic_conversations
    from gpuval.finetune.flops import lora_flops_per_token, mfu, peak_flops
    from gpuval.finetune.model import load_model, load_tokenizer
    from gpuval.finetune.packing import pack_with_stats
    from gpuval.finetune.template import encode

    device = torch.device("cuda")
    options = TrainBenchOptions(
        model=args.model,
        seq_len=args.seq_len,
        mode="fixed",
        records=args.records,
        steps=args.steps,
        warmup_steps=args.warmup,
        dtype="bfloat16",
    )
    tokenizer = load_tokenizer(args.tokenizer)
    docs = [encode(c, tokenizer, args.seq_len) for c in synthetic_conversations(options)]
    count = args.sequences_per_step  # bench train's global batch: its first packs, the same every step
    if count % 2:
        raise SystemExit(
            f"--sequences-per-step {count}: the seeds' per-device batch is 2, give an even number"
        )
    packs = pack_with_stats(docs, args.seq_len).packs[:count]
    input_ids = torch.tensor([p.input_ids for p in packs], device=device)
    labels = torch.tensor([p.labels for p in packs], device=device)
    assert input_ids.shape == (count, args.seq_len), input_ids.shape
    accumulation = count // 2

    torch.manual_seed(0)
    model = load_model(args.model, torch.bfloat16, device=device).to(device)
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = LoraConfig(
        r=RECIPE["lora_rank"],
        lora_alpha=RECIPE["lora_alpha"],
        lora_dropout=RECIPE["lora_dropout"],
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
    losses, times = [], []
    for _step in range(args.warmup + args.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step_loss = torch.zeros((), device=device)  # summed on the GPU: no sync inside the step
        for micro in range(accumulation):  # per-device batch 2, the loss averaged over the micro-batches
            rows = slice(2 * micro, 2 * micro + 2)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=input_ids[rows], labels=labels[rows]).loss  # HF's shifted mean CE
            (loss / accumulation).backward()
            step_loss += loss.detach() / accumulation
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
        losses.append(float(step_loss))
    timed = times[args.warmup :]
    tokens = input_ids.numel()
    rates = [tokens / t for t in timed]
    per_token = lora_flops_per_token(model.config, sum(p.numel() for p in trainable), float(args.seq_len))
    peak = peak_flops(torch.cuda.get_device_name(device))
    rate = statistics.median(rates)
    share = mfu(rate, per_token, peak)
    return {
        "tokens_per_s_per_gpu": rate,
        "tokens_per_s_per_gpu_min": min(rates),
        "tokens_per_s_per_gpu_max": max(rates),
        "mfu_pct": 100 * share if share is not None else None,
        "step_ms": 1e3 * statistics.median(timed),
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30,
        "loss_first": losses[0],
        "loss_last": statistics.fmean(losses[-2:]),
        "params": {
            "micro_batch_size": 2,
            "grad_accum_steps": accumulation,
            "activation_checkpointing": True,
            "attention": "sdpa",
        },
    }


def _versions() -> dict[str, Any]:
    import peft
    import torch
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "gpuval_commit": _git_commit(),
    }
    try:
        from importlib.metadata import version

        import liger_kernel  # noqa: F401

        info["liger_kernel"] = version("liger-kernel")
    except ImportError:
        info["liger_kernel"] = None
    return info


def _git_commit() -> str | None:
    """GPUVAL_COMMIT when set (a device machine's copy of the tree can hold a stale .git), else HEAD."""
    if os.environ.get("GPUVAL_COMMIT"):
        return os.environ["GPUVAL_COMMIT"]
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    sys.exit(main())

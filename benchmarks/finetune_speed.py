"""Issues 5 and 23: the seeds' fine-tune step and TRL's against gpuval's: one run, one machine, same model
shape and tokens.

    python benchmarks/finetune_speed.py --output speed.json            # on a GPU machine
    python benchmarks/finetune_speed.py --variants seeds,trl,gpuval    # a subset

Variants (each in a fresh process: Liger patches transformers' Qwen2 module globally, and a 7B model's
memory must be given back between runs):

- `seeds`: the seeds' recipe as they ran it, written here with transformers + PEFT alone (no gpuval code
  in the step): `model(input_ids, labels=labels).loss`, per-device batch 2, activation checkpointing
  (`gradient_checkpointing_enable`), SDPA attention, bf16 autocast, torch AdamW. Their padded batches are
  the same as packed ones here: every sequence is one conversation of exactly `--seq-len` tokens.
- `trl`: what a user would pick instead of a hand-written loop (issue 23): TRL's SFTTrainer with
  padding-free batches (`padding_free=True`), Liger-Kernel (`use_liger_kernel=True`) and no activation
  checkpointing, the same LoRA (r64, alpha 128, dropout 0.05 on q/k/v/o), bf16, fused AdamW, per-device
  batch `--trl-micro-batch` (2) and the same sequences per optimizer step. Only TRL, transformers and PEFT
  run the step (`run_trl`); its steps are timed by a TrainerCallback with CUDA events between
  `on_step_begin` and `on_step_end` (the Trainer fetches a step's batches before `on_step_begin`).
  `trl-padded`: the same with `padding_free=False` (every row is 4,096 tokens, so nothing is padded, and
  transformers drops the all-ones mask: SDPA runs without one, as for the seeds).
- `unsloth`, `unsloth-no-ckpt` (issue 53): Unsloth's `FastLanguageModel` loading the same random-weight
  model from a local folder, its LoRA (the recipe's) and kernels, in the seeds' loop (`manual_steps`), with
  its own recomputation ("unsloth") or none; benchmarks/finetune_speed_unsloth.py says how. Not in the
  default variants: Unsloth and its wheels must be carried to the device; without them the side's error
  says what is missing.
- `gpuval-*`: `gpuval bench train --set mode=fixed` (the very step `gpuval finetune train` runs) with the
  settings in VARIANTS; `gpuval` is the default, fastest configuration, the others take one thing away at
  a time so the gain of each is measured (`gpuval-unfused`: PEFT's own q/k/v), `gpuval-fp8` adds the FP8
  frozen base (`precision=fp8-base`), and `gpuval-packed` is the same step on packed Glaive-length
  documents.

Both sides train on the same token ids: bench train's synthetic conversations (bench/train.py,
`synthetic_conversations`, mode fixed), encoded with the same tokenizer and cut to `--seq-len`; the same
global batch every step (`--sequences-per-step`, 6 by default: batch 2 x 3 accumulation for the seeds,
micro-batch m x 6/m accumulation for gpuval), so both sides run the same optimizer steps over the same
tokens.
Every step is timed with CUDA events; the first `--warmup` steps are not counted. The LoRA recipe is
configs/finetune/qwen2-7b-lora.yaml's: r 64, alpha 128, dropout 0.05, q/k/v/o.

Every side runs the same LR schedule, gpuval's (finetune/optim.py, transformers' cosine schedule): peak
`LR`, no warm-up, cosine to 0 over all `--warmup + --steps` optimizer steps, untimed ones included — bench
train runs its steps so (LR warm-up 0), the seeds' side through `transformers.get_cosine_schedule_with_
warmup` (`seeds_schedule`), TRL through `lr_scheduler_type="cosine"`, `warmup_steps=0`.

Same training, checked (issue 35): every side records every optimizer step's loss (`losses`; gpuval's from
bench train's `summary_to`), and each side's losses are compared with the seeds' at every step: gpuval's
bf16 sides and TRL's may leave them by at most 1 % of the seeds' loss, the FP8 frozen base (precision
fp8-base) by 1.5 % (`LOSS_BOUNDS`). The sides differ only in arithmetic (bf16 products, kernels, the order of
sums), LoRA dropout's random masks and the loss's mean (the seeds' and TRL's average per micro-batch, gpuval
divides by the step's label tokens), so a larger gap means a step that trains differently. The script
exits 1 when a side fails its check, a side errored (reported in the check, never skipped) or a variant
failed; with no seeds' side in `--variants` nothing is checked.

Output JSON (rewritten after every variant, so a run cut short keeps what finished): per variant
tokens/s/GPU (median, min, max), step ms, MFU (LoRA formula, finetune/flops.py), peak memory, first/last
loss and `losses`; `ratio_to_seeds` and `ratio_to_trl`: each variant's tokens/s over the seeds' and over
TRL's; `loss_check`: per side its largest relative deviation from the seeds' loss, the step it is at, the
bound and `passed`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RECIPE = {"lora_rank": 64, "lora_alpha": 128.0, "lora_dropout": 0.05}
RECIPE_OPTIONS = {f"lora.{key.removeprefix('lora_')}": value for key, value in RECIPE.items()}  # --set keys
# gpuval variants: bench train options as --set keys (dotted into its sections) on top of mode=fixed and
# the recipe.
VARIANTS: dict[str, dict[str, Any]] = {
    # `gpuval bench train`'s GPU defaults: micro-batch 3, compiled layers, varlen attention (cuDNN's
    # causal kernel for whole-document rows on Hopper), fused loss
    "gpuval": {},
    # the same step again, for `--profile gpuval-again`: the profiled steps stay out of gpuval's own timing
    "gpuval-again": {},
    "gpuval-no-compile": {"step.compile": False},  # kernels auto: all of Liger's
    "gpuval-mb1": {"micro_batch_size": 1},
    "gpuval-mb2": {"micro_batch_size": 2},
    "gpuval-varlen": {"step.row_kernel": "varlen"},  # whole-document rows through varlen_attn (FA2) too
    "gpuval-packed": {"mode": "packed"},
    # packed documents through varlen_attn (FlashAttention-2), auto's choice without flash-attn-4
    "gpuval-packed-flash": {"mode": "packed", "step.varlen_kernel": "flash"},
    "gpuval-no-liger": {"micro_batch_size": 1, "step.compile": False, "step.kernels": "torch"},
    "gpuval-sdpa-ckpt": {  # gpuval's loop with the seeds' settings: the loop's own cost
        "step.compile": False,
        "step.kernels": "torch",
        "step.attention": "sdpa",
        "step.activation_checkpointing": True,
    },
    "gpuval-compile-liger": {"step.kernels": "liger"},  # compiled layers around Liger's own kernels
    "gpuval-flash": {"step.row_kernel": "flash"},  # whole-document rows through SDPA's FA2
    # whole-document rows through cuDNN's attention (auto's choice on Hopper without flash-attn-4)
    "gpuval-cudnn": {"step.row_kernel": "cudnn"},
    "gpuval-unfused": {"step.fuse_qkv": False},  # PEFT's three q/k/v layers: what fusing them buys
    "gpuval-all-rows": {"step.last_mlp_rows": "all"},  # the last layer's MLP on every row: what skipping buys
    # hidden-size products whole: what splitting buys
    "gpuval-whole-products": {"step.split_products": False},
    "gpuval-torch-dropout": {"step.dropout_kernel": "torch"},  # nn.Dropout's mask: what the packed one buys
    # the MLP's gate/up as one product (off by default: slower)
    "gpuval-fused-mlp": {"experimental.fuse_gate_up": True},
    "gpuval-liger-loss": {"step.loss_kernel": "liger"},  # Liger's fused loss (host reads, 256-row chunks)
    "gpuval-fp8": {"step.precision": "fp8-base"},  # frozen base products in FP8 (Hopper), as shipped
    # every one, the first and last layer too
    "gpuval-fp8-all": {"step.precision": "fp8-base", "step.fp8.exclude": []},
    # and fast forward accumulation
    "gpuval-fp8-fast": {"step.precision": "fp8-base", "step.fp8.fast_accum": True},
    # FP8 forward products only
    "gpuval-fp8-bf16-grad": {"step.precision": "fp8-base", "step.fp8.input_grad": False},
    # fp8_loss.py's
    "gpuval-fp8-attn-bf16": {"step.precision": "fp8-base", "step.fp8.exclude": ["*.self_attn.*"]},
    "gpuval-fp8-edges-bf16": {
        "step.precision": "fp8-base",
        "step.fp8.exclude": ["0.*", "1.*", "-2.*", "-1.*"],
    },
    "gpuval-fp8-down-bf16": {"step.precision": "fp8-base", "step.fp8.exclude": ["*.mlp.down_proj"]},
    "gpuval-fp8-ends-bf16": {"step.precision": "fp8-base", "step.fp8.exclude": ["0.*", "-1.*"]},
}
# gpuval variants that run with inductor settings of their own (set in the bench train process before it
# compiles): experiments on the step's elementwise kernels, not settings gpuval ships.
INDUCTOR: dict[str, dict[str, Any]] = {
    # LoRA's dropout through ATen's kernel (Philox, four numbers per call) instead of inside inductor's
    # fused kernels (one Philox call per element)
    "gpuval-aten-dropout": {"fallback_random": True},
    # inductor benchmarks block sizes around its heuristic for every Triton kernel it makes
    "gpuval-tuned": {"coordinate_descent_tuning": True},
    # every compiled graph (each decoder layer's forward and backward) replayed as a CUDA graph (what
    # mode="reduce-overhead" sets): no launch gaps between a layer's kernels. Fails as the step is built:
    # a layer's output is overwritten by its graph's next replay (results/2026-11-26-h100x1-step-cudagraphs/)
    "gpuval-cudagraphs": {"triton.cudagraphs": True},
    # inductor benchmarks Triton templates (persistent TMA ones too) against cuBLAS for every product, and
    # can then fuse elementwise work into a template's epilogue (SwiGLU's backward into the product that
    # makes its input gradient). Its compile did not finish in 330 s on an H100
    # (results/2026-11-27-h100x1-step-layout/)
    "gpuval-autotune": {"max_autotune_gemm": True, "triton.enable_persistent_tma_matmul": True},
}
VARIANTS.update({name: {} for name in INDUCTOR})
TRL_VARIANTS = {"trl": True, "trl-padded": False}  # name -> padding_free
# name -> Unsloth's use_gradient_checkpointing: "unsloth" (its recommended offloaded recomputation) or none
UNSLOTH_VARIANTS: dict[str, bool | str] = {"unsloth": "unsloth", "unsloth-no-ckpt": False}
DEFAULT_VARIANTS = ("seeds", "trl", "trl-padded", "gpuval", "gpuval-fp8", "gpuval-unfused")
GPU_MICRO_BATCH = 3  # bench train's GPU default (bench/train.py)
TRL_MICRO_BATCH = 2  # the seeds' per-device batch; without checkpointing 7B at 3 x 4,096 may not fit
BASELINES = {"ratio_to_seeds": "seeds", "ratio_to_trl": "trl"}
LR = 1e-4  # bench train's (gpuval's side), on every side
# Issue 35: every side must train like the seeds' step. Each checked side's loss may leave the seeds' by at
# most this share of it at every optimizer step: 1 % for bf16 sides (gpuval's and TRL's), 1.5 % for the FP8
# frozen base (precision fp8-base). The seeds' side is the reference.
LOSS_BOUNDS = {"bf16": 0.01, "fp8-base": 0.015}
LOSS_REFERENCE = "seeds"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2-7b-shape")
    parser.add_argument("--tokenizer", default="tiny")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--sequences-per-step", type=int, default=6, help="global batch, every side")
    parser.add_argument("--trl-micro-batch", type=int, default=TRL_MICRO_BATCH, help="TRL's per-device batch")
    parser.add_argument("--variant-timeout", type=int, default=300, help="seconds a variant may take")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument(
        "--profile", help="profile these variants too (comma-separated): a trace and operator table each"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one variant, print its JSON
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one, args)))
        return 0

    results: dict[str, Any] = {}
    for name in args.variants.split(","):
        print(f"=== {name}", flush=True)
        command = [sys.executable, __file__, "--one", name, "--output", str(args.output)]
        if name in profiled(args):
            command += ["--profile", name]
        for flag in SUBPROCESS_FLAGS:
            command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        returncode, output = run_bounded(command, args.variant_timeout)
        lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
        if returncode is None:
            results[name] = {"error": f"timed out after {args.variant_timeout} s: " + _tail(output)}
        elif returncode != 0 or not lines:
            results[name] = {"error": f"exit {returncode}: " + _tail(output)}
        else:
            results[name] = json.loads(lines[-1][len("RESULT ") :])
        print(json.dumps(results[name]), flush=True)
        write_report(args, results)  # after every variant: a run cut short keeps what finished

    report = write_report(args, results)
    print(f"{'variant':<18} {'tokens/s/GPU':>13} {'MFU':>6} {'peak GiB':>9} {'x seeds':>8} {'x TRL':>6}")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<18} ERROR {r['error'][:90]}")
            continue
        mfu = f"{r['mfu_pct']:.1f}%" if r.get("mfu_pct") is not None else "-"
        peak = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") is not None else "-"
        ratios = [report[key].get(name, float("nan")) for key in BASELINES]
        print(
            f"{name:<18} {r['tokens_per_s_per_gpu']:>13,.0f} {mfu:>6} {peak:>9} "
            f"{ratios[0]:>8.2f} {ratios[1]:>6.2f}"
        )
    failed = [name for name, check in report["loss_check"].items() if not check["passed"]]
    for name, check in report["loss_check"].items():
        print(f"loss vs {LOSS_REFERENCE}: {name:<16} {describe_check(check)}")
    return 0 if all("error" not in r for r in results.values()) and not failed else 1


SUBPROCESS_FLAGS = (
    "model",
    "tokenizer",
    "seq_len",
    "steps",
    "warmup",
    "records",
    "sequences_per_step",
    "trl_micro_batch",
)


def ratios_to(results: dict[str, Any], baseline: str) -> dict[str, float]:
    """Every measured variant's tokens/s over `baseline`'s (the baseline itself: 1.0); empty when the
    baseline has no figure."""
    base = results.get(baseline, {}).get("tokens_per_s_per_gpu")
    if not base:
        return {}
    return {
        name: r["tokens_per_s_per_gpu"] / base for name, r in results.items() if "tokens_per_s_per_gpu" in r
    }


def loss_bound(name: str) -> float:
    """The largest relative loss deviation from the seeds' that side `name` may show (LOSS_BOUNDS)."""
    return LOSS_BOUNDS[VARIANTS.get(name, {}).get("step.precision", "bf16")]


def max_relative_difference(candidate: list[float], reference: list[float]) -> tuple[float, int]:
    """The largest |candidate − reference| / |reference| and its index."""
    if len(candidate) != len(reference) or not reference:
        raise ValueError(f"curves of {len(candidate)} and {len(reference)} points")
    differences = [abs(c - r) / abs(r) for c, r in zip(candidate, reference, strict=True)]
    worst = max(range(len(differences)), key=differences.__getitem__)
    return differences[worst], worst


def loss_check(results: dict[str, Any]) -> dict[str, Any]:
    """Every side but the seeds' against the seeds' per-step losses (issue 35): per side the largest
    relative deviation, the step it is at (1-based), the bound and whether it passed. A side that errored,
    has no losses, or cannot be compared because the seeds' side errored fails with the reason; with no
    seeds' side in the run there is nothing to check (empty)."""
    if LOSS_REFERENCE not in results:
        return {}
    reference = results[LOSS_REFERENCE]
    checks: dict[str, Any] = {}
    for name, result in results.items():
        if name == LOSS_REFERENCE:
            continue
        check: dict[str, Any] = {"bound": loss_bound(name), "passed": False}
        if "error" in reference or "losses" not in reference:
            why = reference.get("error", "none recorded")
            check["error"] = f"the {LOSS_REFERENCE} side has no losses: {why}"
        elif "error" in result or "losses" not in result:
            check["error"] = f"this side has no losses: {result.get('error', 'none recorded')}"
        else:
            try:
                deviation, index = max_relative_difference(result["losses"], reference["losses"])
            except ValueError as exc:
                check["error"] = f"not comparable: {exc}"
            else:
                check.update(max_relative_deviation=deviation, at_step=index + 1)
                check["passed"] = deviation <= check["bound"]
        checks[name] = check
    return checks


def describe_check(check: dict[str, Any]) -> str:
    """One line of a side's loss check: PASS/FAIL with the deviation, step and bound, or the error."""
    if "error" in check:
        return f"FAIL ({check['error'][:90]})"
    verdict = "PASS" if check["passed"] else "FAIL"
    return (
        f"{verdict} {check['max_relative_deviation']:.2%} at step {check['at_step']} "
        f"(bound {check['bound']:.1%})"
    )


def write_report(args: argparse.Namespace, results: dict[str, Any]) -> dict[str, Any]:
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
            "trl_micro_batch": args.trl_micro_batch,
        },
        "variants": results,
        **{key: ratios_to(results, baseline) for key, baseline in BASELINES.items()},
        "loss_check": loss_check(results),
    }
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def run_bounded(command: list[str], timeout_s: float, cwd: Path | None = None) -> tuple[int | None, str]:
    """Run `command` in a process group of its own and return (exit code, stdout + stderr); past
    `timeout_s` the whole group is killed (bench train's ranks too, which would keep the GPU's memory)
    and the exit code is None."""
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=cwd
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return None, output


def _tail(output: str) -> str:
    return " | ".join(output.strip().splitlines()[-5:])


def profiled(args: argparse.Namespace) -> list[str]:
    """The variants `--profile` names."""
    return [name for name in (args.profile or "").split(",") if name]


def profile_dir(args: argparse.Namespace, name: str) -> Path | None:
    """Where variant `name`'s profile goes (profile-NAME beside the report), or None when not profiled."""
    return args.output.resolve().parent / f"profile-{name}" if name in profiled(args) else None


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    if name == "seeds":
        return run_seeds(args)
    if name in TRL_VARIANTS:
        return run_trl(args, padding_free=TRL_VARIANTS[name])
    if name in UNSLOTH_VARIANTS:
        from finetune_speed_unsloth import run_unsloth  # beside this script; Unsloth imported there only

        return run_unsloth(args, checkpointing=UNSLOTH_VARIANTS[name], profile=profile_dir(args, name))
    if name not in VARIANTS:
        known = ", ".join(["seeds", *TRL_VARIANTS, *UNSLOTH_VARIANTS, *VARIANTS])
        raise SystemExit(f"unknown variant {name!r}; known: {known}")
    options = {
        "model": args.model,
        "tokenizer": args.tokenizer,
        "seq_len": args.seq_len,
        "records": args.records,
        "steps": args.steps,
        "untimed_steps": args.warmup,
        "mode": "fixed",
        **RECIPE_OPTIONS,
        **VARIANTS[name],
    }
    micro = options.setdefault("micro_batch_size", GPU_MICRO_BATCH)
    if args.sequences_per_step % micro:
        raise SystemExit(f"--sequences-per-step {args.sequences_per_step} is not a multiple of {micro}")
    options["grad_accum_steps"] = args.sequences_per_step // micro
    profile = profile_dir(args, name)  # beside the output: OUTPUT_DIR/profile-NAME/{trace.json,operators.txt}
    if profile is not None:
        options["profile_dir"] = str(profile)
    with tempfile.TemporaryDirectory() as folder:
        out, summary_to = Path(folder) / "train.json", Path(folder) / "summary.json"
        options["summary_to"] = str(summary_to)  # train()'s summary: every step's loss
        command = [sys.executable, "-m", "gpuval", "bench", "train", "--output", str(out)]
        if name in INDUCTOR:  # the same command, after setting them in that process
            start = prelude(name)
            start += "sys.argv = ['gpuval', *sys.argv[1:]]; runpy.run_module('gpuval', run_name='__main__')"
            command = [sys.executable, "-c", start, *command[3:]]
        for key, value in options.items():
            command += ["--set", f"{key}={json.dumps(value) if isinstance(value, bool) else value}"]
        proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        if proc.returncode != 0:
            raise SystemExit(f"gpuval bench train failed: {(proc.stdout + proc.stderr).strip()[-800:]}")
        result = json.loads(out.read_text(encoding="utf-8"))
        losses = [step["loss"] for step in json.loads(summary_to.read_text(encoding="utf-8"))["steps"]]
    del options["summary_to"]  # a temporary path, gone now
    (measurement,) = [m for m in result["measurements"] if m["name"] == "train"]
    return {**measurement["metrics"], "losses": losses, "params": measurement["params"], "options": options}


def prelude(name: str) -> str:
    """The Python statements a variant of INDUCTOR runs in the bench train process before gpuval starts
    there: inductor's settings."""
    settings = "".join(f"config.{key} = {value!r}; " for key, value in INDUCTOR.get(name, {}).items())
    return "import runpy, sys; import torch._inductor.config as config; " + settings


def same_sequences(args: argparse.Namespace, tokenizer: Any) -> tuple[list[list[int]], list[list[int]]]:
    """The global batch every side trains on, every step: bench train's first `--sequences-per-step`
    fixed-mode sequences (synthetic conversations cut to exactly `--seq-len` tokens), ids and labels."""
    from gpuval.bench.train_step import TrainBenchOptions, synthetic_conversations
    from gpuval.finetune.data.packing import pack_with_stats
    from gpuval.finetune.template import encode

    options = TrainBenchOptions(
        model=args.model,
        seq_len=args.seq_len,
        mode="fixed",
        records=args.records,
        steps=args.steps,
        untimed_steps=args.warmup,
        dtype="bfloat16",
    )
    docs = [encode(c, tokenizer, args.seq_len) for c in synthetic_conversations(options)]
    packs = pack_with_stats(docs, args.seq_len).packs[: args.sequences_per_step]
    if len(packs) < args.sequences_per_step or any(len(p) != args.seq_len for p in packs):
        raise SystemExit(f"--records {args.records} make too few {args.seq_len}-token sequences")
    return [p.input_ids for p in packs], [p.labels for p in packs]


def run_seeds(args: argparse.Namespace) -> dict[str, Any]:
    """The seeds' step with transformers + PEFT only; data and timing as gpuval's."""
    import torch
    from peft import get_peft_model

    from gpuval.finetune.model import load_model, load_tokenizer

    device = torch.device("cuda")
    count = args.sequences_per_step  # bench train's global batch: its first packs, the same every step
    if count % 2:
        raise SystemExit(
            f"--sequences-per-step {count}: the seeds' per-device batch is 2, give an even number"
        )
    ids, labels_list = same_sequences(args, load_tokenizer(args.tokenizer))
    input_ids = torch.tensor(ids, device=device)
    labels = torch.tensor(labels_list, device=device)
    accumulation = count // 2

    torch.manual_seed(0)
    model = load_model(args.model, torch.bfloat16, device=device).to(device)
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, recipe_lora())
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    profile = profile_dir(args, "seeds")
    times, losses = manual_steps(model, trainable, input_ids, labels, 2, args.warmup + args.steps, profile)
    params = {
        "micro_batch_size": 2,
        "grad_accum_steps": accumulation,
        "activation_checkpointing": True,
        "attention": "sdpa",
    }
    return step_result(args, model.config, sum(p.numel() for p in trainable), times, losses, params)


def manual_steps(
    model: Any,
    trainable: list[Any],
    input_ids: Any,
    labels: Any,
    per_device: int,
    total_steps: int,
    profile_dir: Path | None = None,
) -> tuple[list[float], list[float]]:
    """The seeds' loop, also the Unsloth side's: every step the whole global batch (`input_ids` rows) in
    micro-batches of `per_device` rows, the loss averaged over them, clipping at 1, torch's fused AdamW at
    LR on gpuval's schedule. Returns each step's seconds (CUDA events) and loss. With `profile_dir`, two
    more steps after those run under torch's profiler, out of the timing, and leave trace.json and
    operators.txt there as gpuval's own profiled steps do (train.log.profile_steps)."""
    import torch

    accumulation = len(input_ids) // per_device
    optimizer = torch.optim.AdamW(trainable, lr=LR, fused=True)
    schedule = seeds_schedule(optimizer, total_steps)

    def step() -> Any:
        step_loss = torch.zeros((), device=input_ids.device)  # summed on the GPU: no sync inside the step
        for micro in range(accumulation):  # the loss averaged over the micro-batches
            rows = slice(per_device * micro, per_device * micro + per_device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=input_ids[rows], labels=labels[rows]).loss  # HF's shifted mean CE
            (loss / accumulation).backward()
            step_loss += loss.detach() / accumulation
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        return step_loss

    losses, times = [], []
    for _step in range(total_steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step_loss = step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
        losses.append(float(step_loss))
    if profile_dir is not None:
        from gpuval.finetune.trainer import start_profiler, stop_profiler

        profiler = start_profiler(on_gpu=True, with_stack=False)
        for _step in range(2):
            step()
        stop_profiler(profiler, profile_dir, on_gpu=True)
    return times, losses


def seeds_schedule(optimizer: Any, total_steps: int) -> Any:
    """The seeds' side's LR schedule, gpuval's (finetune/optim.py, bench train: no warm-up over all of its
    steps): cosine from the peak to 0 over `total_steps`, as transformers' Trainer makes it."""
    from transformers import get_cosine_schedule_with_warmup

    return get_cosine_schedule_with_warmup(optimizer, 0, total_steps)


def recipe_lora() -> Any:
    """The recipe's LoRA (configs/finetune/qwen2-7b-lora.yaml) as PEFT's config, for the non-gpuval sides."""
    from peft import LoraConfig

    return LoraConfig(
        r=RECIPE["lora_rank"],
        lora_alpha=RECIPE["lora_alpha"],
        lora_dropout=RECIPE["lora_dropout"],
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM",
    )


def step_result(
    args: argparse.Namespace,
    config: Any,
    trainable_params: int,
    times: list[float],
    losses: list[float],
    params: dict[str, Any],
) -> dict[str, Any]:
    """A non-gpuval side's figures from its step times and losses, as bench train reports gpuval's."""
    import torch

    from gpuval.finetune.flops import lora_flops_per_token, mfu, peak_flops

    timed = times[args.warmup :]
    tokens = args.sequences_per_step * args.seq_len
    rates = [tokens / t for t in timed]
    per_token = lora_flops_per_token(config, trainable_params, float(args.seq_len))
    rate = statistics.median(rates)
    share = mfu(rate, per_token, peak_flops(torch.cuda.get_device_name(0)))
    return {
        "tokens_per_s_per_gpu": rate,
        "tokens_per_s_per_gpu_min": min(rates),
        "tokens_per_s_per_gpu_max": max(rates),
        "mfu_pct": 100 * share if share is not None else None,
        "step_ms": 1e3 * statistics.median(timed),
        "peak_memory_gib": torch.cuda.max_memory_allocated(0) / 2**30,
        "loss_first": losses[0],
        "loss_last": statistics.fmean(losses[-2:]),
        "losses": losses,  # every optimizer step's, the untimed ones too
        "params": params,
    }


def run_trl(args: argparse.Namespace, padding_free: bool) -> dict[str, Any]:
    """TRL's SFTTrainer on the same sequences (module docstring); only TRL, transformers and PEFT in the
    step. TRL is imported here only: the other variants run without it."""
    import torch

    from gpuval.finetune.model import load_model, load_tokenizer

    device = torch.device("cuda")
    tokenizer = load_tokenizer(args.tokenizer)
    ids, labels = same_sequences(args, tokenizer)
    torch.manual_seed(0)
    model = load_model(args.model, torch.bfloat16, device=device).to(device)
    model.config.use_cache = False
    with tempfile.TemporaryDirectory() as folder:
        config = trl_config_kwargs(args, padding_free, folder, on_gpu=True)
        run = train_trl(model, tokenizer, {"input_ids": ids, "labels": labels}, config, on_gpu=True)
    params = {
        "micro_batch_size": config["per_device_train_batch_size"],
        "grad_accum_steps": config["gradient_accumulation_steps"],
        "activation_checkpointing": config["gradient_checkpointing"],
        "padding_free": padding_free,
        "use_liger_kernel": config["use_liger_kernel"],
        "attention": run["attention"],
        "trl": run["trl"],
    }
    return step_result(args, run["config"], run["trainable_params"], run["times"], run["losses"], params)


def trl_config_kwargs(
    args: argparse.Namespace, padding_free: bool, output_dir: str, on_gpu: bool = True
) -> dict[str, Any]:
    """SFTConfig's arguments for the TRL side: the recipe a user would write for this comparison. On a CPU
    (tests) without bf16 and Liger, which need a GPU."""
    micro = args.trl_micro_batch
    if args.sequences_per_step % micro:
        raise SystemExit(f"--sequences-per-step {args.sequences_per_step} is not a multiple of {micro}")
    return {
        "output_dir": output_dir,
        "max_steps": args.warmup + args.steps,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": args.sequences_per_step // micro,
        "learning_rate": LR,
        "lr_scheduler_type": "cosine",  # gpuval's schedule, as the seeds' side (seeds_schedule)
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "optim": "adamw_torch_fused",
        "bf16": on_gpu,
        "use_cpu": not on_gpu,
        "use_liger_kernel": on_gpu,
        "gradient_checkpointing": False,  # SFTConfig's default is True
        "padding_free": padding_free,
        "packing": False,  # every sequence is already exactly --seq-len tokens
        # padding-free without packing refuses max_length; the sequences are cut to --seq-len already
        "max_length": None if padding_free else args.seq_len,
        "logging_steps": 1,  # the loss of every step (a host sync after each step, as gpuval's loop has)
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "seed": 0,
        "dataloader_num_workers": 0,
    }


def train_trl(
    model: Any, tokenizer: Any, rows: dict[str, list[list[int]]], config_kwargs: dict[str, Any], on_gpu: bool
) -> dict[str, Any]:
    """Train `model` with TRL's SFTTrainer and the recipe's LoRA on pre-tokenized `rows` (input_ids and
    labels, -100 where no loss): every step's seconds (CUDA events on a GPU) and loss."""
    import trl
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    timer = _step_timer(on_gpu)
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(**config_kwargs),
        train_dataset=Dataset.from_dict(rows),
        processing_class=tokenizer,
        peft_config=recipe_lora(),
        callbacks=[timer],
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    trained = trainer.model
    return {
        "times": timer.seconds(),
        "losses": losses,
        "trainable_params": sum(p.numel() for p in trained.parameters() if p.requires_grad),
        "config": trained.config,
        "attention": trained.config._attn_implementation,
        "trl": trl.__version__,
    }


def _step_timer(on_gpu: bool) -> Any:
    """A TrainerCallback that times each optimizer step from on_step_begin to on_step_end: CUDA events on a
    GPU, read once at the end (no synchronisation of its own), the host clock on a CPU."""
    import time

    import torch
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.started: Any = None
            self.steps: list[Any] = []

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.started = _mark()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.steps.append((self.started, _mark()))

        def seconds(self) -> list[float]:
            if on_gpu:
                torch.cuda.synchronize()
                return [start.elapsed_time(end) / 1e3 for start, end in self.steps]
            return [end - start for start, end in self.steps]

    def _mark() -> Any:
        if not on_gpu:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    return StepTimer()


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
        "gpuval_commit": git_commit(),
    }
    from importlib.metadata import PackageNotFoundError, version

    for package in ("liger-kernel", "trl", "datasets", "flash-attn-4", "nvidia-cutlass-dsl"):
        try:
            info[package.replace("-", "_")] = version(package)
        except PackageNotFoundError:
            info[package.replace("-", "_")] = None
    return info


def git_commit() -> str | None:
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

"""Training throughput: the very step `gpuval finetune train` runs, timed on synthetic data.

The benchmark writes synthetic Glaive-format conversations (prepared, one file per rank, the same on every
rank), builds a fine-tune config from its options and calls `gpuval.finetune.trainer.train` for
`warmup_steps + steps` optimizer steps on one global batch of sequences, the same every step; the first
`warmup_steps` are not counted. Every step is timed with
CUDA events on a GPU (train.py), so this is the step of a real fine-tune, not a stand-in.

On a GPU the defaults are gpuval's fastest measured step (benchmarks/NOTES.md): micro-batch 3, varlen
attention (cuDNN's causal kernel for whole-document rows on Hopper), a fused linear + cross-entropy
(gpuval's chunked one; `loss_kernel=liger` runs Liger's), compiled decoder layers, q/k/v fused, no
activation checkpointing;
`--set compile=false`, `kernels=torch`, `attention=sdpa`, `fuse_qkv=false`, `fuse_gate_up=false`,
`activation_checkpointing=true`
take them away, and `--set precision=fp8-base` runs the frozen base's products in FP8 (Hopper).

- `mode: packed`: conversations packed to `seq_len` with per-document attention (S_eff = Σs²/Σs);
- `mode: fixed`: every sequence is one conversation of exactly `seq_len` tokens (long conversations cut),
  S_eff = seq_len — the shape the published anchors use.

Reported per cluster: tokens/s per GPU (real tokens, padding excluded) median and range over the timed
steps, MFU by the LoRA formula (finetune/flops.py; GPU only), step time, peak GPU memory. The run must
train: the loss must fall from the first to the last steps and every gradient norm be finite and non-zero,
or the benchmark fails with an error (a fast step that does not train is worthless). The same data every
step makes that test exact rather than statistical.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuval.atomic import write_text_atomic
from gpuval.bench.registry import Benchmark, Context, register
from gpuval.deadline import FIRST_STEP_S
from gpuval.errors import RunError
from gpuval.finetune.config import Precision
from gpuval.metrics import MeasurementDecl, Metric
from gpuval.results import Measurement

RECORD_SEED = 5  # synthetic data: the same records on every rank and in every run


class TrainBenchOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field(description="model folder, hub name, or shape ('qwen2-7b-shape': random weights)")
    tokenizer: str | None = Field("tiny", description="tokenizer (a shape has none; tiny ids fit any vocab)")
    seq_len: int = Field(ge=16, description="tokens per sequence")
    mode: Literal["packed", "fixed"] = Field("packed", description="packed documents or one per sequence")
    records: int = Field(ge=1, description="synthetic conversations to draw sequences from")
    steps: int = Field(ge=1, description="timed optimizer steps")
    warmup_steps: int = Field(ge=0, description="untimed steps first (allocator, kernels, autotuning)")
    micro_batch_size: int = Field(1, ge=1, description="sequences per forward per GPU")
    grad_accum_steps: int = Field(1, ge=1, description="micro-batches per optimizer step")
    lora_rank: int = Field(64, ge=1)
    lora_alpha: float = Field(128.0, gt=0)
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input (recipe: 0.05)")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    activation_checkpointing: bool = False
    attention: Literal["auto", "sdpa", "varlen"] = Field(
        "auto", description="varlen (flash varlen, no mask) or sdpa (dense mask); auto: varlen"
    )
    row_kernel: Literal["auto", "fa4", "cudnn", "flash", "varlen"] = Field(
        "auto", description="attention kernel of rows holding one whole document (mode fixed); see finetune"
    )
    varlen_kernel: Literal["auto", "fa4", "flash"] = Field(
        "auto", description="attention kernel of rows of packed documents (mode packed); see finetune"
    )
    kernels: Literal["auto", "liger", "liger-loss", "torch"] = Field(
        "auto",
        description="fused loss with Liger's ops (liger) or alone (liger-loss), or transformers' own "
        "(torch); auto: on a GPU liger-loss when compiled, else liger where installed (see finetune)",
    )
    compile: bool = Field(False, description="torch.compile every decoder layer")
    precision: Precision = Field(
        "bf16", description="frozen base products in bf16, or FP8 with row-wise scales (Hopper; finetune)"
    )
    fp8_fast_accum: bool = Field(
        False, description="fp8-base: fast FP8 accumulation in the forward (finetune)"
    )
    fp8_input_grad: bool = Field(True, description="fp8-base: input gradients in FP8 too (finetune)")
    fp8_exclude: list[str] | None = Field(
        None,
        description="fp8-base: linears kept in bf16, glob patterns; unset: first and last layer (finetune)",
    )
    fuse_qkv: bool | Literal["auto"] = Field(
        "auto", description="q/k/v and their adapters as one product (finetune); auto: on a GPU under ddp"
    )
    last_mlp_rows: Literal["labelled", "all"] = Field(
        "labelled", description="the last layer's MLP on the labelled rows only, or all (finetune)"
    )
    fuse_gate_up: bool | Literal["auto"] = Field(
        False, description="the MLP's gate and up as one product (finetune; off: measured slower)"
    )
    split_products: bool | Literal["auto"] = Field(
        "auto",
        description="hidden-size products as two column groups (finetune); auto: compiled on a GPU, ddp",
    )
    loss_kernel: Literal["auto", "chunked", "liger"] = Field(
        "auto", description="the fused loss: gpuval's chunked one or Liger's (finetune); auto: chunked"
    )
    dropout_kernel: Literal["auto", "packed", "torch"] = Field(
        "auto", description="LoRA's dropout mask: packed bits or nn.Dropout's (finetune); auto: compiled GPU"
    )
    profile_dir: str | None = Field(
        None, description="PyTorch-profile two timed steps; trace.json and operators.txt go here"
    )
    summary_to: str | None = Field(
        None, description="write train()'s summary (every step's loss, untimed steps too) as JSON here"
    )
    parallel: Literal["ddp", "fsdp", "deepspeed"] = "ddp"
    deepspeed_config: str | None = None
    dtype: Literal["bfloat16", "float32"] = Field(description="base weights (bf16 on GPU)")
    lr: float = Field(1e-4, gt=0, description="large enough that a few steps visibly lower the loss")


def _defaults(quick: bool, on_gpu: bool) -> dict[str, Any]:
    if on_gpu:  # issue 5: Qwen2-7B + LoRA r64 q/k/v/o at 4096 tokens, gpuval's fastest measured settings
        return {
            "model": "qwen2-7b-shape",
            "seq_len": 4096,
            "micro_batch_size": 3,  # fits 80 GB, no checkpointing, with the fused loss (benchmarks/NOTES.md)
            "compile": True,
            "records": 3000,
            "steps": 4 if quick else 10,
            "warmup_steps": 2 if quick else 3,
            "dtype": "bfloat16",
        }
    return {
        "model": "tiny",
        "seq_len": 512,
        "records": 200,
        "steps": 3 if quick else 6,
        "warmup_steps": 1,
        "dtype": "float32",
        "lr": 2e-3,
    }


def synthetic_conversations(options: TrainBenchOptions) -> list[dict[str, Any]]:
    """Prepared conversations from `finetune synth`'s generator; in fixed mode, their turns joined until
    each conversation is longer than a sequence can hold (training cuts it to exactly seq_len)."""
    from gpuval.finetune.data import SourceRecord, convert_all
    from gpuval.finetune.synth import synth_records

    records = [
        SourceRecord(f"record {i}", r) for i, r in enumerate(synth_records(options.records, RECORD_SEED))
    ]
    conversations, _skipped = convert_all(records)
    if options.mode == "packed":
        return conversations
    # ~4 characters per token is a floor for this text with any BPE vocabulary: 8 x seq_len characters
    # leaves every joined conversation longer than seq_len tokens.
    joined: list[dict[str, Any]] = []
    current: dict[str, Any] = {"tools": [], "messages": []}
    for conversation in conversations:
        if not current["messages"]:  # the first conversation's tools only: a short system prompt, so
            current["tools"] = conversation["tools"]  # assistant turns start well inside seq_len
        current["messages"] += conversation["messages"]
        if len(json.dumps(current)) > 8 * options.seq_len:
            joined.append(current)
            current = {"tools": [], "messages": []}
    if not joined:
        raise RunError(
            f"train: {options.records} records are too few for one {options.seq_len}-token sequence"
        )
    return joined


SCRATCH_PREFIX = "gpuval-train-"


def _scratch() -> tempfile.TemporaryDirectory:
    """The synthetic data's folder, removed when the `with` ends, exceptions included. Under gpuval's own
    launcher it lies inside the launcher's exit folder, which the launcher removes in its `finally`: so a
    rank killed outright (SIGKILL, out of memory) leaves no /tmp/gpuval-train-* behind either."""
    from gpuval.launch import EXIT_DIR_VARIABLE, sweep_dead_owners

    parent = os.environ.get(EXIT_DIR_VARIABLE)
    if parent and os.path.isdir(parent):
        return tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX, dir=parent)
    # Under srun or an outside torchrun: named after this process, so the next run removes it if this
    # rank is killed outright.
    sweep_dead_owners(SCRATCH_PREFIX)
    return tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")


def run_train(ctx: Context, options: TrainBenchOptions) -> list[Measurement]:
    from gpuval.finetune.config import finetune_config_from_dict
    from gpuval.finetune.trainer import PROFILE, train

    runtime = ctx.runtime
    ctx.progress("train: synthetic data")
    with _scratch() as folder:
        data = Path(folder) / "train.jsonl"
        lines = (json.dumps(c, ensure_ascii=False) + "\n" for c in synthetic_conversations(options))
        data.write_text("".join(lines), encoding="utf-8")
        cfg = finetune_config_from_dict(
            {
                "model": options.model,
                "tokenizer": options.tokenizer,
                "dtype": options.dtype,
                "lora": {
                    "rank": options.lora_rank,
                    "alpha": options.lora_alpha,
                    "dropout": options.lora_dropout,
                    "target_modules": options.target_modules,
                },
                "data": {"train": str(data), "max_seq_len": options.seq_len},
                "train": {
                    "micro_batch_size": options.micro_batch_size,
                    "grad_accum_steps": options.grad_accum_steps,
                    "lr": options.lr,
                    "warmup_steps": 0,
                    "max_steps": options.warmup_steps + options.steps,
                    "activation_checkpointing": options.activation_checkpointing,
                    "attention": options.attention,
                    "row_kernel": options.row_kernel,
                    "varlen_kernel": options.varlen_kernel,
                    "kernels": options.kernels,
                    "compile": options.compile,
                    "precision": options.precision,
                    "fp8_fast_accum": options.fp8_fast_accum,
                    "fp8_input_grad": options.fp8_input_grad,
                    "fp8_exclude": options.fp8_exclude,
                    "fuse_qkv": options.fuse_qkv,
                    "last_mlp_rows": options.last_mlp_rows,
                    "fuse_gate_up": options.fuse_gate_up,
                    "split_products": options.split_products,
                    "loss_kernel": options.loss_kernel,
                    "dropout_kernel": options.dropout_kernel,
                    "profile_steps": 2 if options.profile_dir else 0,
                    "parallel": options.parallel,
                    "deepspeed_config": options.deepspeed_config,
                    "tensorboard": False,
                    "log_every_steps": 10**6,
                },
                "output": str(Path(folder) / "run"),
            },
            source="bench train options",
        )
        ctx.progress(f"train: {options.model}, {options.mode} {options.seq_len}-token sequences")
        # One global batch of packs, every step: the loss of the same data must fall if the step learns.
        global_batch = options.micro_batch_size * options.grad_accum_steps * runtime.world_size
        summary = train(cfg, runtime, save_adapter=False, quiet=True, max_packs=global_batch)
        if options.profile_dir and runtime.is_main:
            shutil.copytree(Path(cfg.output) / PROFILE, options.profile_dir, dirs_exist_ok=True)
        if options.summary_to and runtime.is_main:
            write_text_atomic(Path(options.summary_to), json.dumps(summary, indent=2) + "\n")
    return [_measurement(summary, options, runtime)] if runtime.is_main else []


def _measurement(summary: dict[str, Any], options: TrainBenchOptions, runtime: Any) -> Measurement:
    steps = summary["steps"]
    timed = steps[options.warmup_steps :]
    norms = [s["grad_norm"] for s in steps]
    if not all(math.isfinite(n) and n > 0 for n in norms):
        raise RunError(
            f"train: gradient norms {norms} are not all finite and non-zero: the step does not train"
        )
    first, last = steps[0]["loss"], statistics.fmean(s["loss"] for s in steps[-2:])
    if not last < first:
        raise RunError(
            f"train: the loss did not fall ({first:.4f} at step 1, {last:.4f} at the end): "
            "the step does not learn"
        )
    rates = [s["tokens_per_s_per_gpu"] for s in timed]
    mfus = [s["mfu"] for s in timed if s["mfu"] is not None]
    return Measurement(
        name="train",
        scope="cluster",
        params={
            "model": options.model,
            "mode": options.mode,
            "seq_len": options.seq_len,
            "micro_batch_size": options.micro_batch_size,
            "grad_accum_steps": options.grad_accum_steps,
            "lora_rank": options.lora_rank,
            "lora_dropout": options.lora_dropout,
            "target_modules": options.target_modules,
            "activation_checkpointing": options.activation_checkpointing,
            "attention": summary["attention"],  # what ran, after auto
            "row_kernel": summary["row_kernel"],
            "varlen_kernel": summary["varlen_kernel"],
            "kernels": summary["kernels"],
            "fused_loss": summary["fused_loss"],
            "loss_kernel": summary["loss_kernel"],
            "compile": options.compile,
            "precision": summary["precision"],
            "fused_qkv": summary["fused_qkv"],  # what ran, after auto
            "last_mlp_rows": summary["last_mlp_rows"],
            "fused_gate_up": summary["fused_gate_up"],
            "split_products": summary["split_products"],
            "dropout_kernel": summary["dropout_kernel"],
            "parallel": options.parallel,
            "world_size": runtime.world_size,
            "trainable_params": summary["trainable_params"],
            "packing_efficiency": summary["packing_efficiency"],
        },
        metrics={
            "tokens_per_s_per_gpu": statistics.median(rates),
            "tokens_per_s_per_gpu_min": min(rates),
            "tokens_per_s_per_gpu_max": max(rates),
            "mfu_pct": 100 * statistics.median(mfus) if mfus else None,
            "step_ms": 1e3 * statistics.median(s["step_s"] for s in timed),
            "peak_memory_gib": summary["peak_memory_gib"],
            "loss_first": first,
            "loss_last": last,
        },
        samples=len(timed),
    )


register(
    Benchmark(
        name="train",
        summary="LoRA fine-tune step (Qwen2-7B shape on GPU): tokens/s per GPU, MFU, peak memory; must train",
        options=TrainBenchOptions,
        defaults=_defaults,
        run=run_train,
        # data made, then the trainer's own phases (one per step, gpuval.deadline); this one's clock starts
        # again after each of them
        expected_s=lambda options, runtime: FIRST_STEP_S,
        metrics=(
            MeasurementDecl(
                "train",
                (
                    Metric("tokens_per_s_per_gpu", "tokens/s", +1, description="tokens/s per GPU", plot=True),
                    Metric("mfu_pct", "%", +1, description="model FLOPs utilisation"),
                    Metric("step_ms", "ms", -1, description="optimizer step time"),
                    Metric("peak_memory_gib", "GiB", -1, description="peak GPU memory"),
                    # a property of the data and seed, not of the machine: never compared
                    Metric("loss_first", "nats", -1, compared=False, description="loss at step 1"),
                    Metric("loss_last", "nats", -1, compared=False, description="loss at the end"),
                ),
                identity=("model", "mode", "seq_len"),
                view="throughput",
            ),
        ),
    )
)

"""Training throughput: the very step `gpuval finetune train` runs, timed on synthetic data.

The benchmark writes synthetic Glaive-format conversations (prepared, one file per rank, the same on every
rank), builds a fine-tune config from its options and calls `gpuval.finetune.trainer.train` for
`untimed_steps + steps` optimizer steps on one global batch of sequences, the same every step; the first
`untimed_steps` are not counted (no learning-rate warm-up: the LR is constant). Every step is timed with
CUDA events on a GPU (trainer.py), so this is the step of a real fine-tune, not a stand-in. Its `lora`,
`step` and `experimental` options are the fine-tune config's own sections (finetune/config.py), passed to
the trainer as they are; `--set step.compile=false` changes that one key and keeps the other defaults.

On a GPU the defaults are gpuval's fastest measured step (benchmarks/NOTES.md): micro-batch 3, varlen
attention (cuDNN's causal kernel for whole-document rows on Hopper), a fused linear + cross-entropy
(gpuval's chunked one; `loss_kernel=liger` runs Liger's), compiled decoder layers, q/k/v fused, no
activation checkpointing;
`--set step.compile=false`, `step.kernels=torch`, `step.attention=sdpa`, `step.fuse_qkv=false`,
`step.activation_checkpointing=true` take them away, `experimental.fuse_gate_up=true` adds the slower fused
gate/up, and `--set step.precision=fp8-base` runs the frozen base's products in FP8 (Hopper).

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
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from gpuval import jsonl
from gpuval.bench.registry import Benchmark, Context, register
from gpuval.config import Number
from gpuval.deadline import FIRST_STEP_S
from gpuval.errors import RunError
from gpuval.finetune.config import ExperimentalSettings, LoraSettings, ShardingSettings, StepSettings
from gpuval.metrics import MeasurementDecl, Metric
from gpuval.results import Measurement
from gpuval.timing import MAX_CALLS

RECORD_SEED = 5  # synthetic data: the same records on every rank and in every run


class TrainBenchOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    # Options that moved into the embedded sections (issue 35): an unknown-key error names the new place.
    moved_keys: ClassVar[dict[str, str]] = {
        **{key: f"step.{key}" for key in StepSettings.model_fields if key != "fp8"},
        **{f"lora_{key}": f"lora.{key}" for key in LoraSettings.model_fields},
        "target_modules": "lora.target_modules",
        **{f"fp8_{key}": f"step.fp8.{key}" for key in ("fast_accum", "input_grad", "exclude")},
        "warmup_steps": "untimed_steps",
        "fuse_gate_up": "experimental.fuse_gate_up",
    }

    model: str = Field(description="model folder, hub name, or shape ('qwen2-7b-shape': random weights)")
    tokenizer: str | None = Field("tiny", description="tokenizer (a shape has none; tiny ids fit any vocab)")
    # The upper bounds are far past any measurement (hours of steps, a million-token sequence): a larger
    # value is a typo that would run for days or fail allocating, not a step to time.
    seq_len: StrictInt = Field(ge=16, le=2**20, description="tokens per sequence")
    mode: Literal["packed", "fixed"] = Field("packed", description="packed documents or one per sequence")
    records: StrictInt = Field(ge=1, le=10**6, description="synthetic conversations to draw sequences from")
    steps: StrictInt = Field(ge=1, le=MAX_CALLS, description="timed optimizer steps")
    untimed_steps: StrictInt = Field(
        ge=0,
        le=MAX_CALLS,
        description="untimed steps first (allocator, kernels, autotuning); not a learning-rate warm-up",
    )
    micro_batch_size: StrictInt = Field(1, ge=1, le=1024, description="sequences per forward per GPU")
    grad_accum_steps: StrictInt = Field(1, ge=1, le=1024, description="micro-batches per optimizer step")
    lr: Number = Field(
        1e-4, gt=0, le=1, description="constant; large enough that a few steps visibly lower the loss"
    )
    dtype: Literal["bfloat16", "float32"] = Field(description="base weights (bf16 on GPU)")
    parallel: Literal["ddp", "fsdp", "deepspeed"] = Field(
        "ddp", description="ddp (replicated base), fsdp (FSDP2 fully_shard) or deepspeed (deepspeed_config)"
    )
    deepspeed_config: str | None = Field(None, description="DeepSpeed JSON (parallel: deepspeed)")
    profile_dir: str | None = Field(
        None, description="PyTorch-profile two timed steps; trace.json and operators.txt go here"
    )
    profile_stack: bool = Field(False, description="the profile records the Python functions too")
    summary_to: str | None = Field(
        None, description="copy the trainer's train_summary.json, with its per-step losses, to this path"
    )
    # The fine-tune config's own sections (finetune/config.py); the bench's defaults differ where a
    # measurement needs it: no adapter dropout, activations kept, eager layers unless _defaults compiles.
    lora: LoraSettings = Field(default_factory=lambda: LoraSettings(dropout=0.0))
    step: StepSettings = Field(
        default_factory=lambda: StepSettings(activation_checkpointing=False, compile=False)
    )
    sharding: ShardingSettings = ShardingSettings()
    experimental: ExperimentalSettings = ExperimentalSettings()


def _defaults(quick: bool, on_gpu: bool) -> dict[str, Any]:
    # The sections' bench defaults, merged key by key with --set (registry.make_options): `--set
    # step.fuse_qkv=false` keeps activations and compiling as below.
    sections = {
        "lora": {"dropout": 0.0},  # the recipe's is 0.05; the measured step's products are the same
        "step": {"activation_checkpointing": False, "compile": on_gpu},
    }
    return {**sections, **_sizes(quick, on_gpu)}


def _sizes(quick: bool, on_gpu: bool) -> dict[str, Any]:
    if on_gpu:  # issue 5: Qwen2-7B + LoRA r64 q/k/v/o at 4096 tokens, gpuval's fastest measured settings
        return {
            "model": "qwen2-7b-shape",
            "seq_len": 4096,
            "micro_batch_size": 3,  # fits 80 GB, no checkpointing, with the fused loss (benchmarks/NOTES.md)
            "records": 3000,
            "steps": 4 if quick else 10,
            "untimed_steps": 2 if quick else 3,
            "dtype": "bfloat16",
        }
    return {
        "model": "tiny",
        "seq_len": 512,
        "records": 200,
        "steps": 3 if quick else 6,
        "untimed_steps": 1,
        "dtype": "float32",
        "lr": 2e-3,
    }


def synthetic_conversations(options: TrainBenchOptions) -> list[dict[str, Any]]:
    """Prepared conversations from `finetune synth`'s generator; in fixed mode, their turns joined until
    each conversation is longer than a sequence can hold (training cuts it to exactly seq_len)."""
    from gpuval.finetune.data.prepare import SourceRecord, convert_all
    from gpuval.finetune.data.synth import synth_records

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
    from gpuval.finetune.trainer import PROFILE, SUMMARY_JSON, train

    runtime = ctx.runtime
    ctx.progress("train: synthetic data")
    with _scratch() as folder:
        data = Path(folder) / "train.jsonl"
        data.write_text(jsonl.dump_lines(synthetic_conversations(options)), encoding="utf-8")
        cfg = finetune_config_from_dict(
            {
                "model": options.model,
                "tokenizer": options.tokenizer,
                "dtype": options.dtype,
                "lora": options.lora.model_dump(),
                "data": {"train": str(data), "max_seq_len": options.seq_len},
                "train": {
                    "micro_batch_size": options.micro_batch_size,
                    "grad_accum_steps": options.grad_accum_steps,
                    "max_steps": options.untimed_steps + options.steps,
                    "parallel": options.parallel,
                    "deepspeed_config": options.deepspeed_config,
                    "optim": {"lr": options.lr, "warmup_steps": 0},
                    "log": {
                        "tensorboard": False,
                        "every_steps": 10**6,
                        "profile_steps": 2 if options.profile_dir else 0,
                        "profile_stack": options.profile_stack,
                    },
                    "step": options.step.model_dump(),
                    "sharding": options.sharding.model_dump(),
                    "experimental": options.experimental.model_dump(),
                },
                "output": str(Path(folder) / "run"),
            },
            source="bench train options",
        )
        ctx.progress(f"train: {options.model}, {options.mode} {options.seq_len}-token sequences")
        # One global batch of packs, every step: the loss of the same data must fall if the step learns.
        global_batch = cfg.train.global_batch(runtime.world_size)
        summary = train(cfg, runtime, save_adapter=False, quiet=True, max_packs=global_batch)
        if options.profile_dir and runtime.is_main:
            shutil.copytree(Path(cfg.output) / PROFILE, options.profile_dir, dirs_exist_ok=True)
        if options.summary_to and runtime.is_main:  # the per-step losses, for a benchmark comparing them
            Path(options.summary_to).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(cfg.output) / SUMMARY_JSON, options.summary_to)
    return [_measurement(summary, options, runtime)] if runtime.is_main else []


def _measurement(summary: dict[str, Any], options: TrainBenchOptions, runtime: Any) -> Measurement:
    from gpuval.finetune.trainer import step_summary_keys

    steps = summary["steps"]
    timed = steps[options.untimed_steps :]
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
            "lora_rank": options.lora.rank,
            "lora_dropout": options.lora.dropout,
            "target_modules": options.lora.target_modules,
            # how the step ran, after auto: the trainer's declared step keys (each part's reports)
            **{key: summary[key] for key in step_summary_keys()},
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
        # one DDP/FSDP/ZeRO job over every rank: its gradients' all-reduce goes through every node, so a node
        # that failed health would set the cluster's figure (as it would the collectives')
        crosses_nodes=True,
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

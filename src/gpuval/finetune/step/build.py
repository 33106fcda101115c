"""The training step's model, built once: the frozen base, its parts, LoRA, and the parallel wrapper.

`PARTS` is the one declared order of everything that changes the step (finetune/parts.py has their
contract; docs/step-parts.md why this order): the kernels and fusions, how the parallel mode holds the
weights (train.sharding), activation checkpointing and compiling. `build_step` loads the model and applies
them, stage by stage:

    decide every part (before loading: a refused choice costs no minutes) -> load the bare model ->
    `base` parts -> LoRA -> `lora` parts (how the weights are held, activation checkpointing) -> move to
    the device -> `adapted` parts -> `compile` (each decoder layer) -> the parallel wrapper (ddp, fsdp or
    deepspeed), which applies the `wrapped` parts once it is made
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

from gpuval.errors import UsageError
from gpuval.finetune.config import FinetuneConfig
from gpuval.finetune.model import apply_lora, load_model, ties_output_head, token_ids
from gpuval.finetune.parallel.modes import decoder_layers, make_parallel, zero_stage
from gpuval.finetune.parallel.sharding import (
    FsdpReshardPart,
    Zero3CompileWholePart,
    Zero3FusedEpiloguePart,
    Zero3LeanStepPart,
    Zero3LeavesPart,
    Zero3UnhookPart,
    Zero3WholeLoraPart,
)
from gpuval.finetune.parts import STAGES, Part, StepContext
from gpuval.finetune.step.attention import AttentionPart
from gpuval.finetune.step.compiled import CompilePart
from gpuval.finetune.step.fp8 import Fp8BasePart
from gpuval.finetune.step.fused_mlp import FusedGateUpPart
from gpuval.finetune.step.fused_qkv import FusedQkvPart
from gpuval.finetune.step.last_mlp_rows import LastMlpRows, LastMlpRowsPart
from gpuval.finetune.step.liger_ops import LigerOpsPart
from gpuval.finetune.step.loss_head import FusedLossPart, LossHead
from gpuval.finetune.step.memory import CheckpointingPart
from gpuval.finetune.step.packed_dropout import PackedDropoutPart
from gpuval.finetune.step.split_products import SplitProductsPart
from gpuval.runtime import Runtime

# The register line: everything that changes the step, in the order applied (docs/step-parts.md).
PARTS: tuple[Part, ...] = (
    # base: the bare transformers model
    LigerOpsPart(),
    AttentionPart(),
    # lora: after LoRA, before the move to the device
    FsdpReshardPart(),
    Zero3LeavesPart(),
    CheckpointingPart(),
    # adapted: after the move to the device
    PackedDropoutPart(),
    FusedQkvPart(),
    FusedGateUpPart(),
    Fp8BasePart(),
    FusedLossPart(),
    SplitProductsPart(),
    LastMlpRowsPart(),
    # compile: each decoder layer
    CompilePart(),
    # wrapped: after the parallel wrapper is made (DeepSpeed's engine), before the first forward
    Zero3WholeLoraPart(),
    Zero3UnhookPart(),
    Zero3LeanStepPart(),
    Zero3FusedEpiloguePart(),
    Zero3CompileWholePart(),
)


def _check_parts(parts: tuple[Part, ...]) -> None:
    names = [part.name for part in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"step parts: a name is registered twice in {names}")
    stages = [part.stage for part in parts]
    if stages != sorted(stages, key=STAGES.index):
        raise ValueError(f"step parts: parts must be listed by stage, in the order {STAGES}: {names}")


_check_parts(PARTS)


def part_reports() -> tuple[str, ...]:
    """The summary keys the parts declare, in PARTS order."""
    return tuple(key for part in PARTS for key in part.reports)


@dataclass
class Step:
    """The model as the loop runs it."""

    model: Any  # the PEFT model, unwrapped (its config, its adapters)
    parallel: Any  # parallel.make_parallel's wrapper: forward, backward, step, checkpoints
    ctx: StepContext  # the parts' decisions and details
    reports: dict[str, Any]  # every part's reports (summary keys)
    trainable_count: int
    loss_head: LossHead
    last_mlp: LastMlpRows | None


def step_context(cfg: FinetuneConfig, runtime: Runtime) -> StepContext:
    """What the parts decide from."""
    t = cfg.train
    on_gpu, device = runtime.on_gpu, runtime.device
    return StepContext(
        step=t.step,
        experimental=t.experimental,
        lora=cfg.lora,
        parallel=t.parallel,
        on_gpu=on_gpu,
        compiled=False,  # the compile part's decision, made first
        dtype=cfg.dtype,
        sharding=t.sharding,
        zero_stage=zero_stage(cfg),
        world_size=runtime.world_size,
        device=device,
        micro_batch_tokens=t.micro_batch_size * cfg.data.max_seq_len,
        gpu_name=torch.cuda.get_device_name(device) if on_gpu else None,
        capability=torch.cuda.get_device_capability(device) if on_gpu else None,
        tied_head=ties_output_head(cfg.model),
    )


def decide_parts(ctx: StepContext, is_main: bool) -> str:
    """Every part's decision: those whose decision parts before them read first (`decided_first`), then
    the rest in PARTS order (each may read those before it); returns the start-up line, which leaves out
    parts with nothing to do under this run's mode. Notes (a part off under this parallel mode, a missing
    package) go to stderr on the main rank even in a quiet run."""
    for part in sorted(PARTS, key=lambda part: not part.decided_first):
        ctx.decisions[part.name] = part.decide(ctx)
    if is_main:
        for decision in ctx.decisions.values():
            if decision.note:
                print(decision.note, file=sys.stderr)
    return "step parts: " + "; ".join(d.line(name) for name, d in ctx.decisions.items() if d.said)


def details_line(ctx: StepContext) -> str:
    """What the parts that changed the model say of it for the start-up line, in PARTS order."""
    return "".join(ctx.details.get(part.name, "") for part in PARTS)


def apply_parts(model: Any, ctx: StepContext, stage: str) -> dict[str, Any]:
    """Apply the parts of `stage` in PARTS order (those decided on); returns every such part's reports,
    what an off part reports included."""
    reports: dict[str, Any] = {}
    for part in PARTS:
        if part.stage != stage:
            continue
        decision = ctx.decisions[part.name]
        reports.update(part.off_report(decision))
        if decision.on:
            reports.update(part.apply(model, ctx, decision))
    return reports


def build_step(
    cfg: FinetuneConfig,
    runtime: Runtime,
    ctx: StepContext,
    dtype: torch.dtype,
    tokenizer: Any,
    max_token_id: int,
    log: Any,
) -> Step:
    """Load the model and make it the step `ctx` decided (module docstring). `max_token_id`: the largest id
    in the training data, checked against the model's vocabulary before LoRA."""
    model = load_model(cfg.model, dtype, device=runtime.device)
    model.config.use_cache = False
    reports = apply_parts(model, ctx, "base")
    if max_token_id >= model.config.vocab_size:
        raise UsageError(
            f"tokenizer '{cfg.tokenizer_source}' makes ids beyond model '{cfg.model}''s vocabulary "
            f"({model.config.vocab_size}): pair the model with its own tokenizer"
        )
    model = apply_lora(
        model,
        cfg.lora.rank,
        cfg.lora.alpha,
        cfg.lora.dropout,
        cfg.lora.target_modules,
        token_ids(tokenizer, cfg.lora.trainable_tokens),
    )
    # The parts replace modules inside the decoder layers, never the layers.
    ctx.layers = decoder_layers(model)
    reports.update(apply_parts(model, ctx, "lora"))
    for line in ctx.settled:  # what `auto` chose once the model was loaded
        log(f"step parts, settled: {line}")
    model.to(runtime.device)
    # After the move (the concatenated and FP8 weights are made on the device), before compiling.
    reports.update(apply_parts(model, ctx, "adapted"))
    reports.update(apply_parts(model, ctx, "compile"))
    trainable_count = sum(p.numel() for p in model.parameters() if p.requires_grad)

    def wrapped(engine: Any) -> None:  # called by the parallel wrapper once it is made
        reports.update(apply_parts(engine, ctx, "wrapped"))

    parallel = make_parallel(cfg.train.parallel, model, cfg, runtime, dtype, ctx, wrapped)
    return Step(
        model=model,
        parallel=parallel,
        ctx=ctx,
        reports=reports,
        trainable_count=trainable_count,
        loss_head=ctx.hooks.get("loss_head", LossHead.plain()),
        last_mlp=ctx.hooks.get("last_mlp_rows"),
    )

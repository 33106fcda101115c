"""The training step's model, built once: the frozen base, its parts, LoRA, and the parallel wrapper.

`PARTS` is the one declared order of the step's parts (parts.py has their contract; docs/step-parts.md
why this order). `build_step` loads the model and applies them:

    decide every part (before loading: a refused choice costs no minutes) -> load the bare model ->
    base parts -> LoRA -> activation checkpointing -> move to the device -> adapted parts ->
    compile each decoder layer -> the parallel wrapper (ddp, fsdp or deepspeed)
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
from gpuval.finetune.parallel.sharding import plan_sharding
from gpuval.finetune.step.attention import AttentionPart
from gpuval.finetune.step.fp8 import Fp8BasePart
from gpuval.finetune.step.fused_mlp import FusedGateUpPart
from gpuval.finetune.step.fused_qkv import FusedQkvPart
from gpuval.finetune.step.last_mlp_rows import LastMlpRows, LastMlpRowsPart
from gpuval.finetune.step.liger_ops import LigerOpsPart
from gpuval.finetune.step.loss_head import FusedLossPart, LossHead
from gpuval.finetune.step.memory import choose_checkpointing, estimate_step_memory
from gpuval.finetune.step.packed_dropout import PackedDropoutPart
from gpuval.finetune.step.parts import Decision, Part, StepContext
from gpuval.finetune.step.split_products import SplitProductsPart
from gpuval.runtime import Runtime

# The register line: every part of the step, in the order they are applied (docs/step-parts.md).
PARTS: tuple[Part, ...] = (
    LigerOpsPart(),
    AttentionPart(),
    PackedDropoutPart(),
    FusedQkvPart(),
    FusedGateUpPart(),
    Fp8BasePart(),
    FusedLossPart(),
    SplitProductsPart(),
    LastMlpRowsPart(),
)


def _check_parts(parts: tuple[Part, ...]) -> None:
    names = [part.name for part in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"step parts: a name is registered twice in {names}")
    stages = [part.stage for part in parts]
    if stages != sorted(stages, key=("base", "adapted").index):
        raise ValueError(f"step parts: base parts must come before adapted ones: {names}")


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
    reports: dict[str, Any]  # every part's reports (summary keys), and compile
    checkpointing: bool
    trainable_count: int
    loss_head: LossHead
    last_mlp: LastMlpRows | None


def step_context(cfg: FinetuneConfig, runtime: Runtime) -> StepContext:
    """What the parts decide from; the compile decision is made here, first (several parts read it)."""
    t = cfg.train
    on_gpu, device = runtime.on_gpu, runtime.device
    ctx = StepContext(
        step=t.step,
        experimental=t.experimental,
        lora=cfg.lora,
        parallel=t.parallel,
        on_gpu=on_gpu,
        compiled=False,
        dtype=cfg.dtype,
        gpu_name=torch.cuda.get_device_name(device) if on_gpu else None,
        capability=torch.cuda.get_device_capability(device) if on_gpu else None,
        tied_head=ties_output_head(cfg.model),
    )
    ctx.decisions["compile"] = _compile_decision(ctx)
    ctx.compiled = ctx.decisions["compile"].on
    return ctx


def _compile_decision(ctx: StepContext) -> Decision:
    setting = ctx.step.compile
    if setting != "auto":
        return Decision(bool(setting), bool(setting), "set")
    if not ctx.on_gpu:
        return Decision(False, False, "auto: CPU")
    if ctx.parallel == "deepspeed":
        return ctx.off_under_parallel("compile")
    return Decision(True, True, f"auto: GPU, {ctx.parallel}")


def decide_parts(ctx: StepContext, is_main: bool) -> str:
    """Every part's decision, in PARTS order (each may read those before it); returns the start-up line.
    Notes (a part off under this parallel mode, a missing package) go to stderr on the main rank even in a
    quiet run."""
    for part in PARTS:
        ctx.decisions[part.name] = part.decide(ctx)
    if is_main:
        for decision in ctx.decisions.values():
            if decision.note:
                print(decision.note, file=sys.stderr)
    return "step parts: " + "; ".join(d.line(name) for name, d in ctx.decisions.items())


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
    sharding = plan_sharding(
        cfg.train.sharding, cfg.train.parallel, zero_stage(cfg), model, decoder_layers(model), runtime
    )
    checkpointing, checkpointing_why = _checkpointing(
        cfg, model, runtime, dtype, ctx.decisions["fused_loss"].on, sharding.weights_sharded
    )
    log(f"activation checkpointing: {'on' if checkpointing else 'off'} ({checkpointing_why})")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(runtime.device)
    # After the move (the concatenated and FP8 weights are made on the device), before compiling; the parts
    # replace modules inside the decoder layers, never the layers.
    ctx.layers = decoder_layers(model)
    reports.update(apply_parts(model, ctx, "adapted"))
    if ctx.compiled:  # per decoder layer, before FSDP wraps them (as torchtitan does)
        for layer in ctx.layers:
            layer.compile()
    reports["compile"] = ctx.compiled
    trainable_count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    parallel = make_parallel(cfg.train.parallel, model, cfg, runtime, dtype, sharding)
    return Step(
        model=model,
        parallel=parallel,
        ctx=ctx,
        reports=reports,
        checkpointing=checkpointing,
        trainable_count=trainable_count,
        loss_head=ctx.hooks.get("loss_head", LossHead.plain()),
        last_mlp=ctx.hooks.get("last_mlp_rows"),
    )


def _checkpointing(
    cfg: FinetuneConfig, model: Any, runtime: Runtime, dtype: Any, fused: bool, sharded: bool
) -> tuple[bool, str]:
    """Whether to recompute activations, and why: the config's choice, or for `auto` the step's memory
    estimate (finetune/step/memory.py) against this GPU's; `sharded`: each rank holds 1/world of the weights
    (the sharding plan's `weights_sharded`)."""
    t = cfg.train
    if t.step.activation_checkpointing != "auto" or not runtime.on_gpu:
        return choose_checkpointing(t.step.activation_checkpointing, None, None)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    estimate = estimate_step_memory(
        model.config,
        base_parameters=sum(p.numel() for p in model.parameters()) - trainable,
        trainable_parameters=trainable,
        tokens_per_micro_batch=t.micro_batch_size * cfg.data.max_seq_len,
        dtype_bytes=torch.tensor([], dtype=dtype).element_size(),
        fused_loss=fused,
        weight_shards=runtime.world_size if sharded else 1,
    )
    return choose_checkpointing(
        "auto", estimate, torch.cuda.get_device_properties(runtime.device).total_memory
    )

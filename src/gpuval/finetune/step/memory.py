"""How much GPU memory a LoRA training step needs without activation checkpointing, to choose it.

`train.step.activation_checkpointing: auto` keeps activations (the fast path: no recomputation in backward)
when the step's estimate fits the GPU with a margin, and recomputes them otherwise. The estimate and the
figure it was checked against are in docs/finetune-memory.md; in short, per rank:

- frozen base weights in the training dtype (sharded over the ranks under FSDP/ZeRO-3);
- LoRA weights in float32 with their gradients and AdamW's two moments: 16 bytes per trainable parameter;
- saved activations per token per decoder layer, in the training dtype: about 12 hidden-size vectors
  (layer inputs, norms, q/k/v/attention output with LoRA dropout copies, residuals), two key/value-size
  vectors and 3 intermediate-size vectors (SwiGLU's gate, up and their product);
- the logits when the loss is not fused: the output in the training dtype, its float32 copy in the
  cross-entropy and the float32 gradient (10 bytes per token per vocabulary entry in bf16).

It deliberately overestimates (it counts what compiled layers fuse away), so `auto` errs towards
recomputing, which is slower but never runs out of memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from gpuval.finetune.parts import Decision, Part, StepContext
from gpuval.finetune.step.linear_ce import DEFAULT_CHUNK as LOSS_CHUNK

GIB = 2**30
MARGIN = 0.9  # the share of the GPU's memory the estimate may take (allocator slack, CUDA context, NCCL)


@dataclass(frozen=True)
class StepMemory:
    weights: int
    trainable: int
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return self.weights + self.trainable + self.activations + self.logits


def estimate_step_memory(
    config: Any,
    base_parameters: int,
    trainable_parameters: int,
    tokens_per_micro_batch: int,
    dtype_bytes: int,
    fused_loss: bool,
    weight_shards: int = 1,
) -> StepMemory:
    """The peak of one rank's step without activation checkpointing. `config`: the model's (hidden_size,
    intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size);
    `weight_shards`: ranks the frozen weights are split over (FSDP, ZeRO-3), 1 under DDP."""
    hidden, inter = config.hidden_size, config.intermediate_size
    kv = hidden // config.num_attention_heads * config.num_key_value_heads
    per_token_layer = (12 * hidden + 2 * kv + 3 * inter) * dtype_bytes
    activations = per_token_layer * tokens_per_micro_batch * config.num_hidden_layers
    if fused_loss:  # one chunk's logits and their gradient at a time (linear_ce.py)
        logits = min(tokens_per_micro_batch, LOSS_CHUNK) * config.vocab_size * 2 * dtype_bytes
    else:
        logits = tokens_per_micro_batch * config.vocab_size * (dtype_bytes + 4 + 4)
    return StepMemory(
        weights=base_parameters * dtype_bytes // max(1, weight_shards),
        trainable=trainable_parameters * 16,
        activations=activations,
        logits=logits,
    )


def choose_checkpointing(
    setting: bool | str, estimate: StepMemory | None, gpu_bytes: int | None
) -> tuple[bool, str]:
    """(checkpointing on?, the reason for the log). An explicit true/false is kept; `auto` recomputes only
    when the estimate does not fit MARGIN of the GPU's memory, and never on a CPU (memory is the host's)."""
    if setting is not True and setting is not False and setting != "auto":
        raise ValueError(f"activation_checkpointing: {setting!r} is not true, false or auto")
    if setting != "auto":
        return bool(setting), "set in the config"
    if estimate is None or gpu_bytes is None:
        return False, "auto: no GPU, activations kept"
    need, have = estimate.total / GIB, gpu_bytes / GIB
    if estimate.total <= MARGIN * gpu_bytes:
        return False, f"auto: the step needs about {need:.1f} GiB without it, {have:.1f} GiB here"
    return (
        True,
        f"auto: the step would need about {need:.1f} GiB without it, over {MARGIN:.0%} of {have:.1f} GiB",
    )


class CheckpointingPart(Part):
    """`train.step.activation_checkpointing`: recompute each decoder layer's activations in backward.

    Stage `lora`: after LoRA and the sharding parts (the estimate counts the trainable weights and reads
    `ctx.weights.sharded`), before the move to the device. A set value is kept; `auto` is off on a CPU and
    on a GPU is settled here from the step's estimate (`estimate_step_memory`) against this GPU's memory,
    which needs the loaded model; it reads the fused loss's decision (no full logits). Reports
    `activation_checkpointing` (bool)."""

    name = "activation_checkpointing"
    stage = "lora"
    reports: ClassVar[dict[str, Any]] = {"activation_checkpointing": False}

    def decide(self, ctx: StepContext) -> Decision:
        setting = ctx.step.activation_checkpointing
        if setting != "auto" or not ctx.on_gpu:
            on, why = choose_checkpointing(setting, None, None)
            return Decision(on, on, why)
        return Decision(True, "auto", "auto: from the step's memory estimate once the model is loaded")

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        if decision.choice == "auto":
            trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
            estimate = estimate_step_memory(
                model.config,
                base_parameters=sum(p.numel() for p in model.parameters()) - trainable,
                trainable_parameters=trainable,
                tokens_per_micro_batch=ctx.micro_batch_tokens,
                dtype_bytes=getattr(torch, ctx.dtype).itemsize,
                fused_loss=ctx.decisions["fused_loss"].on,
                weight_shards=ctx.world_size if ctx.weights.sharded else 1,
            )
            gpu_bytes = torch.cuda.get_device_properties(ctx.device).total_memory
            on, why = choose_checkpointing("auto", estimate, gpu_bytes)
            decision = Decision(on, on, why)
            ctx.settle(self.name, decision)
        if decision.on:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return {"activation_checkpointing": decision.on}

"""The loss head: summed next-token cross-entropy over the labelled rows (LossHead), plain or fused with the
output head's product (`train.step.kernels` liger or liger-loss, `train.step.loss_kernel`), and the fused
loss's part (FusedLossPart)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gpuval.errors import UsageError
from gpuval.finetune.parts import Decision, Part, StepContext
from gpuval.finetune.step.linear_ce import linear_cross_entropy
from gpuval.finetune.template import IGNORE_INDEX


@dataclass
class LossHead:
    """Summed next-token cross-entropy of a micro-batch from the model's output, over the labelled rows only
    (`label_rows`): about half of a fine-tune's tokens are prompt, system and tool text that no loss reads.

    Plain: the model returns logits and F.cross_entropy reduces the labelled rows in float32 (float64 logits
    in float64). Fused: the model's output head is replaced by an identity, so the model returns the final
    hidden states, and a fused linear cross-entropy (`train.step.loss_kernel`: gpuval's chunked one,
    linear_ce.py, or Liger's) applies the head weight chunk by chunk to the labelled rows alone: the output
    head's products (2 × 152,064 × 3,584 FLOPs per row for Qwen2-7B, forward and again for the
    gradient) are spent on no row the loss ignores."""

    fused: Any = None  # (weight, hidden, targets) -> summed loss: linear_ce's or Liger's; None: plain
    weight: torch.Tensor | None = None  # the output head's weight, for the fused loss

    @classmethod
    def plain(cls) -> LossHead:
        return cls()

    @classmethod
    def fuse(cls, causal_lm: torch.nn.Module, kernel: str = "chunked") -> LossHead:
        """Take the output head out of `causal_lm` (a transformers CausalLM, unwrapped) for the fused loss:
        `kernel` chunked (linear_ce.py, gpuval's own) or liger (Liger's fused linear cross-entropy)."""
        head = causal_lm.get_output_embeddings()
        if type(head) is not torch.nn.Linear or head.bias is not None or head.weight.requires_grad:
            raise UsageError(
                "train.step.kernels=liger: the fused loss needs a frozen, bias-free nn.Linear output head; "
                "set train.step.kernels=torch"
            )
        causal_lm.set_output_embeddings(torch.nn.Identity())
        if kernel == "chunked":  # called as Liger's loss is: (weight, hidden, targets)
            return cls(fused=lambda w, h, t: linear_cross_entropy(h, w, t), weight=head.weight)
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        loss = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")
        return cls(fused=loss, weight=head.weight)

    def __call__(
        self, output: torch.Tensor, rows: torch.Tensor | None, targets: torch.Tensor
    ) -> torch.Tensor:
        """`output`: logits `(B, S, V)`, or hidden states `(B, S, d)` when fused; `rows`, `targets`: from
        `label_rows` of the micro-batch's labels, on the output's device. `rows` None: `output` holds the
        labelled rows alone already, in order (the model was given `logits_to_keep=rows`)."""
        if targets.numel() == 0:  # no target in the micro-batch: a zero that still reaches the graph
            return output.sum() * 0
        picked = output.flatten(0, 1) if rows is None else output.flatten(0, 1).index_select(0, rows)
        if self.fused is not None:
            return self.fused(self.weight, picked, targets)
        # float32 for bf16 and float32 logits; float64 ones stay float64 (the tests' exact reference, as in
        # linear_ce.py)
        return F.cross_entropy(
            picked.to(torch.promote_types(picked.dtype, torch.float32)), targets, reduction="sum"
        )


class FusedLossPart(Part):
    """Fused loss head: the output head's product and the cross-entropy as one chunked kernel, on the
    labelled rows alone (LossHead.fuse).

    Applies when `train.step.kernels` resolved to liger or liger-loss (the liger_ops part's decision: auto on
    a GPU), without `lora.trainable_tokens`, under every parallel mode where the head's weight is its own:
    the part takes the head out of the model before the parallel wrapper sees it, so FSDP2 and ZeRO-3 leave
    that weight whole on every rank (a frozen copy, 1.1 GB in bf16 for Qwen2-7B, where the full logits it
    spares are 7.5 GB at 3 x 4,096 tokens). A head tied to the input embeddings (`tie_word_embeddings`) stays
    in the model through the embeddings, so FSDP2 and ZeRO-3 would shard it: off there, and said so. An
    explicit `train.step.loss_kernel` with no fused loss to choose for is a UsageError.
    Changes: takes the output head out of the model (an identity in its place), so the model returns the
    final hidden states; the loop's loss head (`ctx.hooks["loss_head"]`) applies the head weight.
    Reports `fused_loss` and `loss_kernel` (chunked or liger; None when off).
    Order: after the liger_ops part (it reads its decision), after the move to the device (stage adapted);
    activation checkpointing's memory estimate reads its decision (no full logits)."""

    name = "fused_loss"
    stage = "adapted"
    reports = {"fused_loss": False, "loss_kernel": None}

    def decide(self, ctx: StepContext) -> Decision:
        kernels = ctx.decisions["liger_ops"].choice
        sharded_head = ctx.tied_head and ctx.parallel != "ddp"
        fusable = kernels.startswith("liger") and not sharded_head and not ctx.lora.trainable_tokens
        if ctx.step.loss_kernel != "auto" and not fusable:  # a choice that would be silently ignored
            raise UsageError(
                f"train.step.loss_kernel={ctx.step.loss_kernel} chooses the fused loss's kernel, and this "
                f"run has no fused loss (it needs train.step.kernels liger or liger-loss, here {kernels}, "
                "no lora.trainable_tokens, and under fsdp or deepspeed an output head not tied to the "
                "input embeddings): set train.step.loss_kernel=auto"
            )
        choice = "liger" if ctx.step.loss_kernel == "liger" else "chunked"
        if not kernels.startswith("liger"):
            return Decision(False, False, f"kernels {kernels}")
        if sharded_head:
            return ctx.off_under_parallel(
                self.name, f": the output head is tied to the input embeddings, which {ctx.parallel} shards"
            )
        if ctx.lora.trainable_tokens:
            return Decision(False, False, "lora.trainable_tokens train the embedding rows")
        return Decision(True, choice, f"kernels {kernels}, {ctx.parallel}")

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        ctx.hooks["loss_head"] = LossHead.fuse(model.get_base_model(), decision.choice)
        return {"fused_loss": True, "loss_kernel": decision.choice}

"""A toy step part, the whole of it in one file (issue 52's must-show): it scales the tiny model's input
embeddings after LoRA, says so in the start-up line and reports the factor in the summary. Registering it is
one line (step.PARTS + (ToyScalePart(),)); the training loop is not touched."""

from __future__ import annotations

from typing import Any

import torch

from gpuval.finetune.parts import Decision, Part, StepContext


class ToyScalePart(Part):
    """Scales the input embeddings by 2 (on a CPU only: a toy). Reports `toy_scale` (1.0 when off)."""

    name = "toy_scale"
    stage = "adapted"
    reports = {"toy_scale": 1.0}

    def decide(self, ctx: StepContext) -> Decision:
        if ctx.on_gpu:
            return Decision(False, False, "a toy: CPU only")
        return Decision(True, 2.0, "a toy: CPU")

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(decision.choice)
        ctx.details[self.name] = f" | toy: embeddings x{decision.choice:g}"
        return {"toy_scale": decision.choice}

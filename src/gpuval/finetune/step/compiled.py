"""`train.step.compile`: each decoder layer compiled with torch.compile (`auto`: on a GPU under ddp or fsdp).

Per decoder layer, as torchtitan does (`apply_compile` in its parallelize step): after every part that
changes modules inside the layers (their wrapped forwards are what is traced), before the parallel wrapper
(FSDP2 shards the compiled layers). Under deepspeed `auto` is off: compiled under ZeRO-3's parameter hooks
the step ran at 27 % of one GPU against 39 % eager (docs/step-parts.md). Several parts' decisions read
whether the layers will be compiled (fused dropout, the Liger kernels, split products), so this part
decides first and leaves its choice in `ctx.compiled`. Reports `compile` (bool).
"""

from __future__ import annotations

from typing import Any, ClassVar

from gpuval.finetune.parts import Decision, Part, StepContext


class CompilePart(Part):
    name = "compile"
    stage = "compile"
    reports: ClassVar[dict[str, Any]] = {"compile": False}
    decided_first = True

    def decide(self, ctx: StepContext) -> Decision:
        setting = ctx.step.compile
        if setting != "auto":
            decision = Decision(bool(setting), bool(setting), "set")
        elif not ctx.on_gpu:
            decision = Decision(False, False, "auto: CPU")
        elif ctx.parallel == "deepspeed":
            decision = ctx.off_under_parallel(self.name)
        else:
            decision = Decision(True, True, f"auto: GPU, {ctx.parallel}")
        ctx.compiled = decision.on
        return decision

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        for layer in ctx.layers:
            layer.compile()
        return {"compile": True}

"""Liger-Kernel's RMSNorm, SwiGLU and RoPE in the model (`train.step.kernels`), and its part (LigerOpsPart).

Kernels (`train.step.kernels`)
- `liger`: Liger-Kernel (linkedin/Liger-Kernel, as TRL/Axolotl's `use_liger_kernel`) RMSNorm, SwiGLU and
  RoPE in the model, and its fused linear + cross-entropy for the loss: the output head's logits (152,064
  per token for Qwen2) are computed and reduced chunk by chunk and never exist in full. The fused loss needs
  the whole output-head weight on the rank, so it is used with `train.parallel: ddp` only (FSDP and ZeRO-3
  shard it); the other kernels work with all three.
- `liger-loss`: the fused linear + cross-entropy alone (with `train.step.compile`, which fuses the rest). With
  gpuval's own loss kernel (the default) it needs no Liger at all.
- `torch`: transformers' own modules and `F.cross_entropy` over the full logits.
- `auto`: on a GPU, liger-loss with `train.step.compile`, else liger where the package is installed and
  liger-loss where not; torch on a CPU.

Which fused linear + cross-entropy runs is `train.step.loss_kernel`: gpuval's chunked one by default
(linear_ce.py: the same computation without Liger's host reads, in larger chunks), or Liger's.
"""

from __future__ import annotations

from typing import Any

from gpuval.errors import UsageError
from gpuval.finetune.parts import Decision, Part, StepContext


def _kernels(setting: str, on_gpu: bool, compiled: bool, loss_kernel: str) -> str:
    """`liger`, `liger-loss` or `torch` for `train.step.kernels`, with `train.step.loss_kernel`. auto on a
    GPU: liger-loss when the layers are compiled (compiling fuses the rest: measured faster,
    benchmarks/NOTES.md), else liger where Liger-Kernel is installed and liger-loss where it is not; torch on
    a CPU. The fused loss of liger-loss and liger is gpuval's own (linear_ce.py) unless `loss_kernel` is
    liger, so only Liger's model kernels (liger) and Liger's loss need the package."""
    available = on_gpu and _liger_installed()
    if loss_kernel == "liger" and setting != "torch" and not available:
        why = "runs on CUDA GPUs only" if not on_gpu else "is not installed: pip install 'gpuval[gpu]'"
        raise UsageError(f"train.step.loss_kernel=liger: Liger-Kernel {why}; set train.step.loss_kernel=auto")
    if setting == "auto":
        if not on_gpu:
            return "torch"
        return "liger" if available and not compiled else "liger-loss"
    if setting == "liger" and not available:
        why = "runs on CUDA GPUs only" if not on_gpu else "is not installed: pip install 'gpuval[gpu]'"
        raise UsageError(
            f"train.step.kernels=liger: Liger-Kernel {why}; set train.step.kernels=liger-loss or torch"
        )
    return setting


MISSING_LIGER = (
    "kernels: Liger-Kernel is not installed: RMSNorm, SwiGLU and RoPE in these uncompiled layers are "
    "transformers' own (slower); pip install 'gpuval[gpu]'"
)


def _liger_installed() -> bool:
    try:
        import liger_kernel.transformers  # noqa: F401
    except ImportError:
        return False
    return True


def apply_liger(model: Any) -> None:
    """Liger's RMSNorm, SwiGLU and RoPE in a transformers model (by model type, as the HF Trainer applies
    them); the loss is separate (loss_head.FusedLossPart)."""
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(
        model=model,
        rope=True,
        rms_norm=True,
        swiglu=True,
        cross_entropy=False,
        fused_linear_cross_entropy=False,
    )


class LigerOpsPart(Part):
    """Liger ops: Liger-Kernel's RMSNorm, SwiGLU and RoPE in the model (`train.step.kernels: liger`).

    Decides `train.step.kernels` for the whole step (liger, liger-loss or torch: module docstring), which
    the fused loss part reads; applies only when it resolves to liger: on a GPU with Liger-Kernel installed,
    by auto with eager layers (compiled layers fuse these ops themselves). auto on a GPU without the package
    says so on stderr (it costs speed). An explicit liger (or loss_kernel liger) that cannot run here is a
    UsageError.
    Changes: transformers' modules for Liger's, by model type, as the HF Trainer does.
    Reports `kernels` (as resolved, also when off).
    Order: first, on the bare model (stage base): it patches transformers' modules before LoRA wraps any."""

    name = "liger_ops"
    stage = "base"
    reports = {"kernels": lambda decision: decision.choice}

    def decide(self, ctx: StepContext) -> Decision:
        setting = ctx.step.kernels
        choice = _kernels(setting, ctx.on_gpu, ctx.compiled, ctx.step.loss_kernel)
        note = None
        if setting != "auto":
            why = "set"
        elif not ctx.on_gpu:
            why = "auto: CPU"
        elif ctx.compiled:
            why = "auto: compiled layers fuse these ops"
        elif choice == "liger":
            why = "auto: GPU, eager layers"
        else:
            why, note = "auto: Liger-Kernel is not installed", MISSING_LIGER
        return Decision(choice == "liger", choice, why, note=note)

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        apply_liger(model)
        return {"kernels": decision.choice}

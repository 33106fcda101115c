"""The MLP's gate and up projections as one product (`train.experimental.fuse_gate_up`, off by default: on
one H100 it made the bf16 step 0.7 % slower and the FP8 step about 4 % slower, benchmarks/NOTES.md items 9
and 10; its input gradient as one batched product over the pair instead measured the same, item 13).

transformers' Qwen2MLP (and Llama-style MLPs, and Liger's SwiGLU MLP) compute
`down_proj(act(gate_proj(x)) * up_proj(x))`: two products over the same input. With LoRA on attention only
both weights are frozen, so one MLP can compute

    gate, up = split(x [W_gate; W_up]ᵀ)          one product of 2 × intermediate columns (2 × 18,944)

which reads x once, and in the backward the input gradient is one product of inner dimension
2 × intermediate, `[g_gate, g_up] [W_gate; W_up]`, instead of two products and their sum. Nothing else
changes: no dropout, no adapter, the same sums term by term, so the fused MLP computes what the two
products compute (up to the order of float additions inside one product).

How it plugs in without copying transformers' MLP code: `gate_proj` and `up_proj` become `GateUpHalf`s
(not bare `nn.Linear`s, so fp8.convert_frozen_linears leaves them alone): `gate_proj(x)` computes both
halves and keeps the up half, which `up_proj(x)` returns next. MLPs call them in the order gate, up on the
same input; any other call is an error, never a silently wrong result. Their weights become views into the
concatenated one (no second copy) under the same names, so the state dict is unchanged; with
`train.step.precision: fp8-base` the concatenated weight is quantised once (fp8.Fp8Linear), x is quantised
once per MLP, and the parts hold no weight, as fp8.convert_frozen_linears would have left them.

An MLP whose gate or up projection carries a LoRA adapter (`lora.target_modules: all-linear`) is left as
it is: its base product is PEFT's to run.

The two halves are column slices of one output, not contiguous tensors. In compiled layers (the GPU
default) the SiLU-and-multiply that reads them is inductor's own pointwise kernel, which takes strides;
Liger's SwiGLU (`train.step.kernels: liger`, eager layers) copies each half to contiguous memory first
(liger-kernel 0.8.5, `ensure_contiguous`): correct, at the cost of those two copies.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch

from gpuval.errors import UsageError
from gpuval.finetune.parts import Decision, Part, StepContext
from gpuval.finetune.step.fp8 import fp8_options, fused_base
from gpuval.finetune.step.fused_qkv import concatenate_linears

PROJECTIONS = ("gate_proj", "up_proj")


class FusedGateUp:
    """One MLP's fused gate/up product (module docstring). Not an nn.Module: the parts are the model's
    modules; this holds the concatenated base and the up half between the two calls."""

    def __init__(self, base: torch.nn.Module, gate_width: int) -> None:
        self.base = base  # the concatenated product: nn.Linear, or Fp8Linear with fp8-base
        self.gate_width = gate_width
        self.input: torch.Tensor | None = None  # gate_proj's input while its up half waits
        self.pending: torch.Tensor | None = None

    def gate_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            raise RuntimeError(self._order_error("gate_proj"))
        gate, up = self.base(x).split([self.gate_width, self.base.out_features - self.gate_width], dim=-1)
        self.input, self.pending = x, up
        return gate

    def up_forward(self, x: torch.Tensor) -> torch.Tensor:
        # the very tensor gate_proj had: the pending half was computed from it, and from nothing else
        if self.pending is None or x is not self.input:
            raise RuntimeError(self._order_error("up_proj"))
        up = self.pending
        self.input, self.pending = None, None
        return up

    @staticmethod
    def _order_error(called: str) -> str:
        return (
            f"fused gate/up: {called} was called out of order (expected gate_proj, then up_proj on the same "
            "input, as transformers' MLPs call them): set train.experimental.fuse_gate_up=false"
        )


class GateUpHalf(torch.nn.Module):
    """`gate_proj` or `up_proj` of a fused MLP: its half of FusedGateUp's product. Keeps the projection's
    weight (and bias) as views of the concatenated one, under the same names (none with fp8-base)."""

    def __init__(
        self, fused: FusedGateUp, name: str, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> None:
        super().__init__()
        self.fused = fused
        self.name = name
        self.weight = None if weight is None else torch.nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.gate_forward(x) if self.name == "gate_proj" else self.fused.up_forward(x)

    def extra_repr(self) -> str:
        return f"{self.name}: rows of {self.fused.base}"


def fuse_gate_up(
    model: torch.nn.Module,
    fp8: bool = False,
    fast_accum: bool = False,
    input_grad_fp8: bool = True,
    exclude: Collection[int] = frozenset(),
) -> int:
    """Fuse gate and up in every MLP whose two projections are plain frozen `nn.Linear`s over the same
    input (see `fusable`); `fp8`: the concatenated weight runs in FP8 (fp8.Fp8Linear, with `fast_accum`
    and `input_grad_fp8` as fp8.Fp8Linear.from_linear takes them) unless the id of gate_proj or up_proj is
    in `exclude` (fp8.excluded_linears). Call it after the model is on its device and before
    fp8.convert_frozen_linears and compiling. Returns how many MLPs were fused."""
    count = 0
    for mlp in list(model.modules()):
        parts = [getattr(mlp, name, None) for name in PROJECTIONS]
        if not fusable(parts):
            continue
        gate, up = parts
        concatenated = concatenate_linears([gate, up])
        kept_bf16 = any(id(p) in exclude for p in parts)
        base = fused_base(concatenated, fp8, kept_bf16, fast_accum, input_grad_fp8)
        width = gate.out_features
        fused = FusedGateUp(base, width)
        keep = base is concatenated  # FP8: the bf16 weights go, as fp8.convert_frozen_linears does
        for name, rows in (("gate_proj", slice(0, width)), ("up_proj", slice(width, None))):
            weight = concatenated.weight[rows] if keep else None  # a view: no second copy
            bias = concatenated.bias[rows] if keep and concatenated.bias is not None else None
            setattr(mlp, name, GateUpHalf(fused, name, weight, bias))
        count += 1
    return count


def fusable(parts: list[Any]) -> bool:
    """Both modules plain frozen `nn.Linear`s (no LoRA around them) with the same input size, dtype,
    device and bias-ness."""
    if not all(type(p) is torch.nn.Linear and not p.weight.requires_grad for p in parts):
        return False
    if any(p.bias is not None and p.bias.requires_grad for p in parts):
        return False
    return (
        len({p.in_features for p in parts}) == 1
        and len({(p.weight.dtype, p.weight.device) for p in parts}) == 1
        and len({p.bias is None for p in parts}) == 1
    )


class FusedGateUpPart(Part):
    """Fused gate/up (experimental, `train.experimental.fuse_gate_up`): the MLP's frozen gate and up
    projections as one product (module docstring; measured slower, so off by default).

    Applies when set true, or by auto on a GPU under ddp (fsdp and deepspeed shard the weights it
    concatenates: off, and said so); true under another parallel mode is a UsageError, and so is true when no
    MLP could be fused.
    Changes: `gate_proj` and `up_proj` of every MLP without LoRA on them become `GateUpHalf`s of one
    concatenated product (FP8 when the fp8_base part is on); the state dict is unchanged.
    Reports `fused_gate_up`.
    Order: after the move to the device (stage adapted) and fused_qkv; before fp8_base (its concatenated
    weight is quantised here, and its halves are no bare `nn.Linear` for fp8_base to convert again) and
    split_products (which leaves the fused product as it is)."""

    name = "fused_gate_up"
    stage = "adapted"
    reports = {"fused_gate_up": False}

    def decide(self, ctx: StepContext) -> Decision:
        setting = ctx.experimental.fuse_gate_up
        if setting is True and ctx.parallel != "ddp":
            raise UsageError(
                f"train.experimental.fuse_gate_up=true works with train.parallel=ddp only ({ctx.parallel} "
                "shards the weights it concatenates): set train.experimental.fuse_gate_up=auto"
            )
        if setting != "auto":
            return Decision(bool(setting), bool(setting), "set (experimental)")
        return ctx.auto_on_gpu_under_ddp(self.name, ": it concatenates weights that are sharded")

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        fused = fuse_gate_up(model, **fp8_options(ctx))
        if ctx.experimental.fuse_gate_up is True and not fused:
            raise UsageError(
                "train.experimental.fuse_gate_up=true: no MLP has frozen gate_proj and up_proj without LoRA "
                "on them (lora.target_modules): set train.experimental.fuse_gate_up=false"
            )
        if fused:
            ctx.details[self.name] = f" | gate/up fused in {fused} MLPs"
        return {"fused_gate_up": fused > 0}

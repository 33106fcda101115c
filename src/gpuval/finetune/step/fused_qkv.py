"""q, k and v with their LoRA adapters as one product (`train.step.fuse_qkv`, issue 23).

PEFT runs the three projections of an attention layer as three LoRA layers over the same input: three base
products (k and v are narrow: 512 columns for Qwen2-7B's 4 K/V heads), three dropout masks and three A
products. Fused, one attention layer computes

    base = x [W_q; W_k; W_v]ᵀ + [b_q; b_k; b_v]          one product over the concatenated weights
    h    = dropout(x) [A_q; A_k; A_v]ᵀ                   one dropout mask, one A product (3r columns)
    q, k, v = base split + (h_q B_qᵀ, h_k B_kᵀ, h_v B_vᵀ) · scaling

One mask instead of three: with LoRA dropout on the shared input, a single fused A product means a single
mask for that input, so q, k and v see the same dropped features (PEFT draws one mask per adapter). Each
adapter's input still drops with probability p and keeps the same expectation; only the correlation between
the three adapters' masks differs. With dropout 0 the fused layer computes exactly what PEFT computes.

How it plugs in without copying transformers' attention code: the attention's `q_proj`, `k_proj` and
`v_proj` stay PEFT's modules with PEFT's parameters (so the adapter saves in PEFT's layout, loadable by
plain peft), and only their `forward` is replaced: `q_proj(x)` computes all three and keeps k and v, which
`k_proj` and `v_proj` return next. Attention layers call them in the order q, k, v on the same input; a
call in any other order is an error, never a silently wrong result. The three base weights become views
into the concatenated one (no second copy); with `train.step.precision: fp8-base` the concatenated weight is
quantised once (fp8.Fp8Linear) and the parts are its row slices.

Under FSDP2 (`sharded`), which shards every parameter of a decoder layer on its own, views would become three
more sharded copies. There the concatenated product is registered in the attention module as `qkv_fused`,
so FSDP2 shards it and gathers it with the layer, and the three base layers keep zero-size weights: nothing
calls them (their `forward` is replaced) and PEFT's adapter, which holds only the LoRA weights, saves as
before.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
import torch.nn.functional as F

from gpuval.errors import UsageError
from gpuval.finetune.parts import Decision, Part, StepContext
from gpuval.finetune.step.fp8 import Fp8Linear, fp8_options, fused_base

PROJECTIONS = ("q_proj", "k_proj", "v_proj")
FUSED_NAME = "qkv_fused"  # the concatenated product's name in the attention module, under FSDP2
IDLE, Q_DONE, K_DONE = 0, 1, 2  # where an attention layer's q, k, v calls stand


class FusedQKV:
    """One attention layer's fused q/k/v (module docstring). Not an nn.Module: it holds references to
    PEFT's three LoRA layers and the concatenated base, and adds nothing to the model's state dict."""

    def __init__(self, parts: list[Any], adapter: str, base: torch.nn.Module) -> None:
        self.parts = parts
        self.base = base  # the concatenated product: nn.Linear, or Fp8Linear with fp8-base
        self.widths = [p.out_features for p in parts]
        self.lora_a = [p.lora_A[adapter] for p in parts]
        self.lora_b = [p.lora_B[adapter] for p in parts]
        self.ranks = [a.out_features for a in self.lora_a]
        self.scalings = [p.scaling[adapter] for p in parts]
        self.dropout = parts[0].lora_dropout[adapter]  # one mask for the shared input
        self.state = IDLE
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None

    def compute(self, x: torch.Tensor) -> list[torch.Tensor]:
        base = self.base(x)
        # PEFT casts x to the adapter dtype (float32) before dropout; under autocast the A product runs
        # in bf16 either way and dropout rounds once, so x is used as it is there (no float32 copy).
        lora_dtype = self.lora_a[0].weight.dtype
        lora_x = x if torch.is_autocast_enabled(x.device.type) else x.to(lora_dtype)
        a = torch.cat([lora_a.weight for lora_a in self.lora_a])  # (3r, in): PEFT's A has no bias
        hidden = F.linear(self.dropout(lora_x), a).split(self.ranks, dim=-1)
        outs = []
        for y, h, lora_b, scaling in zip(
            base.split(self.widths, dim=-1), hidden, self.lora_b, self.scalings, strict=True
        ):
            outs.append((y + lora_b(h) * scaling).to(y.dtype))  # PEFT returns the base output's dtype
        return outs

    def q_forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.state != IDLE:
            raise RuntimeError(self._order_error("q_proj"))
        q, k, v = self.compute(x)
        self.pending = (k, v)
        self.state = Q_DONE
        return q

    def k_forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.state != Q_DONE or self.pending is None:
            raise RuntimeError(self._order_error("k_proj"))
        self.state = K_DONE
        return self.pending[0]

    def v_forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.state != K_DONE or self.pending is None:
            raise RuntimeError(self._order_error("v_proj"))
        v = self.pending[1]
        self.pending = None
        self.state = IDLE
        return v

    @staticmethod
    def _order_error(called: str) -> str:
        return (
            f"fused q/k/v: {called} was called out of order (expected q_proj, k_proj, v_proj on the same "
            "input, as transformers' attention layers call them): set train.step.fuse_qkv=false"
        )


def fuse_qkv(
    model: torch.nn.Module,
    fp8: bool = False,
    fast_accum: bool = False,
    input_grad_fp8: bool = True,
    exclude: Collection[int] = frozenset(),
    sharded: bool = False,
) -> int:
    """Fuse q/k/v in every attention layer of a PEFT model whose three projections carry one plain LoRA
    adapter each (see `fusable`); `fp8`: the concatenated base weight runs in FP8 (fp8.Fp8Linear, with
    `fast_accum` and `input_grad_fp8` as fp8.Fp8Linear.from_linear takes them) unless one of the three base
    layers' ids is in `exclude` (fp8.excluded_linears). Call it after the model is on its device and before
    compiling. `sharded`: the layers will be sharded by FSDP2 (module docstring). Returns how many attention
    layers were fused."""
    count = 0
    for attention in list(model.modules()):
        parts = [getattr(attention, name, None) for name in PROJECTIONS]
        adapter = fusable(parts)
        if adapter is None:
            continue
        kept_bf16 = any(id(p.get_base_layer()) in exclude for p in parts)
        concatenated = concatenate_linears([p.get_base_layer() for p in parts])
        base = fused_base(concatenated, fp8, kept_bf16, fast_accum, input_grad_fp8)
        fused = FusedQKV(parts, adapter, base)
        if sharded:
            attention.register_module(FUSED_NAME, base)
            for part in parts:
                _drop_weights(part.get_base_layer())
        else:
            start = 0
            for part, width in zip(parts, fused.widths, strict=True):
                _point_at_rows(part, base, start, start + width)  # no second copy of the weights
                start += width
        for part, forward in zip(parts, (fused.q_forward, fused.k_forward, fused.v_forward), strict=True):
            part.forward = forward  # an instance attribute: PEFT's class and parameters stay as they are
        count += 1
    return count


def fusable(parts: list[Any]) -> str | None:
    """The adapter name when the three modules are PEFT LoRA linears with one plain (not DoRA, not
    merged) active adapter each, on the same input, with the same dropout and base dtype; else None."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    if not all(type(p) is LoraLinear and type(p.get_base_layer()) is torch.nn.Linear for p in parts):
        return None
    adapters = {tuple(p.active_adapters) for p in parts}
    if len(adapters) != 1 or len(next(iter(adapters))) != 1:
        return None
    (adapter,) = next(iter(adapters))
    if any(p.merged or p.disable_adapters or adapter in p.lora_variant for p in parts):
        return None
    bases = [p.get_base_layer() for p in parts]
    same = (
        len({b.in_features for b in bases}) == 1
        and len({(b.weight.dtype, b.weight.device) for b in bases}) == 1
        and len({b.bias is None for b in bases}) == 1
        and len({_dropout_p(p.lora_dropout[adapter]) for p in parts}) == 1
    )
    return adapter if same else None


def _dropout_p(module: torch.nn.Module) -> float:
    return float(getattr(module, "p", 0.0))  # nn.Identity when PEFT's dropout is 0


def concatenate_linears(bases: list[torch.nn.Linear]) -> torch.nn.Linear:
    """One frozen linear layer whose output rows are those of `bases` in order (also fused_mlp.py's)."""
    weight = torch.cat([b.weight.detach() for b in bases])
    out_features, in_features = weight.shape
    base = torch.nn.Linear(in_features, out_features, bias=bases[0].bias is not None, device="meta")
    base.weight = torch.nn.Parameter(weight, requires_grad=False)
    if bases[0].bias is not None:
        base.bias = torch.nn.Parameter(torch.cat([b.bias.detach() for b in bases]), requires_grad=False)
    return base


def _drop_weights(layer: torch.nn.Linear) -> None:
    """A base layer that nothing calls any more keeps zero-size weights (FSDP2 would shard a full copy)."""
    for name in ("weight", "bias"):
        value = getattr(layer, name)
        if value is not None:
            setattr(layer, name, torch.nn.Parameter(value.new_empty(0), requires_grad=False))


def _point_at_rows(part: Any, base: torch.nn.Module, start: int, end: int) -> None:
    """Make the part's base layer rows `start:end` of the concatenated base, sharing its memory."""
    if isinstance(base, Fp8Linear):
        part.base_layer = base.rows(start, end)
        return
    layer = part.get_base_layer()
    layer.weight = torch.nn.Parameter(base.weight[start:end], requires_grad=False)
    if base.bias is not None:
        layer.bias = torch.nn.Parameter(base.bias[start:end], requires_grad=False)


class FusedQkvPart(Part):
    """Fused q/k/v: q, k and v with their LoRA adapters as one product and one dropout mask (module
    docstring; `train.step.fuse_qkv`).

    Applies when set true, or by auto on a GPU under ddp or fsdp when LoRA targets q, k and v (deepspeed
    partitions the weights it concatenates from hooks on the three modules: off, and said so). True under
    deepspeed, without LoRA on the three, or with no attention layer fused is a UsageError.
    Changes: the three projections' `forward` (PEFT's modules and adapter weights stay; under ddp the base
    weights become views of one concatenated weight, in FP8 when the fp8_base part is on; under fsdp the
    concatenated product is the attention's `qkv_fused` module and the three base weights are emptied).
    Reports `fused_qkv`.
    Order: after the move to the device (stage adapted) and after packed_dropout (it keeps a reference to the
    q adapter's dropout module); before fp8_base (it quantises its concatenated weight itself) and
    split_products (which finds its concatenated product through q_proj's `forward`)."""

    name = "fused_qkv"
    stage = "adapted"
    reports = {"fused_qkv": False}

    def decide(self, ctx: StepContext) -> Decision:
        setting, targets = ctx.step.fuse_qkv, ctx.lora.target_modules
        targeted = targets == "all-linear" or set(PROJECTIONS) <= set(targets)
        if setting is True and ctx.parallel == "deepspeed":
            raise UsageError(
                "train.step.fuse_qkv=true works with train.parallel ddp or fsdp (deepspeed partitions the "
                "weights it concatenates): set train.step.fuse_qkv=auto"
            )
        if setting is True and not targeted:
            raise UsageError(
                "train.step.fuse_qkv=true needs LoRA on q_proj, k_proj and v_proj (lora.target_modules): "
                "set train.step.fuse_qkv=false"
            )
        if setting != "auto":
            return Decision(bool(setting), bool(setting), "set")
        if not targeted:
            return Decision(False, False, "auto: LoRA is not on q, k and v")
        if not ctx.on_gpu:
            return Decision(False, False, "auto: CPU")
        if ctx.parallel == "deepspeed":
            return ctx.off_under_parallel(self.name, ": it concatenates weights that ZeRO-3 partitions")
        return Decision(True, True, f"auto: GPU, {ctx.parallel}")

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        fused = fuse_qkv(model, **fp8_options(ctx), sharded=ctx.parallel == "fsdp")
        if ctx.step.fuse_qkv is True and not fused:
            raise UsageError(
                "train.step.fuse_qkv=true: no attention layer has one plain LoRA adapter on each of q_proj, "
                "k_proj and v_proj: set train.step.fuse_qkv=false"
            )
        if fused:
            ctx.details[self.name] = f" | q/k/v fused in {fused} attention layers"
        return {"fused_qkv": fused > 0}

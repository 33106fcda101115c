"""The products whose output or input is the hidden size, in two groups of those columns
(`train.step.split_products`, issue 23).

Qwen2-7B's hidden size is 3,584. On an H100, a product writing 12,288 × 3,584 (the MLP's down projection
forward, the gate and up projections' input gradients, the attention's o-projection both ways and the q/k/v
input gradient) ran 5–10 % slower than the same FLOPs writing 18,944 columns: cuBLAS's 192 × 192 tiles
cover it in 9.2 waves of 132 SMs, so the tenth wave runs a fifth full and the last tile column is a third
empty (benchmarks/NOTES.md). Timed alone, the MLP's such products ran 4–8 % faster as two products over
column groups, 2,048 + 1,536 being the best of five splits
(benchmarks/results/2026-11-27-h100x1-split-products/): cuBLAS tiles the narrower outputs differently.

So, for a hidden size that is not a power of two, it is split into the largest power of two below it and
the rest (`column_groups`), and every frozen `nn.Linear` of the decoder layers computes its hidden-size
side in those groups: its forward per group of output columns when its output is hidden-size wide, its
input gradient per group of input columns when its input is. The forward's groups are joined with
`torch.cat`, which inductor folds into the elementwise kernel that reads the result (the residual add), so
compiled layers make no copy. The input gradient's groups are written by cuBLAS straight into the columns of
one buffer (`column_grouped_mm`): folded into the norm's backward, a reduction, the join cost that kernel
about 60 µs a layer on an H100. The arithmetic is unchanged: every element is the same dot product over the
same inner dimension, so results match the whole product up to the order of float additions inside cuBLAS.

Frozen linears only (their weights get no gradient here): PEFT's base layers, the MLP's projections and
fused_qkv's concatenated product; an adapter, an FP8 product or the fused gate/up is left as it is. The
module tree and state dict are untouched: only each linear instance's `forward` is replaced.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from gpuval.errors import UsageError
from gpuval.finetune.parts import Decision, Part, StepContext


def column_groups(width: int) -> list[int]:
    """`[2^k, width − 2^k]` with 2^k the largest power of two below `width`; `[width]` for a power of two."""
    if width < 1:
        raise ValueError(f"width must be positive, got {width}")
    top = 1 << (width.bit_length() - 1)
    return [width] if top == width else [top, width - top]


def _bounds(groups: list[int]) -> list[tuple[int, int]]:
    ends = [sum(groups[: i + 1]) for i in range(len(groups))]
    return list(zip([0, *ends[:-1]], ends, strict=True))


class _Grouped(torch.autograd.Function):
    """`x Wᵀ + b` for a frozen W `(out, in)` (and bias): the forward as one product per group of output
    columns when `out_groups` is given, else whole; the input gradient as one product per group of input
    columns when `in_groups` is given, else whole. No gradient for W or b (frozen)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        out_groups: list[int] | None,
        in_groups: list[int] | None,
    ) -> torch.Tensor:
        ctx.save_for_backward(weight)
        ctx.in_groups = in_groups
        if out_groups is None:
            return F.linear(x, weight, bias)
        return torch.cat(
            [F.linear(x, weight[a:b], None if bias is None else bias[a:b]) for a, b in _bounds(out_groups)],
            dim=-1,
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        (weight,) = ctx.saved_tensors
        weight = weight.to(grad.dtype)
        if ctx.in_groups is None:
            return grad @ weight, None, None, None, None
        rows = grad.reshape(-1, grad.shape[-1])
        ends = [b for _a, b in _bounds(ctx.in_groups)]
        out = torch.ops.gpuval.column_grouped_mm(rows, weight, ends)
        return out.view(*grad.shape[:-1], weight.shape[1]), None, None, None, None


@torch.library.custom_op("gpuval::column_grouped_mm", mutates_args=())
def column_grouped_mm(a: torch.Tensor, b: torch.Tensor, ends: list[int]) -> torch.Tensor:
    """`a (M, K) @ b (K, N)` as one product per group of b's columns (`ends`: each group's end column), each
    written straight into its columns of one `(M, N)` output: cuBLAS takes the output's row stride, so no
    join is needed. The input gradients use it: joined with `torch.cat`, inductor reads the groups inside the
    norm's backward, a reduction that ran 25-30 % slower so (benchmarks/NOTES.md item 26); an op of its own
    hands the compiled kernels one plain buffer."""
    out = a.new_empty((a.shape[0], b.shape[1]))
    start = 0
    for end in ends:
        torch.mm(a, b[:, start:end], out=out[:, start:end])
        start = end
    return out


@column_grouped_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor, ends: list[int]) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]))


def _frozen_linears(layer: Any) -> list[torch.nn.Linear]:
    """The frozen `nn.Linear`s a decoder layer runs: every one in its module tree (PEFT's base layers
    included) and the concatenated q/k/v product of fused_qkv, which is outside the tree."""
    found = [m for m in layer.modules() if type(m) is torch.nn.Linear and not m.weight.requires_grad]
    for module in layer.modules():
        base = getattr(getattr(module.forward, "__self__", None), "base", None)  # a FusedQKV's product
        if type(base) is torch.nn.Linear and not base.weight.requires_grad and base not in found:
            found.append(base)
    return found


def split_products(layers: list[Any], hidden: int, required: bool = False) -> int:
    """Compute every frozen linear's hidden-size side in column groups (`column_groups(hidden)`): its
    forward when its output is `hidden` wide, its input gradient when its input is. Returns how many linears
    changed. `required` (the setting was true): none changed is an error."""
    groups = column_groups(hidden)
    count = 0
    for layer in layers if len(groups) > 1 else []:
        for linear in _frozen_linears(layer):
            out_groups = groups if linear.out_features == hidden else None
            in_groups = groups if linear.in_features == hidden else None
            if out_groups or in_groups:
                linear.forward = _grouped_forward(linear, out_groups, in_groups)
                count += 1
    if required and not count:
        raise UsageError(
            f"train.step.split_products=true: no frozen linear with a side of the hidden size ({hidden}) "
            "that is "
            "not a power of two (fp8-base and fuse_gate_up replace them): set train.step.split_products=auto"
        )
    return count


def _grouped_forward(
    linear: torch.nn.Linear, out_groups: list[int] | None, in_groups: list[int] | None
) -> Any:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return _Grouped.apply(x, linear.weight, linear.bias, out_groups, in_groups)

    return forward


class SplitProductsPart(Part):
    """Split products: every frozen linear's hidden-size side in two column groups (module docstring;
    `train.step.split_products`).

    Applies when set true, or by auto on a GPU with compiled layers under ddp or fsdp (FSDP2 hands each
    layer's forward its gathered weights, which the split forward reads at call time): in eager layers the
    forward's join is a copy of its own, and under deepspeed it was never measured (off, and said so). True
    with no linear to split is a UsageError.
    Changes: each such linear instance's `forward` (module tree and state dict untouched).
    Reports `split_products`.
    Order: after fused_qkv (it splits the concatenated q/k/v product too), fused_gate_up and fp8_base (whose
    products it leaves as they are); before last_mlp_rows and compiling (stage adapted)."""

    name = "split_products"
    stage = "adapted"
    reports = {"split_products": False}

    def decide(self, ctx: StepContext) -> Decision:
        setting = ctx.step.split_products
        if setting != "auto":
            return Decision(bool(setting), bool(setting), "set")
        if not ctx.on_gpu:
            return Decision(False, False, "auto: CPU")
        if not ctx.compiled:
            return Decision(False, False, "auto: layers not compiled")
        if ctx.parallel == "deepspeed":
            return ctx.off_under_parallel(self.name, ": not measured there")
        return Decision(True, True, f"auto: GPU, compiled, {ctx.parallel}")

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        count = split_products(ctx.layers, model.config.hidden_size, ctx.step.split_products is True)
        return {"split_products": count > 0}

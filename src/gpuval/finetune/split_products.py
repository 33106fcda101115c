"""The MLP's products whose output is the hidden size, as two groups of output columns
(`train.split_products`, issue 23).

Three of a frozen gated MLP's six big products write hidden-size rows: the down projection's forward and
the gate and up projections' input gradients. On an H100 with Qwen2-7B's 3,584 columns and 12,288 rows
those ran 5–10 % slower than the same FLOPs writing 18,944 columns: cuBLAS's 192 × 192 tiles cover
12,288 × 3,584 in 9.2 waves of 132 SMs, so the tenth wave runs a fifth full and the last tile column is a
third empty (benchmarks/NOTES.md). Timed alone, each of those products ran 4–8 % faster as two products over
column groups, 2,048 + 1,536 being the best of five splits
(benchmarks/results/2026-11-27-h100x1-split-products/): cuBLAS tiles the narrower outputs differently.

So, for a width that is not a power of two, the width is split into the largest power of two below it and
the rest (`column_groups`); each such product runs as one product per group, and the groups are joined with
`torch.cat`, which inductor folds into the kernel that reads the result (the residual add, the norm's
backward), so no copy is made in compiled layers. The arithmetic is unchanged: every output element is the
same dot product over the same inner dimension, so results match the whole product up to the order of
float additions inside cuBLAS. The other three products (writing the intermediate size) stay whole.

Only MLPs of three frozen, bias-free `nn.Linear`s (`gate_proj`, `up_proj`, `down_proj`: LoRA on attention
only, bf16 products) are changed; an MLP with an adapter, FP8 products or the fused gate/up is left as it
is. The module tree and state dict are untouched: only the MLP instance's `forward` is replaced.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from gpuval.errors import UsageError

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def resolve_split_products(setting: bool | str, on_gpu: bool, compiled: bool) -> bool:
    """`train.split_products` as it will run. auto: on a GPU with compiled layers (in eager layers the
    join is a copy of its own)."""
    if setting == "auto":
        return on_gpu and compiled
    return bool(setting)


def column_groups(width: int) -> list[int]:
    """`[2^k, width − 2^k]` with 2^k the largest power of two below `width`; `[width]` for a power of two."""
    if width < 1:
        raise ValueError(f"width must be positive, got {width}")
    top = 1 << (width.bit_length() - 1)
    return [width] if top == width else [top, width - top]


def _bounds(groups: list[int]) -> list[tuple[int, int]]:
    ends = [sum(groups[: i + 1]) for i in range(len(groups))]
    return list(zip([0, *ends[:-1]], ends, strict=True))


class _OutputGroups(torch.autograd.Function):
    """`x Wᵀ` for a frozen W `(out, in)`: the forward as one product per group of output columns, the
    input gradient as one whole product."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, groups: list[int]) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return torch.cat([F.linear(x, weight[a:b]) for a, b in _bounds(groups)], dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (weight,) = ctx.saved_tensors
        return grad @ weight.to(grad.dtype), None, None


class _InputGradGroups(torch.autograd.Function):
    """`x Wᵀ` for a frozen W `(out, in)`: the forward as one whole product, the input gradient as one
    product per group of input columns."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, groups: list[int]) -> torch.Tensor:
        ctx.save_for_backward(weight)
        ctx.groups = groups
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (weight,) = ctx.saved_tensors
        weight = weight.to(grad.dtype)
        return torch.cat([grad @ weight[:, a:b] for a, b in _bounds(ctx.groups)], dim=-1), None, None


def _splittable(mlp: Any) -> bool:
    parts = [getattr(mlp, name, None) for name in PROJECTIONS]
    return hasattr(mlp, "act_fn") and all(
        type(p) is torch.nn.Linear and p.bias is None and not p.weight.requires_grad for p in parts
    )


def split_mlp_products(layers: list[Any], required: bool = False) -> int:
    """Give every splittable MLP in `layers` (module docstring) the grouped products; returns how many.
    Before LastMlpRows.attach, which wraps the MLP's forward as it finds it. `required` (the setting was
    true): none splittable, or a hidden size that is a power of two, is an error."""
    count = 0
    for layer in layers:
        mlp = getattr(layer, "mlp", None)
        if mlp is None or not _splittable(mlp):
            continue
        groups = column_groups(mlp.down_proj.out_features)
        if len(groups) == 1:
            continue
        mlp.forward = _grouped_forward(mlp, groups)
        count += 1
    if required and not count:
        raise UsageError(
            "train.split_products=true: no MLP of three frozen bias-free linears with a hidden size that is "
            "not a power of two (LoRA on gate/up/down, fp8-base or fuse_gate_up change them): set "
            "train.split_products=auto"
        )
    return count


def _grouped_forward(mlp: Any, groups: list[int]) -> Any:
    def forward(x: torch.Tensor) -> torch.Tensor:
        gate = _InputGradGroups.apply(x, mlp.gate_proj.weight, groups)
        up = _InputGradGroups.apply(x, mlp.up_proj.weight, groups)
        return _OutputGroups.apply(mlp.act_fn(gate) * up, mlp.down_proj.weight, groups)

    return forward

"""FP8 products for the frozen base weights (`train.step.precision: fp8-base`, issue 23).

LoRA never changes the base weights, so their products can run in FP8 on a Hopper GPU (compute capability
9.0: `torch._scaled_mm` with row-wise scales) while everything that trains stays in bf16:

- each frozen `nn.Linear` of the decoder layers (the base layer that a LoRA adapter wraps, and the MLP's
  projections; never the output head) is quantised once to float8_e4m3fn with one scale per output
  channel, `scale = amax / 448` over the row (448 is e4m3's largest finite value), and once more
  transposed, with one scale per input channel, for the backward product;
- activations are quantised each step with one scale per token (row), the same way;
- forward `y = x Wᵀ` and backward `grad_x = grad_y W` are both `_scaled_mm(A_e4m3, B_e4m3,
  scale_a (M, 1), scale_b (1, N))` with a bf16 result; the weight gets no gradient at all.
- with `train.step.fp8.input_grad: false` the backward product runs in bf16 against the original weight, kept
  instead of the transposed copy (`Fp8Linear.weight_back` is then that weight and `weight_back_scale` None);
- `train.step.fp8.exclude` keeps chosen linears in bf16 (`excluded_linears`): glob patterns over names such as
  `0.self_attn.q_proj` or `-1.mlp.down_proj` (the decoder layer's index from the start or from the end, then
  the module's path in the layer without PEFT's `base_layer`), as FP8 recipes keep their most sensitive
  products in higher precision. Unset, it keeps the first and the last decoder layer in bf16
  (`DEFAULT_EXCLUDE`): with every product in FP8 the 200-step loss of benchmarks/fp8_loss.py drifted to
  1.98 % above bf16's on one seed, with those two layers in bf16 it stayed within 0.55–0.81 % on three.

Why e4m3 for the gradient too (where per-tensor FP8 recipes use e5m2): with one scale per row every row's
largest value lands on 448, so e5m2's wider exponent range buys nothing, while e4m3 keeps one more mantissa
bit; and the row-wise kernels take e4m3 on both sides (torchao's all-axiswise recipe does the same).

Precision of one element (what the tests check, derived rather than tuned): e4m3 has 3 mantissa bits, so
rounding to nearest moves a normal value by at most 2⁻⁴ of itself; below e4m3's smallest normal value
(2⁻⁶ after scaling) the spacing is 2⁻⁹, so the error is at most 2⁻¹⁰·scale there.

The quantised weights are plain tensor attributes of `Fp8Linear`, not parameters or buffers: they are made
on the model's device after it was moved there, no optimizer, state dict, checkpoint or DDP broadcast sees
them, and the adapter saved is PEFT's as before.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Any, get_args

import torch

from gpuval.errors import UsageError
from gpuval.finetune.config import Precision
from gpuval.finetune.parts import Decision, Part, StepContext

PRECISIONS: tuple[str, ...] = get_args(Precision)  # ("bf16", "fp8-base")
FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
MIN_CAPABILITY = (9, 0)  # Hopper: row-wise scaled FP8 products (torch._scaled_mm)
AMAX_FLOOR = 1e-12  # an all-zero row keeps a finite scale (its values quantise to 0)
# _scaled_mm needs both dimensions of the weight to be multiples of 16; other linears stay in bf16.
ALIGNMENT = 16
# The backward product never uses Hopper's fast FP8 accumulation; the forward product does only when
# `train.step.fp8.fast_accum` asks (torchao's Float8LinearConfig turns it on for the forward by default).
# Without it cuBLAS adds the tensor cores' partial sums into float32 at intervals instead of keeping one
# reduced-precision sum over the whole inner dimension (3,584 to 18,944 here).
FAST_ACCUM_BACKWARD = False
# train.step.fp8.exclude when unset: the first and the last decoder layer stay bf16 (module docstring;
# measured in benchmarks/results/2026-11-26-h100x1-fp8-exclude/). An explicit [] puts every product in FP8.
DEFAULT_EXCLUDE: tuple[str, ...] = ("0.*", "-1.*")


def resolve_exclude(setting: Sequence[str] | None) -> tuple[str, ...]:
    """`train.step.fp8.exclude` as it will run: `DEFAULT_EXCLUDE` when unset (None), else the patterns
    given."""
    return DEFAULT_EXCLUDE if setting is None else tuple(setting)


def _precision(ctx: StepContext) -> str:
    """`train.step.precision` as it will run; fp8-base where it cannot is a one-line UsageError naming why,
    and so are FP8 settings changed from their defaults (`fast_accum`, `input_grad`, and `exclude`, whose
    default is None) under bf16, where they would do nothing."""
    setting, fp8 = ctx.step.precision, ctx.step.fp8
    device_name, capability = ctx.gpu_name, ctx.capability
    if setting not in PRECISIONS:
        raise UsageError(f"train.step.precision={setting}: expected one of {', '.join(PRECISIONS)}")
    if setting == "bf16":
        changed = [
            name
            for name, on in (
                ("fast_accum", fp8.fast_accum),
                ("input_grad", not fp8.input_grad),
                ("exclude", fp8.exclude is not None),
            )
            if on
        ]
        if changed:
            raise UsageError(
                f"train.step.fp8.{changed[0]} applies to train.step.precision=fp8-base only (this config "
                "has bf16): set train.step.precision=fp8-base or leave "
                f"train.step.fp8.{changed[0]} at its default"
            )
        return setting
    if device_name is None or capability is None:
        raise UsageError(
            "train.step.precision=fp8-base needs an NVIDIA GPU of compute capability 9.0 or newer (H100, "
            "H200); this run is on the CPU: set train.step.precision=bf16"
        )
    if tuple(capability) < MIN_CAPABILITY:
        raise UsageError(
            "train.step.precision=fp8-base needs an NVIDIA GPU of compute capability 9.0 or newer (H100, "
            f"H200) for row-wise scaled FP8 products; found {device_name} (compute capability "
            f"{capability[0]}.{capability[1]}): set train.step.precision=bf16"
        )
    if ctx.dtype != "bfloat16":
        raise UsageError(f"train.step.precision=fp8-base needs dtype: bfloat16 (the config has {ctx.dtype})")
    if ctx.parallel != "ddp":
        raise UsageError(
            f"train.step.precision=fp8-base works with train.parallel=ddp only (not {ctx.parallel}: it "
            "shards the weights that fp8-base replaces): set train.step.precision=bf16 or train.parallel=ddp"
        )
    return setting


def quantize_rows(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 values of a 2-D tensor and their float32 scales, one per row (shape `(rows, 1)`):
    `matrix ≈ values.float() * scales`. The cast to e4m3 does not saturate (out of range is NaN), so the
    scaled values are clamped to ±448 first: amax / (amax / 448) can round to just above 448. The values
    are row-major whatever the input's layout (a transposed gradient, say): `_scaled_mm` takes its first
    operand so."""
    amax = matrix.abs().amax(dim=-1, keepdim=True).float()
    scales = amax.clamp(min=AMAX_FLOOR) / FP8_MAX
    values = (matrix.float() / scales).clamp(-FP8_MAX, FP8_MAX).to(FP8).contiguous()
    return values, scales


class _Fp8LinearFunction(torch.autograd.Function):
    """`x Wᵀ + b` in FP8 with a gradient for `x` only (W and b are frozen)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        weight: torch.Tensor,  # (out, in) e4m3
        weight_scale: torch.Tensor,  # (1, out) float32
        weight_back: torch.Tensor,  # backward operand: (in, out) e4m3, contiguous; or (out, in) bf16
        weight_back_scale: torch.Tensor | None,  # (1, in) float32; None: the backward product runs in bf16
        bias: torch.Tensor | None,  # (out,) bf16
        fast_accum: bool,  # the forward product's use_fast_accum
    ) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        x_fp8, x_scale = quantize_rows(rows)
        out = torch._scaled_mm(
            x_fp8,
            weight.t(),  # column-major (in, out), as _scaled_mm's second operand must be
            scale_a=x_scale,
            scale_b=weight_scale,
            bias=bias,
            out_dtype=torch.bfloat16,
            use_fast_accum=fast_accum,
        )
        ctx.save_for_backward(weight_back, weight_back_scale)
        ctx.input_dtype = x.dtype  # type: ignore[attr-defined]
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor) -> tuple:  # type: ignore[override]
        if not ctx.needs_input_grad[0]:  # type: ignore[attr-defined]
            return None, None, None, None, None, None, None
        weight_back, weight_back_scale = ctx.saved_tensors  # type: ignore[attr-defined]
        flat_grad = grad_out.reshape(-1, grad_out.shape[-1])
        if weight_back_scale is None:  # train.step.fp8.input_grad false: the bf16 weight, (out, in)
            grad_x = flat_grad.to(weight_back.dtype) @ weight_back
        else:
            grad_fp8, grad_scale = quantize_rows(flat_grad)
            grad_x = torch._scaled_mm(
                grad_fp8,
                weight_back.t(),  # column-major (out, in)
                scale_a=grad_scale,
                scale_b=weight_back_scale,
                out_dtype=torch.bfloat16,
                use_fast_accum=FAST_ACCUM_BACKWARD,
            )
        grad_x = grad_x.reshape(*grad_out.shape[:-1], grad_x.shape[-1]).to(ctx.input_dtype)  # type: ignore[attr-defined]
        return grad_x, None, None, None, None, None, None


class Fp8Linear(torch.nn.Module):
    """A frozen linear layer whose products run in FP8 (module docstring); the output is bf16."""

    def __init__(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        weight_back: torch.Tensor,
        weight_back_scale: torch.Tensor | None,
        bias: torch.Tensor | None,
        fast_accum: bool = False,
    ) -> None:
        super().__init__()
        # Plain attributes, not parameters or buffers (module docstring).
        self.weight_fp8 = weight
        self.weight_scale = weight_scale
        self.weight_back = weight_back
        self.weight_back_scale = weight_back_scale
        self.bias_bf16 = bias
        self.fast_accum = fast_accum

    @classmethod
    def from_linear(
        cls, linear: torch.nn.Linear, fast_accum: bool = False, input_grad_fp8: bool = True
    ) -> Fp8Linear:
        """`input_grad_fp8` false: the backward product runs in bf16 against the original weight, kept
        instead of a transposed FP8 copy (one more byte per weight)."""
        weight = linear.weight.detach()
        values, scales = quantize_rows(weight)  # one scale per output channel
        bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        if not input_grad_fp8:
            return cls(values, scales.reshape(1, -1), weight.to(torch.bfloat16), None, bias, fast_accum)
        values_t, scales_t = quantize_rows(weight.t())  # one scale per input channel, row-major (in, out)
        return cls(values, scales.reshape(1, -1), values_t, scales_t.reshape(1, -1), bias, fast_accum)

    @property
    def in_features(self) -> int:
        return self.weight_fp8.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight_fp8.shape[0]

    def rows(self, start: int, end: int) -> Fp8Linear:
        """The output channels `start:end` as a layer of their own, sharing this one's memory (fused q/k/v:
        the parts of one concatenated weight). The transposed copy keeps the scales of the whole input
        channel, which are at least as wide as the part's own: still a valid quantisation of the part."""
        bias = None if self.bias_bf16 is None else self.bias_bf16[start:end]
        bf16_backward = self.weight_back_scale is None  # weight_back is then the (out, in) bf16 weight
        return Fp8Linear(
            self.weight_fp8[start:end],
            self.weight_scale[:, start:end],
            self.weight_back[start:end] if bf16_backward else self.weight_back[:, start:end],
            self.weight_back_scale,
            bias,
            self.fast_accum,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Fp8LinearFunction.apply(
            x,
            self.weight_fp8,
            self.weight_scale,
            self.weight_back,
            self.weight_back_scale,
            self.bias_bf16,
            self.fast_accum,
        )

    def extra_repr(self) -> str:
        fast = ", fast forward accumulation" if self.fast_accum else ""
        backward = ", bf16 input gradient" if self.weight_back_scale is None else ""
        shape = f"in_features={self.in_features}, out_features={self.out_features}"
        return f"{shape}, fp8=e4m3 row-wise{fast}{backward}"


def fits_fp8(linear: torch.nn.Linear) -> bool:
    return linear.in_features % ALIGNMENT == 0 and linear.out_features % ALIGNMENT == 0


def fused_base(
    linear: torch.nn.Linear,
    fp8: bool,
    kept_bf16: bool,
    fast_accum: bool = False,
    input_grad_fp8: bool = True,
) -> torch.nn.Module:
    """A fused layer's concatenated base (fused_qkv, fused_mlp): an `Fp8Linear` of `linear` when `fp8` is on,
    its shape fits `_scaled_mm` and none of its parts is kept in bf16 (`train.step.fp8.exclude`); else
    `linear`."""
    if fp8 and fits_fp8(linear) and not kept_bf16:
        return Fp8Linear.from_linear(linear, fast_accum, input_grad_fp8)
    return linear


def _frozen_linear(module: torch.nn.Module) -> bool:
    return type(module) is torch.nn.Linear and not module.weight.requires_grad


def excluded_linears(layers: Sequence[torch.nn.Module], patterns: Sequence[str]) -> frozenset[int]:
    """The ids of the frozen `nn.Linear` modules inside `layers` (the decoder layers) that
    `train.step.fp8.exclude`
    keeps in bf16: those with a name matching one of the glob `patterns` (fnmatch, case-sensitive). A module
    has two names, `{i}.{path}` and `{i - len(layers)}.{path}`: its layer's index from the start and from the
    end, then its path in the layer without PEFT's `base_layer` (`3.self_attn.q_proj`, `-1.mlp.down_proj`).
    A pattern that matches no frozen linear is a one-line UsageError: a typo must not quietly leave
    everything in FP8."""
    matched: set[str] = set()
    ids: set[int] = set()
    for index, layer in enumerate(layers):
        for path, module in layer.named_modules():
            if not _frozen_linear(module):
                continue
            path = ".".join(part for part in path.split(".") if part != "base_layer")
            names = (f"{index}.{path}", f"{index - len(layers)}.{path}")
            hits = {p for p in patterns if any(fnmatchcase(name, p) for name in names)}
            if hits:
                ids.add(id(module))
                matched |= hits
    if missing := [p for p in patterns if p not in matched]:
        raise UsageError(
            f"train.step.fp8.exclude: '{missing[0]}' matches no frozen linear of the decoder layers (names "
            "look "
            "like 0.self_attn.q_proj or -1.mlp.down_proj; *.self_attn.* takes every attention product): "
            "fix or remove the pattern"
        )
    return frozenset(ids)


def convert_frozen_linears(
    layers: Iterable[torch.nn.Module],
    fast_accum: bool = False,
    input_grad_fp8: bool = True,
    exclude: Collection[int] = frozenset(),
) -> int:
    """Replace every frozen `nn.Linear` inside `layers` (the decoder layers) by an `Fp8Linear`; trainable
    linears (LoRA's A and B), layers already converted and those whose id is in `exclude`
    (`excluded_linears`) are left alone. Returns how many were replaced."""
    targets = [
        (parent, name, child)
        for layer in layers
        for parent in layer.modules()
        for name, child in parent.named_children()
        if _frozen_linear(child) and fits_fp8(child) and id(child) not in exclude
    ]
    for parent, name, child in targets:
        setattr(parent, name, Fp8Linear.from_linear(child, fast_accum, input_grad_fp8))
    return len(targets)


def products_in_fp8(layers: list[torch.nn.Module]) -> int:
    """Frozen linears whose products run in FP8, counted in the layers as they now are: the parts of a
    fused q/k/v or gate/up count one each, as the linears they replace (a gate/up half holds its fused
    product as `.fused.base`)."""
    return sum(
        isinstance(m, Fp8Linear) or isinstance(getattr(getattr(m, "fused", None), "base", None), Fp8Linear)
        for layer in layers
        for m in layer.modules()
    )


def fp8_options(ctx: StepContext) -> dict[str, Any]:
    """How the frozen base's products run, as the fused parts (fused_qkv, fused_mlp) and the FP8 part take
    them: `fp8` on or off, `fast_accum`, `input_grad_fp8` and `exclude` (the ids of the linears kept in bf16,
    `excluded_linears`), computed once, on the decoder layers as they were before any fusion."""
    if "fp8_options" not in ctx.shared:
        decision = ctx.decisions["fp8_base"]
        patterns = resolve_exclude(ctx.step.fp8.exclude)
        ctx.shared["fp8_options"] = {
            "fp8": decision.on,
            "fast_accum": ctx.step.fp8.fast_accum,
            "input_grad_fp8": ctx.step.fp8.input_grad,
            "exclude": excluded_linears(ctx.layers, patterns) if decision.on else frozenset(),
        }
    return ctx.shared["fp8_options"]


class Fp8BasePart(Part):
    """FP8 frozen base: every frozen linear of the decoder layers as an `Fp8Linear` (`train.step.precision:
    fp8-base`; module docstring).

    Applies only when set (no auto): on a Hopper GPU (compute capability 9.0+), bf16 weights, under ddp;
    anything else is a UsageError naming why, as are FP8 options (`train.step.fp8`) changed under bf16.
    Changes: frozen `nn.Linear`s inside the decoder layers become `Fp8Linear`s, except those
    `train.step.fp8.exclude` keeps in bf16; trainable LoRA linears and the output head are untouched.
    Reports `precision` as the products run: fp8-base, or the base weights' dtype (bf16, or float32 where
    the model is loaded so, as on a CPU).
    Order: after fused_qkv and fused_gate_up, which quantise their concatenated weights themselves (their
    parts are no bare `nn.Linear` to convert again; they read this decision through `fp8_options`), and
    after the move to the device (stage adapted): the FP8 weights are made there."""

    name = "fp8_base"
    stage = "adapted"
    reports = {"precision": lambda decision: decision.choice}

    def decide(self, ctx: StepContext) -> Decision:
        precision = _precision(ctx)
        runs_as = precision if precision == "fp8-base" or ctx.dtype == "bfloat16" else ctx.dtype
        return Decision(
            precision == "fp8-base", runs_as, "set" if ctx.step.precision != "bf16" else "default"
        )

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        options = fp8_options(ctx)
        convert_frozen_linears(
            ctx.layers,
            fast_accum=options["fast_accum"],
            input_grad_fp8=options["input_grad_fp8"],
            exclude=options["exclude"],
        )
        ctx.details[self.name] = (
            f" ({products_in_fp8(ctx.layers)} frozen linears in FP8, {len(options['exclude'])} kept in bf16 "
            "by "
            "train.step.fp8.exclude)"
        )
        return {"precision": decision.choice}

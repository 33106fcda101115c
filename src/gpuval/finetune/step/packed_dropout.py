"""LoRA's dropout with its keep-mask drawn eight elements per random draw (`train.step.dropout_kernel`,
issue 23).

The recipe's LoRA dropout (p = 0.05 on the adapters' inputs) runs twice per decoder layer and micro-batch,
each time over a whole activation (12,288 × 3,584 elements for Qwen2-7B at micro-batch 3). Compiled by
inductor, `nn.Dropout` draws one Philox-4x32-10 call per element and keeps one of its four 32-bit
outputs; on an H100 that made the compiled norm that applies it 0.10 ms slower than the same norm without
it, of which about 0.03 ms is writing the dropped copy (benchmarks/NOTES.md items 14 and 20). A 16-bit
uniform number is enough to decide one element (p is then a multiple of 2⁻¹⁶: 0.05 becomes 3,277 / 65,536
= 0.0500031), so one Philox call's 128 bits decide eight elements.

So the mask is made by a kernel of its own (`keep_bits`): one Philox call per eight elements, the eight
keep-decisions packed into one byte, bit b of byte j for element 8j + b (a 1/8-byte mask: 5.5 MB for the
activation above). The dropout itself stays inside the compiled layer, `where(keep, x · scale, 0)` with
`keep` unpacked from those bytes, so inductor fuses it into the kernel that makes `x` (the norm) as before,
and its backward keeps the bytes rather than a one-byte-per-element mask. The scale is
`1 / (1 − p')` for the p' actually drawn, so the expectation of every element is kept exactly; the
arithmetic is `nn.Dropout`'s (one rounding of `x · scale`).

Measured on one H100 (benchmarks/NOTES.md item 25): the norm kernel gained less than the random numbers
were thought to cost (0.226 → 0.215 ms); the step gained 0.4–0.85 % and 0.97 GiB of peak memory, mostly
from the backward keeping one bit per element instead of a byte.

What differs from `nn.Dropout` is only the random stream: each call draws its own 62-bit Philox key from
PyTorch's generator on the device of `x` (so `torch.manual_seed`, the trainer's saved RNG state and resume
govern it as they govern `nn.Dropout`), and masks of different calls are independent. On a CPU the same
decisions are made from `torch.randint` 16-bit numbers (the tests' path); on a GPU by a Triton kernel.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from gpuval.finetune.parts import Decision, Part, StepContext

LEVELS = 1 << 16  # each element's keep decision compares a 16-bit uniform number with the threshold
_SEED_HALF = 2**31 - 1  # the key is drawn as two 31-bit halves (inductor draws them as int64 randint)


def threshold_for(p: float) -> int:
    """The 16-bit threshold under which an element is dropped: round(p · 2¹⁶)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    threshold = round(p * LEVELS)
    if threshold >= LEVELS:
        raise ValueError(f"dropout probability {p} rounds to 1 at 16-bit resolution")
    return threshold


@torch.library.custom_op("gpuval::keep_bits", mutates_args=())
def keep_bits(seed: torch.Tensor, numel: int, threshold: int) -> torch.Tensor:
    """`ceil(numel / 8)` bytes: bit b of byte j is 1 when element 8j + b is kept, i.e. when its 16-bit
    uniform number is at least `threshold`. `seed`: two int64 values below 2³¹ on the output's device, the
    Philox key `seed[0] + seed[1] · 2³¹`."""
    n_bytes = (numel + 7) // 8
    out = torch.empty(n_bytes, dtype=torch.uint8, device=seed.device)
    if n_bytes == 0:
        return out
    if seed.is_cuda:
        _launch(seed, out, n_bytes, threshold)
        return out
    key = int(seed[0]) + int(seed[1]) * 2**31
    generator = torch.Generator(device=seed.device).manual_seed(key)
    draws = torch.randint(0, LEVELS, (n_bytes * 8,), generator=generator, device=seed.device)
    return pack_bits(draws >= threshold)


@keep_bits.register_fake
def _(seed: torch.Tensor, numel: int, threshold: int) -> torch.Tensor:
    return seed.new_empty(((numel + 7) // 8,), dtype=torch.uint8)


def pack_bits(keep: torch.Tensor) -> torch.Tensor:
    """Booleans (a multiple of 8 of them) as bytes, element 8j + b in bit b of byte j."""
    weights = 1 << torch.arange(8, device=keep.device, dtype=torch.int32)
    return (keep.view(-1, 8).to(torch.int32) * weights).sum(dim=1).to(torch.uint8)


def unpack_bits(bits: torch.Tensor, numel: int) -> torch.Tensor:
    """The first `numel` booleans of `bits` (pack_bits' layout); elementwise index arithmetic, which
    inductor fuses into the kernel that reads the mask."""
    shifts = torch.arange(8, device=bits.device, dtype=torch.int32)
    return ((bits.to(torch.int32).unsqueeze(1) >> shifts) & 1).view(-1)[:numel].bool()


class PackedDropout(torch.nn.Module):
    """`nn.Dropout(p)` with its mask from `keep_bits` (module docstring). The drop probability is p rounded
    to a multiple of 2⁻¹⁶, and kept elements are scaled by 1 / (1 − that)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.threshold = threshold_for(p)
        self.scale = LEVELS / (LEVELS - self.threshold)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.threshold == 0:
            return x
        seed = torch.randint(0, _SEED_HALF, (2,), device=x.device, dtype=torch.int64)
        bits = torch.ops.gpuval.keep_bits(seed, x.numel(), self.threshold)
        keep = unpack_bits(bits, x.numel()).view(x.shape)
        return torch.where(keep, x * self.scale, torch.zeros((), dtype=x.dtype, device=x.device))

    def extra_repr(self) -> str:
        return f"p={self.p}, drawn p={self.threshold / LEVELS:.7f}"


def use_packed_dropout(layers: list[Any]) -> int:
    """Replace every `nn.Dropout` with p > 0 inside the decoder layers (PEFT's `lora_dropout` entries) by
    a PackedDropout of the same p; returns how many. Call it before fuse_qkv, which keeps a reference to
    the q adapter's dropout. No parameters change: the state dict and the saved adapter are the same."""
    count = 0
    for layer in layers:
        for module in list(layer.modules()):
            for name, child in list(module.named_children()):
                if type(child) is torch.nn.Dropout and child.p > 0:
                    setattr(module, name, PackedDropout(child.p))
                    count += 1
    return count


class PackedDropoutPart(Part):
    """Packed dropout: LoRA's dropout with its keep-mask drawn eight elements per random draw (module
    docstring; `train.step.dropout_kernel`).

    Applies when set packed, or by auto on a GPU with compiled layers (the gain is a cheaper mask inside
    inductor's fused kernels; eager layers apply it in a kernel of their own, as nn.Dropout does). Any
    parallel mode.
    Changes: every `nn.Dropout` with p > 0 in the decoder layers (PEFT's lora_dropout) becomes a
    PackedDropout of the same p; no parameter changes.
    Reports `dropout_kernel`: packed (when any dropout was replaced) or torch.
    Order: after LoRA (it replaces LoRA's dropouts; stage adapted), before fused_qkv, which keeps a
    reference to the q adapter's dropout module."""

    name = "packed_dropout"
    stage = "adapted"
    reports = {"dropout_kernel": "torch"}

    def decide(self, ctx: StepContext) -> Decision:
        setting = ctx.step.dropout_kernel
        if setting != "auto":
            return Decision(setting == "packed", setting, "set")
        if ctx.on_gpu and ctx.compiled:
            return Decision(True, "packed", "auto: GPU, compiled")
        return Decision(False, "torch", "auto: GPU, eager layers" if ctx.on_gpu else "auto: CPU")

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        return {"dropout_kernel": "packed" if use_packed_dropout(ctx.layers) else "torch"}


def _launch(seed: torch.Tensor, out: torch.Tensor, n_bytes: int, threshold: int) -> None:
    block = 1024
    _kernel()[(-(-n_bytes // block),)](seed, out, n_bytes, threshold, BLOCK=block)


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, built on first use (Triton exists only where a GPU build of PyTorch is)."""
    import triton
    import triton.language as tl

    @triton.jit
    def keep_bits_kernel(seed_ptr, out_ptr, n_bytes, threshold, BLOCK: tl.constexpr):  # noqa: N803
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        key = tl.load(seed_ptr) + tl.load(seed_ptr + 1) * 2147483648
        r0, r1, r2, r3 = tl.randint4x(key, offsets)  # one Philox call: 4 × 32 bits for 8 elements
        byte = ((r0 & 0xFFFF) >= threshold).to(tl.int32)
        byte |= ((r0 >> 16) >= threshold).to(tl.int32) << 1
        byte |= ((r1 & 0xFFFF) >= threshold).to(tl.int32) << 2
        byte |= ((r1 >> 16) >= threshold).to(tl.int32) << 3
        byte |= ((r2 & 0xFFFF) >= threshold).to(tl.int32) << 4
        byte |= ((r2 >> 16) >= threshold).to(tl.int32) << 5
        byte |= ((r3 & 0xFFFF) >= threshold).to(tl.int32) << 6
        byte |= ((r3 >> 16) >= threshold).to(tl.int32) << 7
        tl.store(out_ptr + offsets, byte.to(tl.uint8), mask=offsets < n_bytes)

    return keep_bits_kernel

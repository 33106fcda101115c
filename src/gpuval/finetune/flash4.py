"""FlashAttention-4's kernels as the causal attention of whole-document rows (`train.row_kernel: fa4`).

FlashAttention-4 (the `flash-attn-4` package, Dao-AILab/flash-attention's `flash_attn.cute`) is written in
NVIDIA's CuTe DSL and compiled when first called, so it installs from a pure-Python wheel with no CUDA
build. Its Hopper (SM90) kernels are a port of FlashAttention-3's. On one H100 at Qwen2-7B's layer shape
(3 rows of 4,096 tokens, 28 query and 4 key/value heads of 128) its forward with backward took 2.36 ms
against cuDNN's 2.81 ms (backward 504 against 414 TFLOP/s), with the same largest errors against a float32
reference (benchmarks/results/2026-11-27-h100x1-attention-kernels/, benchmarks/NOTES.md item 27).

`causal_attention(q, k, v, scale)` takes token-major `(batch, tokens, heads, head size)` tensors (fewer
key/value heads than query heads is grouped-query attention, which FA4 runs natively) and returns the
output in the same layout. It is a PyTorch custom operator pair (`gpuval::fa4_causal` and its backward)
so that compiled layers call it as one opaque kernel: torch.compile cannot trace the DSL's launch.

Each operator has a CPU kernel too: the same outputs (the attention and its log-sum-exp per query) from
PyTorch's math in float32, so the operators' autograd and fake-tensor wiring are tested where there is no
GPU. The trainer never sends CPU tensors here (on a CPU `fa4` rows run plain causal SDPA).
"""

from __future__ import annotations

import functools
import math

import torch

PACKAGE = "flash-attn-4"


@functools.cache
def unavailable_reason() -> str | None:
    """None when FA4 can run on this process's GPU, else why not (one line)."""
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    major, minor = torch.cuda.get_device_capability()
    if major not in (9, 10):
        return f"FA4 runs on Hopper and Blackwell GPUs (compute capability 9.x or 10.x), not {major}.{minor}"
    try:
        _interface()
    except ImportError as exc:
        return f"the {PACKAGE} package is not importable ({exc})"
    return None


@functools.cache
def _interface():  # noqa: ANN202 - the module flash_attn.cute.interface
    from flash_attn.cute import interface

    return interface


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
    """Causal attention of `(B, S, Hq, D)` queries over `(B, S, Hkv, D)` keys and values: `(B, S, Hq, D)`."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return fa4_causal(q, k, v, scale)[0]


@torch.library.custom_op("gpuval::fa4_causal", mutates_args=(), device_types="cuda")
def fa4_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output `(B, S, Hq, D)` and log-sum-exp `(B, Hq, S)` float32, both contiguous."""
    out, lse = _interface()._flash_attn_fwd(q, k, v, softmax_scale=scale, causal=True, return_lse=True)[:2]
    return out.contiguous(), lse.contiguous()


@fa4_causal.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seq, heads, _ = q.shape
    out = q.new_empty((batch, seq, heads, v.shape[-1]))
    return out, q.new_empty((batch, heads, seq), dtype=torch.float32)


@fa4_causal.register_kernel("cpu")
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = _reference(q, k, v, scale)
    return out.to(q.dtype).contiguous(), lse.contiguous()


@torch.library.custom_op("gpuval::fa4_causal_backward", mutates_args=(), device_types="cuda")
def fa4_causal_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of q, k and v, each contiguous in its input's shape."""
    dq, dk, dv = _interface()._flash_attn_bwd(
        q, k, v, out, dout.contiguous(), lse, softmax_scale=scale, causal=True, deterministic=deterministic
    )
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@fa4_causal_backward.register_fake
def _(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: object
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@fa4_causal_backward.register_kernel("cpu")
def _(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention's backward written out (FlashAttention-2 paper, arXiv:2307.08691, section 2.3.1), in float32,
    from the saved log-sum-exp as FA4 does: P = exp(S - lse), dV = P^T dO, dP = dO V^T,
    dS = P * (dP - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q; grouped heads' dK and dV summed."""
    qh, kh, vh, oh, doh = (t.float().transpose(1, 2) for t in (q, k, v, out, dout))  # (B, H, S, D)
    groups = qh.shape[1] // kh.shape[1]
    kr, vr = kh.repeat_interleave(groups, 1), vh.repeat_interleave(groups, 1)
    probs = torch.exp(_causal_scores(qh, kr, scale) - lse.unsqueeze(-1))
    dv = probs.transpose(-1, -2) @ doh
    dscores = probs * (doh @ vr.transpose(-1, -2) - (doh * oh).sum(-1, keepdim=True))
    dq = scale * dscores @ kr
    dk = scale * dscores.transpose(-1, -2) @ qh

    def heads_back(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        batch, heads, seq, dim = grad.shape
        summed = grad.reshape(batch, heads // groups, groups, seq, dim).sum(2)
        return summed.transpose(1, 2).to(like.dtype).contiguous()

    return dq.transpose(1, 2).to(q.dtype).contiguous(), heads_back(dk, k), heads_back(dv, v)


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
    q, k, v, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.scale = scale
    ctx.mark_non_differentiable(lse)


def _backward(ctx: torch.autograd.function.FunctionCtx, dout: torch.Tensor, _dlse: torch.Tensor) -> tuple:
    q, k, v, out, lse = ctx.saved_tensors
    deterministic = torch.are_deterministic_algorithms_enabled()
    dq, dk, dv = fa4_causal_backward(dout, q, k, v, out, lse, ctx.scale, deterministic)
    return dq, dk, dv, None


fa4_causal.register_autograd(_backward, setup_context=_setup_context)


def _causal_scores(qh: torch.Tensor, kh: torch.Tensor, scale: float) -> torch.Tensor:
    """`scale * q k^T` over `(B, H, S, D)` heads, -inf above the diagonal (a query sees no later key)."""
    scores = qh @ kh.transpose(-1, -2) * scale
    seq = scores.shape[-1]
    future = torch.ones(seq, seq, dtype=torch.bool, device=qh.device).triu(1)
    return scores.masked_fill(future, float("-inf"))


def _reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 causal attention `(B, S, Hq, D)` and its log-sum-exp `(B, Hq, S)`, key/value heads repeated
    for grouped queries: what FA4 computes, by the definition."""
    qh, kh, vh = (t.float().transpose(1, 2) for t in (q, k, v))  # (B, H, S, D)
    groups = qh.shape[1] // kh.shape[1]
    scores = _causal_scores(qh, kh.repeat_interleave(groups, 1), scale)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse.unsqueeze(-1)) @ vh.repeat_interleave(groups, 1)
    return out.transpose(1, 2), lse

"""FlashAttention-4's kernels as the training step's causal attention: rows that hold one whole document
(`train.step.row_kernel: fa4`) and rows of packed documents (`train.step.varlen_kernel: fa4`).

FlashAttention-4 (the `flash-attn-4` package, Dao-AILab/flash-attention's `flash_attn.cute`) is written in
NVIDIA's CuTe DSL and compiled when first called, so it installs from a pure-Python wheel with no CUDA
build. Its Hopper (SM90) kernels are a port of FlashAttention-3's. On one H100 at Qwen2-7B's layer shape
(3 rows of 4,096 tokens, 28 query and 4 key/value heads of 128) its forward with backward took 2.36 ms
against cuDNN's 2.81 ms (backward 504 against 414 TFLOP/s), with the same largest errors against a float32
reference (benchmarks/results/2026-11-27-h100x1-attention-kernels/, benchmarks/NOTES.md item 27).

`causal_attention(q, k, v, scale)` takes token-major `(batch, tokens, heads, head size)` tensors (fewer
key/value heads than query heads is grouped-query attention, which FA4 runs natively) and returns the
output in the same layout; with `cu_seqlens` it takes one flattened row `(tokens, heads, head size)` of
packed documents and keeps each document's attention within it, as `varlen_attn` does. It is a PyTorch
custom operator pair (`gpuval::fa4_causal` and its backward), so that compiled layers call it as one opaque
kernel: torch.compile cannot trace the DSL's launch.

Each operator has a CPU kernel too: the same outputs (the attention and its log-sum-exp per query) from
PyTorch's math in float32, so the operators' autograd and fake-tensor wiring are tested where there is no
GPU. The trainer never sends CPU tensors here (on a CPU the `fa4` settings run SDPA).
"""

from __future__ import annotations

import functools
import math
from typing import Optional

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
    except Exception as exc:  # noqa: BLE001 - a broken install (a DSL library that fails to load) too
        return f"the {PACKAGE} package is not importable ({type(exc).__name__}: {exc})".splitlines()[0]
    return None


@functools.cache
def _interface():  # noqa: ANN202 - the module flash_attn.cute.interface
    from flash_attn.cute import interface

    return interface


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int = 0,
) -> torch.Tensor:
    """Causal attention of queries over keys and values, in the queries' shape. Rows: `(B, S, Hq, D)` over
    `(B, S, Hkv, D)`. Packed documents (`cu_seqlens` given): `(T, Hq, D)` over `(T, Hkv, D)`, each document
    `cu_seqlens[i]:cu_seqlens[i + 1]` (int32, from 0 to T) attending within itself, `max_seqlen` its
    longest."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return fa4_causal(q, k, v, cu_seqlens, max_seqlen, scale)[0]


def _varlen(cu_seqlens: torch.Tensor | None, max_seqlen: int) -> dict:
    if cu_seqlens is None:
        return {}
    return {
        "cu_seqlens_q": cu_seqlens,
        "cu_seqlens_k": cu_seqlens,
        "max_seqlen_q": max_seqlen,
        "max_seqlen_k": max_seqlen,
    }


@torch.library.custom_op("gpuval::fa4_causal", mutates_args=(), device_types="cuda")
def fa4_causal(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: Optional[torch.Tensor],  # noqa: UP045 - custom_op reads the annotation
    max_seqlen: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output in q's shape and float32 log-sum-exp, `(B, Hq, S)` for rows and `(Hq, T)` for packed
    documents, both contiguous."""
    out, lse = _interface()._flash_attn_fwd(
        q, k, v, softmax_scale=scale, causal=True, return_lse=True, **_varlen(cu_seqlens, max_seqlen)
    )[:2]
    return out.contiguous(), lse.contiguous()


@fa4_causal.register_fake
def _(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor | None, *_: object
) -> tuple:
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if cu_seqlens is None else (q.shape[1], q.shape[0])
    return out, q.new_empty(lse_shape, dtype=torch.float32)


@fa4_causal.register_kernel("cpu")
def _(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    max_seqlen: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    if cu_seqlens is None:
        out, lse = _reference(q, k, v, scale)
    else:  # each document as a row of one
        parts = [
            _reference(q[a:b][None], k[a:b][None], v[a:b][None], scale) for a, b in _documents(cu_seqlens)
        ]
        out = torch.cat([o[0] for o, _ in parts])
        lse = torch.cat([lse[0] for _, lse in parts], dim=1)
    return out.to(q.dtype).contiguous(), lse.contiguous()


@torch.library.custom_op("gpuval::fa4_causal_backward", mutates_args=(), device_types="cuda")
def fa4_causal_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens: Optional[torch.Tensor],  # noqa: UP045 - custom_op reads the annotation
    max_seqlen: int,
    scale: float,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of q, k and v, each contiguous in its input's shape."""
    dq, dk, dv = _interface()._flash_attn_bwd(
        q,
        k,
        v,
        out,
        dout.contiguous(),
        lse,
        softmax_scale=scale,
        causal=True,
        deterministic=deterministic,
        **_varlen(cu_seqlens, max_seqlen),
    )
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@fa4_causal_backward.register_fake
def _(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: object) -> tuple:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@fa4_causal_backward.register_kernel("cpu")
def _(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    max_seqlen: int,
    scale: float,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if cu_seqlens is None:
        grads = _reference_backward(dout, q, k, v, out, lse, scale)
    else:  # each document as a row of one
        parts = [
            _reference_backward(*(t[a:b][None] for t in (dout, q, k, v, out)), lse[None, :, a:b], scale)
            for a, b in _documents(cu_seqlens)
        ]
        grads = tuple(torch.cat([part[i][0] for part in parts]) for i in range(3))
    return tuple(g.to(t.dtype).contiguous() for g, t in zip(grads, (q, k, v), strict=True))  # type: ignore[return-value]


def _documents(cu_seqlens: torch.Tensor) -> list[tuple[int, int]]:
    bounds = cu_seqlens.tolist()
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def _reference_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention's backward written out (FlashAttention-2 paper, arXiv:2307.08691, section 2.3.1), in float32,
    from the saved log-sum-exp as FA4 does: P = exp(S - lse), dV = P^T dO, dP = dO V^T,
    dS = P * (dP - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q; grouped heads' dK and dV summed.
    `(B, S, H, D)` rows in, float32 gradients in the same layout out."""
    qh, kh, vh, oh, doh = (t.float().transpose(1, 2) for t in (q, k, v, out, dout))  # (B, H, S, D)
    groups = qh.shape[1] // kh.shape[1]
    kr, vr = kh.repeat_interleave(groups, 1), vh.repeat_interleave(groups, 1)
    probs = torch.exp(_causal_scores(qh, kr, scale) - lse.unsqueeze(-1))
    dv = probs.transpose(-1, -2) @ doh
    dscores = probs * (doh @ vr.transpose(-1, -2) - (doh * oh).sum(-1, keepdim=True))
    dq = scale * dscores @ kr
    dk = scale * dscores.transpose(-1, -2) @ qh

    def heads_back(grad: torch.Tensor) -> torch.Tensor:
        batch, heads, seq, dim = grad.shape
        return grad.reshape(batch, heads // groups, groups, seq, dim).sum(2).transpose(1, 2)

    return dq.transpose(1, 2), heads_back(dk), heads_back(dv)


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
    q, k, v, cu_seqlens, max_seqlen, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens)
    ctx.max_seqlen, ctx.scale = max_seqlen, scale
    ctx.mark_non_differentiable(lse)


def _backward(ctx: torch.autograd.function.FunctionCtx, dout: torch.Tensor, _dlse: torch.Tensor) -> tuple:
    q, k, v, out, lse, cu_seqlens = ctx.saved_tensors
    deterministic = torch.are_deterministic_algorithms_enabled()
    grads = fa4_causal_backward(dout, q, k, v, out, lse, cu_seqlens, ctx.max_seqlen, ctx.scale, deterministic)
    return *grads, None, None, None


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

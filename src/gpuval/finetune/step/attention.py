"""Per-document attention over packed rows (`train.step.attention`, `row_kernel`, `varlen_kernel`): the
attention implementation gpuval registers with transformers, and its part (AttentionPart).

Attention (`train.step.attention`)
- `sdpa`: transformers' SDPA with the explicit `(batch, 1, seq, seq)` document mask of packing.collate.
  Correct everywhere, but a dense mask rules out SDPA's flash kernel and costs 32 MiB per 4096-token row.
- `varlen`: each micro-batch is flattened to one row and attention runs per document through
  `torch.nn.attention.varlen.varlen_attn` (PyTorch's flash-attention varlen kernel, CUDA only), with
  `cu_seq_lens` built from the restarting position ids (packing.varlen_kwargs). No mask exists at all. It is
  registered with transformers as the attention implementation `gpuval_varlen` (AttentionInterface) and
  with no mask function: transformers then makes no mask and skips its packed-sequence check, whose
  `if tensor.all()` made the host wait for the GPU at every micro-batch's start. On a CPU the same
  function runs SDPA once per document, so the plumbing is tested where there is no GPU. The packed rows'
  kernel is `train.step.varlen_kernel`: `flash` (varlen_attn) or `fa4` (FlashAttention-4's varlen kernels,
  flash4.py; auto on Hopper where installed).
- `auto`: varlen, on a GPU and on a CPU (there per-document SDPA skips the masked-out work: faster); sdpa on
  a GPU when the weights are float32 (the flash kernels take bf16/fp16 only; float32 trains without autocast).

Rows that hold one whole document each (`train.step.row_kernel`): fixed-length data (`bench train` mode fixed)
has one document per row, so no row needs varlen bookkeeping: the micro-batch stays `(batch, seq)` and
each row gets plain causal attention: `fa4` (FlashAttention-4's Hopper/Blackwell kernels from the
flash-attn-4 package, flash4.py), or SDPA with the chosen backend, `cudnn` (cuDNN's fused attention) or
`flash` (FA2, as varlen_attn); `varlen` flattens them like packed rows.

What each kernel bought: benchmarks/NOTES.md.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.nn.functional as F

from gpuval.errors import UsageError
from gpuval.finetune.parts import Decision, Part, RowLayout, StepContext
from gpuval.finetune.step import flash4

VARLEN = "gpuval_varlen"  # the attention implementation name registered with transformers


# -- attention ------------------------------------------------------------------------------------------


def _attention(setting: str, on_gpu: bool, dtype: str = "bfloat16") -> str:
    """`sdpa` or `varlen` for `train.step.attention` (auto: varlen); varlen needs varlen_attn on a GPU. On a
    CPU varlen runs causal SDPA per document, which skips what a dense (seq, seq) document mask computes and
    throws away; measured faster on the dev CPU too (benchmarks/results/2026-11-24-cpu-finetune/).
    On a GPU the varlen kernels (flash, FA4) take bfloat16/float16 only, and float32 weights train without
    autocast (trainer.py): there auto is sdpa, and varlen set by hand a usage error."""
    half = dtype in ("bfloat16", "float16")
    choice = ("varlen" if half or not on_gpu else "sdpa") if setting == "auto" else setting
    if choice == "varlen" and on_gpu and not half:
        raise UsageError(
            f"train.step.attention=varlen runs flash kernels, which take bfloat16 or float16 only, and the "
            f"weights are {dtype}: set dtype: bfloat16, or train.step.attention=sdpa (or auto)"
        )
    if choice == "varlen" and on_gpu and _varlen_attn() is None:
        raise UsageError(
            f"train.step.attention=varlen needs torch.nn.attention.varlen (PyTorch >= 2.10; this is "
            f"{torch.__version__}): upgrade torch or set train.step.attention=sdpa"
        )
    return choice


def use_varlen_attention(model: Any, row_kernel: str = "varlen", varlen_kernel: str = "flash") -> None:
    """Switch a transformers model to the `gpuval_varlen` attention (registered once per process);
    `row_kernel` (AttentionPart's decision) is the kernel of rows that are one whole document each,
    `varlen_kernel` that of rows of packed documents."""
    global _ROW_KERNEL, _VARLEN_KERNEL, _CUDNN_GQA
    _register_varlen()
    _ROW_KERNEL, _VARLEN_KERNEL = row_kernel, varlen_kernel
    if row_kernel == "cudnn" and torch.cuda.is_available():
        _CUDNN_GQA = _cudnn_gqa(torch.device("cuda", torch.cuda.current_device()))
    model.set_attn_implementation(VARLEN)


ROW_KERNELS = ("fa4", "cudnn", "flash", "varlen")


def _row_kernel(setting: str, on_gpu: bool) -> str:
    """`train.step.row_kernel`: fa4, cudnn, flash or varlen for rows holding one whole document. auto on a
    Hopper GPU (compute capability 9.x): fa4 where flash-attn-4 is installed, else cudnn where PyTorch has
    cuDNN; varlen otherwise. On an H100, FA4's kernel is the fastest for whole-document rows and cuDNN's
    the next (benchmarks/NOTES.md items 27 and earlier, benchmarks/results/2026-11-27-h100x1-attention-
    kernels/ and 2026-11-23-h100x1-finetune-speed/)."""
    if setting == "auto":
        if _fa4_auto(on_gpu):
            return "fa4"
        return "cudnn" if _hopper(on_gpu) and torch.backends.cudnn.is_available() else "varlen"
    choice = _fa4_or_error("row_kernel", setting, on_gpu)
    if choice == "cudnn" and on_gpu and not torch.backends.cudnn.is_available():
        raise UsageError(
            "train.step.row_kernel=cudnn needs a PyTorch built with cuDNN: set train.step.row_kernel=auto"
        )
    return choice  # on a CPU cudnn and flash both mean: whole rows, plain causal SDPA


VARLEN_KERNELS = ("fa4", "flash")


def _varlen_kernel(setting: str, on_gpu: bool) -> str:
    """`train.step.varlen_kernel`: fa4 or flash (`varlen_attn`, FlashAttention-2) for rows of packed
    documents.
    auto: fa4 on a Hopper GPU where flash-attn-4 is installed, else flash. On a CPU both run SDPA per
    document."""
    if setting == "auto":
        return "fa4" if _fa4_auto(on_gpu) else "flash"
    return _fa4_or_error("varlen_kernel", setting, on_gpu)


def _hopper(on_gpu: bool) -> bool:
    return on_gpu and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _fa4_auto(on_gpu: bool) -> bool:
    """auto's choice of FA4: on Hopper (where it was measured) when it can run."""
    return _hopper(on_gpu) and flash4.unavailable_reason() is None


def _fa4_or_error(setting: str, choice: str, on_gpu: bool) -> str:
    if choice == "fa4" and on_gpu and (reason := flash4.unavailable_reason()):
        raise UsageError(
            f"train.step.{setting}=fa4: {reason}; install flash-attn-4 (pip install 'gpuval[fa4]') or set "
            f"train.step.{setting}=auto"
        )
    return choice


@functools.cache
def _register_varlen() -> None:
    from transformers import AttentionInterface

    global _VARLEN_CAUSAL, _VARLEN_GQA, _VARLEN_NATIVE_GQA
    if _varlen_attn() is not None:
        parameters = inspect.signature(_varlen_attn()).parameters
        # PyTorch 2.11 and later: window_size=(-1, 0) is causal; earlier ones take is_causal.
        _VARLEN_CAUSAL = {"window_size": (-1, 0)} if "window_size" in parameters else {"is_causal": True}
        _VARLEN_GQA = "enable_gqa" in parameters
        if not _VARLEN_GQA and torch.cuda.is_available():
            _VARLEN_NATIVE_GQA = _native_gqa(torch.device("cuda", torch.cuda.current_device()))
    # No AttentionMaskInterface entry: for an implementation without one, create_causal_mask returns None
    # at once. With one (even a function making no mask) it first runs find_packed_sequence_indices on the
    # position ids, whose data-dependent `if` synchronises the host with the GPU at every forward.
    AttentionInterface.register(VARLEN, varlen_attention)


# Set once by _register_varlen (plain globals, so that torch.compile traces varlen_attention without breaks).
_VARLEN_CAUSAL: dict[str, Any] = {}
_VARLEN_GQA = False
_VARLEN_NATIVE_GQA = False
_ROW_KERNEL = "varlen"  # use_varlen_attention: SDPA backend of whole-document rows
_VARLEN_KERNEL = "flash"  # use_varlen_attention: kernel of packed rows (flash: varlen_attn; fa4)
_CUDNN_GQA = False  # whether cuDNN's SDPA takes fewer K/V heads than query heads (enable_gqa)


@functools.cache
def _varlen_attn() -> Any:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: query `(1, Hq, T, D)`, key/value `(1, Hkv, T, D)` of one flattened
    row, documents given by `cu_seq_lens_q` (int32, `[0, s0, s0+s1, ..., T]`) and `max_length_q`; returns
    `(1, T, Hq, D)`. Causal inside each document, nothing across documents."""
    if dropout:
        raise ValueError("varlen attention has no attention dropout")
    cu = kwargs.get("cu_seq_lens_q")
    heads, kv_heads = query.shape[1], key.shape[1]
    if cu is None:  # rows that are one whole document each (flatten_for_varlen left them as they are)
        return _causal_rows(query, key, value, scaling), None
    if query.is_cuda:
        from torch.nn.attention.varlen import varlen_attn

        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (T, H, D) views, no copy
        if torch.is_autocast_enabled("cuda") and q.dtype == torch.float32:
            # fp32 weights under autocast (tiny.pretrain): RoPE's fp32 cos/sin promote q and k; the flash
            # kernel takes bf16/fp16 only, as SDPA under autocast would run it
            half = torch.get_autocast_dtype("cuda")
            q, k, v = q.to(half), k.to(half), v.to(half)
        longest = int(kwargs["max_length_q"])
        if _VARLEN_KERNEL == "fa4":
            return flash4.causal_attention(q, k, v, scaling, cu_seqlens=cu, max_seqlen=longest).unsqueeze(
                0
            ), None
        extra: dict[str, Any] = dict(_VARLEN_CAUSAL)
        if heads != kv_heads:
            if _VARLEN_GQA:
                extra["enable_gqa"] = True
            elif not _VARLEN_NATIVE_GQA:
                k = k.repeat_interleave(heads // kv_heads, dim=1)
                v = v.repeat_interleave(heads // kv_heads, dim=1)
        out = varlen_attn(q, k, v, cu, cu, longest, longest, scale=scaling, **extra)
        return out.unsqueeze(0), None
    # CPU: the same result, one SDPA call per document.
    bounds = cu.tolist()
    parts = [
        F.scaled_dot_product_attention(
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            is_causal=True,
            scale=scaling,
            enable_gqa=heads != kv_heads,
        )
        for start, end in zip(bounds[:-1], bounds[1:], strict=True)
        if end > start
    ]
    return torch.cat(parts, dim=2).transpose(1, 2), None


def _causal_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None) -> Any:
    """Causal attention within each row `(B, H, S, D)` -> `(B, S, Hq, D)`, on a GPU through SDPA's backend
    `_ROW_KERNEL` only (sdpa_kernel: an unavailable kernel is an error, not a silent fallback)."""
    gqa = query.shape[1] != key.shape[1]
    if not query.is_cuda:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa)
        return out.transpose(1, 2)
    if _ROW_KERNEL == "fa4":  # token-major views in and out, no copy
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        if torch.is_autocast_enabled("cuda") and q.dtype == torch.float32:  # as in varlen_attention
            half = torch.get_autocast_dtype("cuda")
            q, k, v = q.to(half), k.to(half), v.to(half)
        return flash4.causal_attention(q, k, v, scaling)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if gqa and _ROW_KERNEL == "cudnn" and not _CUDNN_GQA:
        repeat = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
        gqa = False
    backend = SDPBackend.CUDNN_ATTENTION if _ROW_KERNEL == "cudnn" else SDPBackend.FLASH_ATTENTION
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2)


def _cudnn_gqa(device: torch.device) -> bool:
    """Whether this PyTorch's cuDNN SDPA takes `enable_gqa` (fewer K/V heads) and matches repeated heads,
    forward and backward; checked once on small tensors. If not, K/V heads are repeated for it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(2, h, 128, 64, device=device, dtype=torch.bfloat16, generator=generator).requires_grad_()
        for h in (4, 2, 2)
    )
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            native = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            grads = torch.autograd.grad(native.float().square().sum(), (q, k, v))
    except (RuntimeError, ValueError):
        return False
    k2, v2 = (t.repeat_interleave(2, dim=1) for t in (k, v))
    repeated = F.scaled_dot_product_attention(q, k2, v2, is_causal=True)
    grads_ref = torch.autograd.grad(repeated.float().square().sum(), (q, k, v))
    same = torch.allclose(native, repeated, atol=1e-2, rtol=1e-2) and all(
        torch.allclose(a, b, atol=2e-2, rtol=2e-2) for a, b in zip(grads, grads_ref, strict=True)
    )
    return bool(same)


def _native_gqa(device: torch.device) -> bool:
    """Whether this PyTorch's varlen_attn, which has no enable_gqa argument (2.11), still takes fewer K/V
    heads than query heads, as the flash-attention kernel under it does, and gives the answer of repeated
    K/V heads, forward and backward. Checked once on small tensors; if not, K/V heads are repeated (a copy
    of K and V per layer)."""
    from torch.nn.attention.varlen import varlen_attn

    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(96, h, 64, device=device, dtype=torch.bfloat16, generator=generator).requires_grad_()
        for h in (4, 2, 2)
    )
    cu = torch.tensor([0, 40, 96], device=device, dtype=torch.int32)
    try:
        native = varlen_attn(q, k, v, cu, cu, 56, 56, **_VARLEN_CAUSAL)
    except (RuntimeError, ValueError):
        return False
    grads = torch.autograd.grad(native.float().square().sum(), (q, k, v))
    k2, v2 = (t.repeat_interleave(2, dim=1) for t in (k, v))
    repeated = varlen_attn(q, k2, v2, cu, cu, 56, 56, **_VARLEN_CAUSAL)
    grads_ref = torch.autograd.grad(repeated.float().square().sum(), (q, k, v))
    same = torch.allclose(native, repeated, atol=1e-2, rtol=1e-2) and all(
        torch.allclose(a, b, atol=2e-2, rtol=2e-2) for a, b in zip(grads, grads_ref, strict=True)
    )
    return bool(same)


class AttentionPart(Part):
    """Attention kernels: varlen routing (`train.step.attention`, `row_kernel`, `varlen_kernel`).

    Applies when attention resolves to varlen (auto: on a CPU, and on a GPU with bf16/fp16 weights); off with
    `attention: sdpa`
    (transformers' SDPA with a dense document mask). An explicit kernel that cannot run here (fa4 without
    flash-attn-4, cudnn without cuDNN, varlen without torch's varlen_attn) is a UsageError.
    Changes: registers the `gpuval_varlen` attention implementation and switches the bare model to it; the
    row and packed-row kernels are module globals read by `varlen_attention` (one model per process).
    Reports `attention`, `row_kernel`, `varlen_kernel` (the kernels as resolved, also when off); sets the
    context's RowLayout (varlen rows, whole rows kept where a row kernel of their own runs them).
    Order: on the bare model (stage base), before LoRA; batches.py flattens rows for it
    (`flatten_for_varlen`) when it is on."""

    name = "attention"
    stage = "base"
    reports = {
        "attention": "sdpa",
        "row_kernel": lambda decision: decision.settings["row_kernel"],
        "varlen_kernel": lambda decision: decision.settings["varlen_kernel"],
    }

    def decide(self, ctx: StepContext) -> Decision:
        step = ctx.step
        choice = _attention(step.attention, ctx.on_gpu, ctx.dtype)
        kernels = {
            "row_kernel": _row_kernel(step.row_kernel, ctx.on_gpu),
            "varlen_kernel": _varlen_kernel(step.varlen_kernel, ctx.on_gpu),
        }
        source = "auto" if step.attention == "auto" else "set"
        why = f"{source}; rows {kernels['row_kernel']}, packed rows {kernels['varlen_kernel']}"
        return Decision(choice == "varlen", choice, why, settings=kernels)

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        use_varlen_attention(model, decision.settings["row_kernel"], decision.settings["varlen_kernel"])
        ctx.layout = RowLayout(varlen=True, whole_rows=decision.settings["row_kernel"] != "varlen")
        return {"attention": "varlen", **decision.settings}

"""The fast training step's kernels: varlen attention over packed documents, Liger-Kernel's fused
operators and its fused linear + cross-entropy (issue 5; what each one bought: benchmarks/NOTES.md).

Attention (`train.attention`)
- `sdpa`: transformers' SDPA with the explicit `(batch, 1, seq, seq)` document mask of packing.collate.
  Correct everywhere, but a dense mask rules out SDPA's flash kernel and costs 32 MiB per 4096-token row.
- `varlen`: each micro-batch is flattened to one row and attention runs per document through
  `torch.nn.attention.varlen.varlen_attn` (PyTorch's flash-attention varlen kernel, CUDA only), with
  `cu_seq_lens` built from the restarting position ids (packing.varlen_kwargs). No mask exists at all. It is
  registered with transformers as the attention implementation `gpuval_varlen` (AttentionInterface) and
  with no mask function: transformers then makes no mask and skips its packed-sequence check, whose
  `if tensor.all()` made the host wait for the GPU at every micro-batch's start. On a CPU the same
  function runs SDPA once per document, so the plumbing is tested where there is no GPU. The packed rows'
  kernel is `train.varlen_kernel`: `flash` (varlen_attn) or `fa4` (FlashAttention-4's varlen kernels,
  flash4.py; auto on Hopper where installed).
- `auto`: varlen, on a GPU and on a CPU (there per-document SDPA skips the masked-out work: faster).

Rows that hold one whole document each (`train.row_kernel`): fixed-length data (`bench train` mode fixed)
has one document per row, so no row needs varlen bookkeeping: the micro-batch stays `(batch, seq)` and
each row gets plain causal attention: `fa4` (FlashAttention-4's Hopper/Blackwell kernels from the
flash-attn-4 package, flash4.py), or SDPA with the chosen backend, `cudnn` (cuDNN's fused attention) or
`flash` (FA2, as varlen_attn); `varlen` flattens them like packed rows.

Kernels (`train.kernels`)
- `liger`: Liger-Kernel (linkedin/Liger-Kernel, as TRL/Axolotl's `use_liger_kernel`) RMSNorm, SwiGLU and
  RoPE in the model, and its fused linear + cross-entropy for the loss: the output head's logits (152,064
  per token for Qwen2) are computed and reduced chunk by chunk and never exist in full. The fused loss needs
  the whole output-head weight on the rank, so it is used with `train.parallel: ddp` only (FSDP and ZeRO-3
  shard it); the other kernels work with all three.
- `liger-loss`: the fused linear + cross-entropy alone (with `train.compile`, which fuses the rest). With
  gpuval's own loss kernel (the default) it needs no Liger at all.
- `torch`: transformers' own modules and `F.cross_entropy` over the full logits.
- `auto`: on a GPU, liger-loss with `train.compile`, else liger where the package is installed and
  liger-loss where not; torch on a CPU.

Which fused linear + cross-entropy runs is `train.loss_kernel`: gpuval's chunked one by default
(linear_ce.py: the same computation without Liger's host reads, in larger chunks), or Liger's.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gpuval.errors import UsageError
from gpuval.finetune import flash4
from gpuval.finetune.linear_ce import linear_cross_entropy
from gpuval.finetune.template import IGNORE_INDEX

VARLEN = "gpuval_varlen"  # the attention implementation name registered with transformers


# -- attention ------------------------------------------------------------------------------------------


def resolve_attention(setting: str, on_gpu: bool) -> str:
    """`sdpa` or `varlen` for `train.attention` (auto: varlen); varlen needs varlen_attn on a GPU. On a CPU
    varlen runs causal SDPA per document, which skips what a dense (seq, seq) document mask computes and
    throws away; measured faster on the dev CPU too (benchmarks/results/2026-11-24-cpu-finetune/)."""
    choice = "varlen" if setting == "auto" else setting
    if choice == "varlen" and on_gpu and _varlen_attn() is None:
        raise UsageError(
            f"train.attention=varlen needs torch.nn.attention.varlen (PyTorch >= 2.10; this is "
            f"{torch.__version__}): upgrade torch or set train.attention=sdpa"
        )
    return choice


def use_varlen_attention(model: Any, row_kernel: str = "varlen", varlen_kernel: str = "flash") -> None:
    """Switch a transformers model to the `gpuval_varlen` attention (registered once per process);
    `row_kernel` (resolve_row_kernel) is the kernel of rows that are one whole document each,
    `varlen_kernel` (resolve_varlen_kernel) that of rows of packed documents."""
    global _ROW_KERNEL, _VARLEN_KERNEL, _CUDNN_GQA
    _register_varlen()
    _ROW_KERNEL, _VARLEN_KERNEL = row_kernel, varlen_kernel
    if row_kernel == "cudnn" and torch.cuda.is_available():
        _CUDNN_GQA = _cudnn_gqa(torch.device("cuda", torch.cuda.current_device()))
    model.set_attn_implementation(VARLEN)


ROW_KERNELS = ("fa4", "cudnn", "flash", "varlen")


def resolve_row_kernel(setting: str, on_gpu: bool) -> str:
    """`train.row_kernel`: fa4, cudnn, flash or varlen for rows holding one whole document. auto on a
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
        raise UsageError("train.row_kernel=cudnn needs a PyTorch built with cuDNN: set train.row_kernel=auto")
    return choice  # on a CPU cudnn and flash both mean: whole rows, plain causal SDPA


VARLEN_KERNELS = ("fa4", "flash")


def resolve_varlen_kernel(setting: str, on_gpu: bool) -> str:
    """`train.varlen_kernel`: fa4 or flash (`varlen_attn`, FlashAttention-2) for rows of packed documents.
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
            f"train.{setting}=fa4: {reason}; install flash-attn-4 (pip install 'gpuval[fa4]') or set "
            f"train.{setting}=auto"
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


def flatten_for_varlen(
    batch: dict[str, torch.Tensor], max_length: int | None = None, whole_rows: bool = False
) -> dict[str, Any]:
    """A collated micro-batch `(B, S)` as one row `(1, B·S)` plus varlen keyword arguments. The first label of
    every document is IGNORE_INDEX (packing.Pack.add), so the loss across a row boundary is unchanged.
    `max_length`: a fixed bound to pass as the longest document instead of the batch's own (the kernel
    only sizes its grid by it), so that a compiled model sees one value and never recompiles for it.
    `whole_rows`: when every row is one document filling it (position ids 0..S-1), keep `(B, S)` with no
    varlen arguments: varlen_attention then runs causal attention per row (`_causal_rows`)."""
    from gpuval.finetune.packing import varlen_kwargs

    positions = batch["position_ids"]
    if whole_rows and bool((positions == torch.arange(positions.shape[1])).all()):
        return {key: batch[key] for key in ("input_ids", "labels", "position_ids")}
    flat = {key: batch[key].reshape(1, -1) for key in ("input_ids", "labels", "position_ids")}
    extra = varlen_kwargs(batch["position_ids"])
    if max_length is not None:
        extra["max_length_q"] = extra["max_length_k"] = max_length
    return {**flat, **extra}


# -- Liger-Kernel ----------------------------------------------------------------------------------------


def resolve_kernels(setting: str, on_gpu: bool, compiled: bool = False, loss_kernel: str = "auto") -> str:
    """`liger`, `liger-loss` or `torch` for `train.kernels`, with `train.loss_kernel`. auto on a GPU:
    liger-loss when the layers are compiled (compiling fuses the rest: measured faster, benchmarks/NOTES.md),
    else liger where Liger-Kernel is installed and liger-loss where it is not; torch on a CPU. The fused loss
    of liger-loss and liger is gpuval's own (linear_ce.py) unless `loss_kernel` is liger, so only Liger's
    model kernels (liger) and Liger's loss need the package."""
    available = on_gpu and _liger_installed()
    if loss_kernel == "liger" and setting != "torch" and not available:
        why = "runs on CUDA GPUs only" if not on_gpu else "is not installed: pip install 'gpuval[gpu]'"
        raise UsageError(f"train.loss_kernel=liger: Liger-Kernel {why}; set train.loss_kernel=auto")
    if setting == "auto":
        if not on_gpu:
            return "torch"
        return "liger" if available and not compiled else "liger-loss"
    if setting == "liger" and not available:
        why = "runs on CUDA GPUs only" if not on_gpu else "is not installed: pip install 'gpuval[gpu]'"
        raise UsageError(f"train.kernels=liger: Liger-Kernel {why}; set train.kernels=liger-loss or torch")
    return setting


def missing_liger_note(setting: str, on_gpu: bool, resolved: str, compiled: bool) -> str | None:
    """The start-up line when `auto` on a GPU ran uncompiled layers without Liger's RMSNorm, SwiGLU and RoPE
    because Liger-Kernel is not installed (the fused loss, where the run has one, is gpuval's own either
    way), else None."""
    if setting != "auto" or not on_gpu or compiled or resolved != "liger-loss":
        return None
    return (
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
    them); the loss is separate (FusedLoss)."""
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(
        model=model,
        rope=True,
        rms_norm=True,
        swiglu=True,
        cross_entropy=False,
        fused_linear_cross_entropy=False,
    )


def label_rows(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions of `labels` `(B, S)` whose next token is a target, as rows of the flattened `(B·S)`
    output, and those targets: position t of row b predicts label t+1. Made on the host with the batch
    (batches.py), so the loss picks its rows without waiting for the GPU."""
    width = labels.shape[1]
    batch_index, position = (labels[:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)
    return batch_index * width + position, labels[batch_index, position + 1]


@dataclass
class LossHead:
    """Summed next-token cross-entropy of a micro-batch from the model's output, over the labelled rows only
    (`label_rows`): about half of a fine-tune's tokens are prompt, system and tool text that no loss reads.

    Plain: the model returns logits and F.cross_entropy reduces the labelled rows in float32. Fused: the
    model's output head is replaced by an identity, so the model returns the final hidden states, and a
    fused linear cross-entropy (`train.loss_kernel`: gpuval's chunked one, linear_ce.py, or Liger's)
    applies the head weight chunk by chunk to the labelled rows alone:
    the output head's products (2 × 152,064 × 3,584 FLOPs per row for Qwen2-7B, forward and again for the
    gradient) are spent on no row the loss ignores."""

    fused: Any = None  # (weight, hidden, targets) -> summed loss: linear_ce's or Liger's; None: plain
    weight: torch.Tensor | None = None  # the output head's weight, for the fused loss

    @classmethod
    def plain(cls) -> LossHead:
        return cls()

    @classmethod
    def fuse(cls, causal_lm: torch.nn.Module, kernel: str = "chunked") -> LossHead:
        """Take the output head out of `causal_lm` (a transformers CausalLM, unwrapped) for the fused loss:
        `kernel` chunked (linear_ce.py, gpuval's own) or liger (Liger's fused linear cross-entropy)."""
        head = causal_lm.get_output_embeddings()
        if type(head) is not torch.nn.Linear or head.bias is not None or head.weight.requires_grad:
            raise UsageError(
                "train.kernels=liger: the fused loss needs a frozen, bias-free nn.Linear output head; "
                "set train.kernels=torch"
            )
        causal_lm.set_output_embeddings(torch.nn.Identity())
        if kernel == "chunked":  # called as Liger's loss is: (weight, hidden, targets)
            return cls(fused=lambda w, h, t: linear_cross_entropy(h, w, t), weight=head.weight)
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        loss = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")
        return cls(fused=loss, weight=head.weight)

    def __call__(
        self, output: torch.Tensor, rows: torch.Tensor | None, targets: torch.Tensor
    ) -> torch.Tensor:
        """`output`: logits `(B, S, V)`, or hidden states `(B, S, d)` when fused; `rows`, `targets`: from
        `label_rows` of the micro-batch's labels, on the output's device. `rows` None: `output` holds the
        labelled rows alone already, in order (the model was given `logits_to_keep=rows`)."""
        if targets.numel() == 0:  # no target in the micro-batch: a zero that still reaches the graph
            return output.sum() * 0
        picked = output.flatten(0, 1) if rows is None else output.flatten(0, 1).index_select(0, rows)
        if self.fused is not None:
            return self.fused(self.weight, picked, targets)
        return F.cross_entropy(picked.float(), targets, reduction="sum")


class LastMlpRows:
    """The last decoder layer's MLP on the labelled rows alone (`train.last_mlp_rows: labelled`).

    The loss reads the final hidden states at the labelled rows only (`label_rows`, `LossHead`), and after
    the last layer's attention nothing mixes positions: its MLP, the residual add and the final norm act on
    each row alone. So that MLP's products (forward and input gradient: seven eighths of the layer's base
    products for Qwen2-7B) are needed on those rows only. While `rows` is set, the MLP runs on them and
    returns zeros elsewhere; the final hidden states of the other rows are then wrong and must not be read,
    so `rows` is set around one micro-batch's forward and backward (backward too: activation checkpointing
    runs the forward again) and is None otherwise (evaluation, generation). The module tree is untouched:
    only the MLP instance's `forward` is replaced, as fused_qkv does, so weights and adapters save as before.
    """

    def __init__(self, mlp: torch.nn.Module) -> None:
        self.rows: torch.Tensor | None = None
        self._forward = mlp.forward
        mlp.forward = self.forward

    @classmethod
    def attach(cls, layers: list[torch.nn.Module]) -> LastMlpRows | None:
        """On the last of `layers` when its MLP is a dense gated one (gate, up and down projections: each
        position alone, unlike a mixture of experts with a capacity); else None (the step runs as it was)."""
        mlp = getattr(layers[-1], "mlp", None) if layers else None
        dense = mlp is not None and all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj"))
        return cls(mlp) if dense and not hasattr(mlp, "experts") else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.rows
        if rows is None:
            return self._forward(x)
        flat = x.reshape(-1, x.shape[-1])
        picked = self._forward(flat.index_select(0, rows))
        return torch.zeros_like(flat).index_copy(0, rows, picked.to(flat.dtype)).view_as(x)

    def use(self, rows: torch.Tensor | None) -> None:
        """`rows` (from `label_rows`, on the device) for the coming forward and backward; None for all.
        The row count changes every micro-batch: marked dynamic so a compiled layer does not recompile."""
        if rows is not None and rows.numel() < 2:  # 0 or 1 rows: shapes compile specialises; run them all
            rows = None
        if rows is not None:
            torch._dynamo.maybe_mark_dynamic(rows, 0)
        self.rows = rows

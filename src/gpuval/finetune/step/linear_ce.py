"""The output head and the cross-entropy as one chunked operation that never waits for the host.

`linear_cross_entropy(hidden, weight, targets, chunk)` is the summed next-token cross-entropy of
`hidden @ weight.T` at `targets`, with the `(rows, vocabulary)` logits made `chunk` rows at a time: each
chunk's logits are made, reduced and turned into their gradient, which goes straight back through the head
(`d_hidden = d_logits @ weight`), so no chunk's logits outlive it (152,064 logits per row for Qwen2). The
backward only scales that saved input gradient by the incoming one. This is what Liger-Kernel's fused
linear cross-entropy does (and the Liger authors' paper, arXiv:2410.10989, section 3.2); gpuval's own
version exists for two measured reasons (benchmarks/NOTES.md item 12: in one run on one H100 the bf16
step was 0.75 % faster with it than with Liger's, benchmarks/results/2026-11-26-h100x1-step-round3/):

- Liger 0.8.5 reads values back to the host in every call (`.item()` of the target count in the forward,
  a copy and `torch.equal` of the incoming gradient in the backward). Each read waits until the GPU has run
  everything queued before it, so the GPU then idles while the host launches the next kernels: about
  0.5-1 ms per micro-batch in the 2026-11-26 profile. Here the row count comes from the host already
  (`label_rows` finds the rows there) and nothing is read back.
- Liger sizes its chunks to about `rows / (vocabulary / hidden)`, which for 7,000 labelled rows of Qwen2-7B
  is 256 rows: a `256 x 152,064 x 3,584` product runs below the speed of a larger one (step_products.py).

Per chunk, in float32 inside one compiled kernel pair: `lse = logsumexp(logits)`, loss `lse - logit[t]`,
gradient `softmax(logits) - onehot(t)` written in the logits' dtype (as Liger does). The products run in
the input's dtype (bf16 under the trainer's autocast) with float32 accumulation in cuBLAS.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

DEFAULT_CHUNK = 2048  # rows per chunk: 623 MB of bf16 logits for Qwen2's vocabulary


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = DEFAULT_CHUNK
) -> torch.Tensor:
    """Summed cross-entropy of `hidden (rows, d) @ weight (V, d).T` at `targets (rows,)` (every target a
    real class: ignored positions are left out before, see kernels.label_rows). A 0-d float32 tensor
    (float64 for float64 inputs); gradients reach `hidden` only (the head is frozen)."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 row, got {chunk}")
    if weight.requires_grad:
        raise ValueError("linear_cross_entropy: the output head must be frozen (no weight gradient is made)")
    return _LinearCrossEntropy.apply(hidden, weight, targets, chunk)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
    ) -> Any:
        dtype = torch.get_autocast_dtype("cuda") if _autocast(hidden) else hidden.dtype
        hidden_c, weight_c = hidden.to(dtype), weight.to(dtype)
        rows = hidden.shape[0]
        grad = torch.empty_like(hidden_c)
        total = torch.zeros((), dtype=_wide(hidden_c.dtype), device=hidden.device)
        step = _loss_and_grad(hidden.is_cuda)
        for start in range(0, rows, chunk):
            part = slice(start, min(start + chunk, rows))
            logits = hidden_c[part] @ weight_c.t()
            picked = targets[part]
            if hidden.is_cuda:  # one compiled kernel pair for every chunk length (the last one differs)
                torch._dynamo.maybe_mark_dynamic(logits, 0)
                torch._dynamo.maybe_mark_dynamic(picked, 0)
            loss, d_logits = step(logits, picked)
            total += loss
            torch.mm(d_logits, weight_c, out=grad[part])
        ctx.save_for_backward(grad)
        ctx.hidden_dtype = hidden.dtype
        return total

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        (grad,) = ctx.saved_tensors
        return (grad * grad_output.to(grad.dtype)).to(ctx.hidden_dtype), None, None, None


def _wide(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 inputs (the CPU tests' exact reference)."""
    return torch.promote_types(dtype, torch.float32)


def _autocast(hidden: torch.Tensor) -> bool:
    return hidden.is_cuda and torch.is_autocast_enabled("cuda")


def chunk_loss_and_grad(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy of the rows of `logits (c, V)` at `targets (c,)` and its gradient with respect
    to the logits, in float32 inside; the gradient in the logits' dtype."""
    x = logits.to(_wide(logits.dtype))
    lse = torch.logsumexp(x, dim=-1)
    picked = x.gather(1, targets.unsqueeze(1)).squeeze(1)
    columns = torch.arange(x.shape[1], device=x.device)
    onehot = (columns.unsqueeze(0) == targets.unsqueeze(1)).to(x.dtype)
    d_logits = torch.exp(x - lse.unsqueeze(1)) - onehot
    return (lse - picked).sum(), d_logits.to(logits.dtype)


@functools.cache
def _loss_and_grad(on_gpu: bool) -> Any:
    """On a GPU the chunk's reduction and gradient compiled into fused kernels (eager on a CPU)."""
    return torch.compile(chunk_loss_and_grad) if on_gpu else chunk_loss_and_grad

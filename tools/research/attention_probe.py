"""Issue 5: which causal attention kernel is fastest for the Qwen2-7B training shape on this GPU.

    python tools/research/attention_probe.py --output attention.json      # on a GPU machine

One layer's attention, forward + backward, bf16, the shape of `gpuval bench train` at micro-batch 2:
2 rows of 4,096 tokens, 28 query heads, 4 K/V heads, head dim 128, causal. Inputs are laid out as the
model makes them (`(B, S, H, D)` memory seen as `(B, H, S, D)`). Candidates:

- `varlen`: `torch.nn.attention.varlen.varlen_attn` over the two rows flattened (what packed rows run);
- `sdpa-flash`, `sdpa-cudnn`, `sdpa-efficient`: SDPA causal per row with that backend alone, K/V heads
  given as they are (`enable_gqa`); `sdpa-cudnn-repeat`: cuDNN with K/V repeated to 28 heads (the copy
  is timed too); `sdpa-default`: SDPA's own choice.

Each: 5 untimed calls, then 20 timed fwd+bwd calls, CUDA events per call; median and range in ms and
TFLOP/s (causal attention FLOPs: forward 4·B·S²·H·D/2, backward 2.5× forward — FlashAttention-2 paper,
section 4.1 benchmarks, causal halves the S² term). The output and gradients of each are compared with
varlen's (max abs difference). `compile`: whether gpuval's row kernel compiles without a graph break.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, S, HQ, HKV, D = 2, 4096, 28, 4, 128


def flops() -> float:
    forward = 4 * B * S * S * HQ * D / 2  # causal: half the score matrix
    return forward * 3.5  # forward + backward (2.5x forward)


def inputs(generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    def one(heads: int) -> torch.Tensor:
        t = torch.randn(B, S, heads, D, device="cuda", dtype=torch.bfloat16, generator=generator)
        return t.transpose(1, 2).requires_grad_()  # (B, H, S, D) view of (B, S, H, D) memory

    return one(HQ), one(HKV), one(HKV)


def candidates() -> dict[str, Any]:
    from torch.nn.attention.varlen import varlen_attn

    cu = torch.tensor([0, S, 2 * S], device="cuda", dtype=torch.int32)

    def varlen(q, k, v):
        flat = [t.transpose(1, 2).reshape(B * S, t.shape[1], D) for t in (q, k, v)]
        return varlen_attn(*flat, cu, cu, S, S, window_size=(-1, 0)).view(B, S, HQ, D)

    def sdpa(backend):
        def run(q, k, v):
            context = sdpa_kernel([backend]) if backend is not None else _null()
            with context:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return out.transpose(1, 2)

        return run

    def cudnn_repeat(q, k, v):
        k, v = (t.repeat_interleave(HQ // HKV, dim=1) for t in (k, v))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)

    return {
        "varlen": varlen,
        "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "sdpa-cudnn-repeat": cudnn_repeat,
        "sdpa-efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
        "sdpa-default": sdpa(None),
    }


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: Any) -> None:
        return None


def measure(fn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor) -> dict[str, Any]:
    def step() -> tuple[torch.Tensor, ...]:
        out = fn(q, k, v)
        grads = torch.autograd.grad(out, (q, k, v), grad)
        return (out, *grads)

    for _ in range(5):
        step()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    ms = statistics.median(times)
    return {
        "ms_median": ms,
        "ms_min": min(times),
        "ms_max": max(times),
        "tflops": flops() / (ms / 1e3) / 1e12,
        "result": step(),
    }


def compiles_without_break() -> dict[str, Any]:
    """gpuval's row kernel (attention._causal_rows) under torch._dynamo.explain."""
    from gpuval.finetune.step import attention

    attention._ROW_KERNEL = "cudnn"
    attention._CUDNN_GQA = attention._cudnn_gqa(torch.device("cuda"))
    q, k, v = inputs(torch.Generator(device="cuda").manual_seed(1))
    explained = torch._dynamo.explain(attention._causal_rows)(q, k, v, None)
    return {
        "graph_breaks": explained.graph_break_count,
        "reasons": [str(r.reason) for r in explained.break_reasons][:3],
        "cudnn_gqa": attention._CUDNN_GQA,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = inputs(generator)
    grad = torch.randn(B, S, HQ, D, device="cuda", dtype=torch.bfloat16, generator=generator)
    results: dict[str, Any] = {}
    reference = None
    for name, fn in candidates().items():
        try:
            r = measure(fn, q, k, v, grad)
        except (RuntimeError, ValueError) as error:
            results[name] = {"error": str(error).splitlines()[0][:300]}
            print(f"{name:<18} ERROR {results[name]['error']}", flush=True)
            continue
        tensors = r.pop("result")
        if reference is None:
            reference = tensors
        diffs = [float((a.float() - b.float()).abs().max()) for a, b in zip(tensors, reference, strict=True)]
        r["max_abs_diff_vs_varlen"] = diffs
        results[name] = r
        print(f"{name:<18} {r['ms_median']:7.2f} ms  {r['tflops']:6.0f} TFLOP/s  diff {diffs}", flush=True)
    try:
        compiled = compiles_without_break()
    except Exception as error:  # noqa: BLE001 - a probe: record what happened
        compiled = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
    print("compile:", compiled, flush=True)
    report = {
        "schema": "gpuval.bench.attention_probe/v1",
        "shape": {"batch": B, "seq": S, "q_heads": HQ, "kv_heads": HKV, "head_dim": D, "dtype": "bfloat16"},
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "candidates": results,
        "compile": compiled,
    }
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Issue 23: the 7B LoRA step's largest products and kernels, timed alone in the ways they could be run.

    python tools/research/step_products.py --output products.json      # on a GPU machine

The bf16 step (benchmarks/finetune_speed.py's `gpuval`) spends 74 % of its kernel time in matrix products
(the profile in benchmarks/results/2026-11-26-h100x1-finetune-profile-final/). There, the products whose
output is the hidden size (3,584 columns: the MLP's down projection, and the gate and up projections'
input gradients) ran 6-10 % slower than the products of the same FLOPs whose output is the MLP's 18,944
columns. A likely cause is wave quantisation: 12,288 rows x 3,584 columns in cuBLAS's 192 x 192 tiles are
1,216 tiles, 9.2 waves of 132 SMs, so the tenth wave runs a fifth full. This script times each such
product alone, beside other ways to run the same arithmetic:

- `gate_up_input_grad`: d(x) = d(gate) @ W_gate + d(up) @ W_up as the trainer's autograd runs it (two
  products and an add), as one batched product over the stacked pair (`bmm` then a sum: twice the tiles in
  one launch, so one partial wave instead of two), as one product over the concatenated pair (K = 37,888,
  what `train.experimental.fuse_gate_up` does) and as two products on two CUDA streams;
- `gate_up_forward`: two products, one broadcast batched product over the stacked pair, one concatenated
  product;
- `down_forward`: F.linear, with cuBLASLt preferred, and transposed (W @ h^T);
- `lm_head`: Liger's fused loss computes the logits in chunks of 256 labelled rows here; the logits product
  and its input gradient for chunks of 256 to 4,096 rows, as TFLOP/s;
- `norm_dropout`: the compiled RMSNorm with the residual add, with and without LoRA's dropout on its
  output (what the dropout costs in the kernel that makes it), and with gpuval's packed-mask dropout
  (finetune/step/packed_dropout.py);
- `triton_products`: the 3,584-column products (and one of 18,944 columns) through cuBLAS and through
  inductor's best Triton template, persistent TMA ones included, timed in turn: whether a product of
  gpuval's own could escape cuBLAS's tail wave;
- `split_products`: the same 3,584-column products as column groups (1,792 + 1,792, 2,048 + 1,536, ...),
  each group its own cuBLAS product, timed in turn with the whole: whether a split tiles into whole waves.

Each timing: warm-up, then `--windows` windows of `--reps` back-to-back launches between two CUDA events;
the median window's mean per launch, with the min and max windows. Inputs are random normal bf16 (non-zero)
at the shapes of Qwen2-7B (hidden 3,584, MLP 18,944, vocabulary 152,064) with `--rows` rows (micro-batch 3
x 4,096). Output JSON: each variant's ms per launch and TFLOP/s (2 x M x N x K over the median time).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the speed benchmark's helpers
from finetune_speed import git_commit  # noqa: E402

HIDDEN, MLP, VOCAB = 3584, 18944, 152064


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("step-products.json"))
    parser.add_argument("--rows", type=int, default=3 * 4096)
    parser.add_argument("--seq-len", type=int, default=4096, help="tokens per row (attention)")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--parts", default=",".join(PARTS))
    args = parser.parse_args()

    parts = args.parts.split(",")
    if unknown := [part for part in parts if part not in PARTS]:
        raise SystemExit(f"unknown part {unknown[0]!r}; known: {', '.join(PARTS)}")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("step_products.py times CUDA kernels: run it on a GPU machine")
    torch.manual_seed(0)
    results: dict[str, Any] = {}
    for part in parts:
        results[part] = PARTS[part](args)
        write(args, results)
        print(json.dumps({part: results[part]}, indent=1), flush=True)
    return 0


def write(args: argparse.Namespace, results: dict[str, Any]) -> None:
    import torch

    report = {
        "schema": "gpuval.bench.step_products/v1",
        "command": "python " + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "gpuval_commit": git_commit(),
        "settings": {"rows": args.rows, "seq_len": args.seq_len, "reps": args.reps, "windows": args.windows},
        "parts": results,
    }
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def timed(fn: Callable[[], Any], args: argparse.Namespace, flops: float | None = None) -> dict[str, Any]:
    """Median over windows of the mean ms per launch, each window `reps` back-to-back launches."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    windows = []
    for _ in range(args.windows):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.reps):
            fn()
        end.record()
        end.synchronize()
        windows.append(start.elapsed_time(end) / args.reps)
    median = statistics.median(windows)
    out: dict[str, Any] = {"ms": median, "ms_min": min(windows), "ms_max": max(windows)}
    if flops:
        out["tflops"] = flops / (median / 1e3) / 1e12
    return out


def _randn(*shape: int) -> Any:
    import torch

    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def gate_up_input_grad(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    m = args.rows
    d_gu = _randn(2, m, MLP)
    w_gu = _randn(2, MLP, HIDDEN) / MLP**0.5
    d_cat = torch.cat([d_gu[0], d_gu[1]], dim=1)
    w_cat = torch.cat([w_gu[0], w_gu[1]], dim=0)
    flops = 2 * 2 * m * MLP * HIDDEN
    side = torch.cuda.Stream()

    def two_products() -> Any:
        return torch.mm(d_gu[0], w_gu[0]) + torch.mm(d_gu[1], w_gu[1])

    def one_product_each() -> Any:  # the two products alone, without the add
        torch.mm(d_gu[0], w_gu[0])
        return torch.mm(d_gu[1], w_gu[1])

    def batched() -> Any:
        return torch.bmm(d_gu, w_gu).sum(0)

    def batched_alone() -> Any:
        return torch.bmm(d_gu, w_gu)

    def concatenated() -> Any:
        return torch.mm(d_cat, w_cat)

    def two_streams() -> Any:
        side.wait_stream(torch.cuda.current_stream())
        first = torch.mm(d_gu[0], w_gu[0])
        with torch.cuda.stream(side):
            second = torch.mm(d_gu[1], w_gu[1])
        torch.cuda.current_stream().wait_stream(side)
        return first + second

    out = {
        "two_products_and_add": timed(two_products, args, flops),
        "two_products_alone": timed(one_product_each, args, flops),
        "bmm_and_sum": timed(batched, args, flops),
        "bmm_alone": timed(batched_alone, args, flops),
        "concatenated_k": timed(concatenated, args, flops),
        "two_streams_and_add": timed(two_streams, args, flops),
    }
    reference = two_products()
    out["bmm_max_abs_diff"] = float((batched() - reference).abs().max())
    out["reference_max_abs"] = float(reference.abs().max())
    return out


def gate_up_forward(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    m = args.rows
    x = _randn(m, HIDDEN)
    w_gu = _randn(2, MLP, HIDDEN) / HIDDEN**0.5
    w_cat = torch.cat([w_gu[0], w_gu[1]], dim=0)
    flops = 2 * 2 * m * MLP * HIDDEN

    def two() -> Any:
        F.linear(x, w_gu[0])
        return F.linear(x, w_gu[1])

    return {
        "two_products": timed(two, args, flops),
        "broadcast_bmm": timed(lambda: torch.matmul(x, w_gu.mT), args, flops),
        "concatenated_n": timed(lambda: F.linear(x, w_cat), args, flops),
    }


def down_forward(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    m = args.rows
    h = _randn(m, MLP)
    w = _randn(HIDDEN, MLP) / MLP**0.5
    dy = _randn(m, HIDDEN)
    flops = 2 * m * MLP * HIDDEN
    out = {
        "linear": timed(lambda: F.linear(h, w), args, flops),
        "transposed": timed(lambda: torch.mm(w, h.t()), args, flops),
        "input_grad_reference": timed(lambda: torch.mm(dy, w), args, flops),  # output 18,944 columns
    }
    previous = torch.backends.cuda.preferred_blas_library()
    try:
        torch.backends.cuda.preferred_blas_library("cublaslt")
        out["linear_cublaslt"] = timed(lambda: F.linear(h, w), args, flops)
    finally:
        torch.backends.cuda.preferred_blas_library(previous)
    return out


def lm_head(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    w = _randn(VOCAB, HIDDEN) / HIDDEN**0.5
    out = {}
    for chunk in (256, 512, 1024, 2048, 4096):
        x = _randn(chunk, HIDDEN)
        d_logits = _randn(chunk, VOCAB)
        flops = 2 * chunk * VOCAB * HIDDEN
        out[str(chunk)] = {
            "logits": timed(lambda x=x: F.linear(x, w), args, flops),
            "input_grad": timed(lambda d_logits=d_logits: torch.mm(d_logits, w), args, flops),
        }
    return out


def norm_dropout(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    m = args.rows
    residual, delta = _randn(m, HIDDEN), _randn(m, HIDDEN)
    weight = _randn(HIDDEN)

    def norm(residual: Any, delta: Any) -> Any:
        hidden = residual + delta
        variance = hidden.float().pow(2).mean(-1, keepdim=True)
        return hidden, weight * (hidden.float() * torch.rsqrt(variance + 1e-6)).to(hidden.dtype)

    def norm_and_dropout(residual: Any, delta: Any) -> Any:
        hidden, normed = norm(residual, delta)
        return hidden, normed, torch.nn.functional.dropout(normed, 0.05, training=True)

    from gpuval.finetune.step.packed_dropout import PackedDropout

    packed = PackedDropout(0.05)

    def norm_and_packed_dropout(residual: Any, delta: Any) -> Any:
        hidden, normed = norm(residual, delta)
        return hidden, normed, packed(normed)

    plain = torch.compile(norm)
    with_dropout = torch.compile(norm_and_dropout)
    with_packed = torch.compile(norm_and_packed_dropout)
    return {
        "norm": timed(lambda: plain(residual, delta), args),
        "norm_and_dropout": timed(lambda: with_dropout(residual, delta), args),
        "norm_and_packed_dropout": timed(lambda: with_packed(residual, delta), args),
    }


def triton_products(args: argparse.Namespace) -> dict[str, Any]:
    """The MLP products whose output is the hidden size (3,584 columns: wave-quantised in cuBLAS's tiles,
    benchmarks/NOTES.md) and one with 18,944 columns, each as cuBLAS runs it (eager `a @ b`) and as
    inductor's fastest Triton template (max-autotune over Triton only, persistent TMA templates included),
    timed in turn `--windows` times so that both see the same power states."""
    import torch

    m = args.rows
    down = _randn(HIDDEN, MLP)  # nn.Linear layouts (out, in): down (3,584 x 18,944), gate (18,944 x 3,584)
    gate = _randn(MLP, HIDDEN)
    products = {  # name: (a, b) for a @ b, in the layouts the step's forward and backward use
        "down_forward": (_randn(m, MLP), down.t()),  # h @ W_down^T: 3,584 columns
        "gate_input_grad": (_randn(m, MLP), gate),  # d(gate) @ W_gate: 3,584 columns
        "gate_forward": (_randn(m, HIDDEN), gate.t()),  # x @ W_gate^T: 18,944 columns
    }
    options = {
        "max_autotune": True,
        "max_autotune_gemm_backends": "TRITON",
        "triton.enable_persistent_tma_matmul": True,
    }
    out: dict[str, Any] = {}
    for name, (a, b) in products.items():
        flops = 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
        triton = torch.compile(lambda x, y: x @ y, options=options, dynamic=False)
        torch.testing.assert_close(triton(a, b).float(), (a @ b).float(), rtol=2e-2, atol=2e-1)
        once = argparse.Namespace(reps=args.reps, windows=1)
        runs: dict[str, list[float]] = {"cublas": [], "triton": []}
        for _ in range(args.windows):
            runs["cublas"].append(timed(lambda a=a, b=b: a @ b, once)["ms"])
            runs["triton"].append(timed(lambda a=a, b=b, t=triton: t(a, b), once)["ms"])
        out[name] = {
            kind: {
                "ms": statistics.median(ms),
                "ms_min": min(ms),
                "ms_max": max(ms),
                "tflops": flops / (statistics.median(ms) / 1e3) / 1e12,
            }
            for kind, ms in runs.items()
        }
    return out


def split_products(args: argparse.Namespace) -> dict[str, Any]:
    """The two kinds of 3,584-column MLP product (down forward, gate input gradient) whole and as column
    groups computed one after the other (each group its own product with its own output), timed in turn
    with the whole product: whether some split of the 3,584 columns gives cuBLAS tilings without the tail
    wave. The split outputs are not joined here (in the step the consumer would read them in place)."""
    import torch

    m = args.rows
    down, gate = _randn(HIDDEN, MLP), _randn(MLP, HIDDEN)
    products = {"down_forward": (_randn(m, MLP), down.t()), "gate_input_grad": (_randn(m, MLP), gate)}
    splits = {
        "1792+1792": (1792, 1792),
        "2048+1536": (2048, 1536),
        "1536+2048": (1536, 2048),
        "1024x3+512": (1024, 1024, 1024, 512),
        "2304+1280": (2304, 1280),
    }
    out: dict[str, Any] = {}
    for name, (a, b) in products.items():
        flops = 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
        parts = {
            label: [
                b[:, sum(w[:i]) : sum(w[: i + 1])].contiguous()
                if b.is_contiguous()
                else b[:, sum(w[:i]) : sum(w[: i + 1])]
                for i in range(len(w))
            ]
            for label, w in splits.items()
        }
        for pieces in parts.values():  # the same numbers, column group by column group
            joined = torch.cat([a @ piece for piece in pieces], 1).float()
            torch.testing.assert_close(joined, (a @ b).float(), rtol=2e-2, atol=2e-1)
        once = argparse.Namespace(reps=args.reps, windows=1)
        runs: dict[str, list[float]] = {"whole": [], **{label: [] for label in parts}}
        for _ in range(args.windows):
            runs["whole"].append(timed(lambda a=a, b=b: a @ b, once)["ms"])
            for label, pieces in parts.items():
                runs[label].append(timed(lambda a=a, p=pieces: [a @ piece for piece in p], once)["ms"])
        out[name] = {
            kind: {
                "ms": statistics.median(ms),
                "ms_min": min(ms),
                "ms_max": max(ms),
                "tflops": flops / (statistics.median(ms) / 1e3) / 1e12,
            }
            for kind, ms in runs.items()
        }
    return out


HEADS, KV_HEADS, HEAD_DIM = (
    28,
    4,
    128,
)  # Qwen2-7B's attention: grouped-query, 7 query heads per key/value head


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, backward: bool = False) -> float:
    """Causal attention's FLOPs as FlashAttention's benchmarks count them (Dao-AILab/flash-attention,
    benchmarks/benchmark_flash_attention.py), so that kernel figures compare with published ones: the
    forward's two products are 2 x 2 x b x h x s^2 x d, halved when causal (only the lower triangle of the
    scores is computed); the backward's five products are 2.5 times that. (finetune/flops.py's MFU counts
    the backward as twice the forward, the usual training convention: a different figure.)"""
    forward = 4.0 * batch * heads * seq * seq * head_dim / 2
    return 2.5 * forward if backward else forward


def attention(args: argparse.Namespace) -> dict[str, Any]:
    """Causal grouped-query attention at Qwen2-7B's layer shape (28 query heads, 4 key/value heads, head
    size 128) over `--rows` / `--seq-len` rows, through each kernel this machine has: cuDNN's and
    FlashAttention-2's through SDPA (`train.step.row_kernel` cudnn and flash) and FlashAttention-4's Hopper
    kernels (the flash-attn-4 package, `flash_attn.cute`) when installed. Inputs are token-major (batch,
    tokens, heads, head size) as the projections make them; SDPA gets head-major views of them.

    For each kernel: the forward alone and the forward with its backward (`torch.autograd.grad`, so no
    gradient accumulates between launches), timed in turn window by window; the backward's own time is
    their difference. Before timing, each kernel's output and gradients on the first row are compared
    with a float32 reference (PyTorch's math backend on the same inputs): the largest absolute error of
    each, beside cuDNN's, says whether a faster kernel computes the same attention."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    seq = args.seq_len
    batch = args.rows // seq
    q, dout = _randn(batch, seq, HEADS, HEAD_DIM), _randn(batch, seq, HEADS, HEAD_DIM)
    k, v = _randn(batch, seq, KV_HEADS, HEAD_DIM), _randn(batch, seq, KV_HEADS, HEAD_DIM)
    for t in (q, k, v):
        t.requires_grad_(True)

    def sdpa(backend: Any) -> Callable[..., Any]:
        def run(q: Any, k: Any, v: Any) -> Any:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
                )
            return out.transpose(1, 2)

        return run

    kernels: dict[str, Callable[..., Any]] = {
        "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "flash2": sdpa(SDPBackend.FLASH_ATTENTION),
    }
    out: dict[str, Any] = {"batch": batch, "seq_len": seq, "heads": HEADS, "kv_heads": KV_HEADS}
    try:
        from flash_attn.cute import flash_attn_func

        def fa4(q: Any, k: Any, v: Any) -> Any:
            result = flash_attn_func(q, k, v, causal=True)
            return result[0] if isinstance(result, tuple) else result

        kernels["fa4"] = fa4
        out["fa4_version"] = _version("flash-attn-4")
    except ImportError as exc:
        out["fa4_missing"] = str(exc)

    def reference(q: Any, k: Any, v: Any) -> Any:  # float32, K/V heads repeated, PyTorch's math backend
        q32, k32, v32 = (t.float().transpose(1, 2) for t in (q, k, v))
        groups = HEADS // KV_HEADS
        k32, v32 = k32.repeat_interleave(groups, 1), v32.repeat_interleave(groups, 1)
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q32, k32, v32, is_causal=True).transpose(1, 2)

    first = [t[:1].detach().clone().requires_grad_(True) for t in (q, k, v)]
    ref_out = reference(*first)
    ref_grads = torch.autograd.grad(ref_out, first, dout[:1].float())
    errors: dict[str, Any] = {}
    for name, fn in list(kernels.items()):
        try:
            start = time.perf_counter()
            got = fn(*first)
            grads = torch.autograd.grad(got, first, dout[:1])
            torch.cuda.synchronize()
            errors[name] = {"first_call_s": round(time.perf_counter() - start, 2)}
        except RuntimeError as exc:  # a backend this build or GPU lacks
            out[f"{name}_unavailable"] = str(exc).splitlines()[0][:300]
            del kernels[name]
            continue
        for label, a, b in zip(("out", "dq", "dk", "dv"), (got, *grads), (ref_out, *ref_grads), strict=True):
            errors[name][f"{label}_max_abs_err"] = (a.float() - b).abs().max().item()
            errors[name][f"{label}_ref_max_abs"] = b.abs().max().item()
    out["errors_first_row"] = errors

    def forward(fn: Callable[..., Any]) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad():
                return fn(q, k, v)

        return run

    def both(fn: Callable[..., Any]) -> Callable[[], Any]:
        return lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), dout)

    once = argparse.Namespace(reps=args.reps, windows=1)
    runs: dict[str, dict[str, list[float]]] = {
        name: {"forward": [], "forward_backward": []} for name in kernels
    }
    for _ in range(args.windows):
        for name, fn in kernels.items():
            runs[name]["forward"].append(timed(forward(fn), once)["ms"])
            runs[name]["forward_backward"].append(timed(both(fn), once)["ms"])
    fwd_flops = attention_flops(batch, HEADS, seq, HEAD_DIM)
    bwd_flops = attention_flops(batch, HEADS, seq, HEAD_DIM, backward=True)
    for name, timings in runs.items():
        fwd, both_ms = statistics.median(timings["forward"]), statistics.median(timings["forward_backward"])
        out[name] = {
            "forward_ms": fwd,
            "forward_ms_min": min(timings["forward"]),
            "forward_ms_max": max(timings["forward"]),
            "forward_backward_ms": both_ms,
            "forward_backward_ms_min": min(timings["forward_backward"]),
            "forward_backward_ms_max": max(timings["forward_backward"]),
            "backward_ms": both_ms - fwd,
            "forward_tflops": fwd_flops / (fwd / 1e3) / 1e12,
            "backward_tflops": bwd_flops / ((both_ms - fwd) / 1e3) / 1e12,
        }
    return out


def _version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


PARTS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "gate_up_input_grad": gate_up_input_grad,
    "gate_up_forward": gate_up_forward,
    "down_forward": down_forward,
    "lm_head": lm_head,
    "norm_dropout": norm_dropout,
    "triton_products": triton_products,
    "split_products": split_products,
    "attention": attention,
}


if __name__ == "__main__":
    sys.exit(main())

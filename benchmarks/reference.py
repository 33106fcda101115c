"""Ceilings to hold gpuval's numbers against, measured independently of gpuval's code on the same GPU.

- matmul: a wider bf16 shape search than gpuval's sweep (the "best any shape gives");
- copy: a plain `dst.copy_(src)` of 4 GiB, bytes read + written counted, as in REFERENCE.md.
Timed with CUDA events after warm-up, median of repetitions, random inputs. Writes one JSON file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _time_ms(fn, warmup_s: float = 0.1, min_time_s: float = 0.2, repeats: int = 10) -> list[float]:
    """Per-call milliseconds: warm up for warmup_s, then time calls until repeats and min_time_s are met."""
    began = time.perf_counter()
    while time.perf_counter() - began < warmup_s:
        fn()
        torch.cuda.synchronize()
    out: list[float] = []
    while len(out) < repeats or sum(out) < min_time_s * 1e3:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def matmul_search() -> dict:
    # A wider grid than gpuval's sweep, in ascending size like it, so both see the GPU in the same state.
    sizes = [2048, 4096, 6144, 8192, 10240, 12288, 14336, 16384]
    ks = [2048, 4096, 8192, 12288, 16384]
    rows = []
    for mn in sizes:
        for k in ks:
            a = torch.randn(mn, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(k, mn, device="cuda", dtype=torch.bfloat16)
            c = torch.empty(mn, mn, device="cuda", dtype=torch.bfloat16)
            ms = statistics.median(_time_ms(lambda a=a, b=b, c=c: torch.matmul(a, b, out=c)))
            rows.append({"m": mn, "n": mn, "k": k, "tflops": 2 * mn * mn * k / (ms / 1e3) / 1e12})
            del a, b, c
    best = max(rows, key=lambda r: r["tflops"])
    return {
        "bf16_best_tflops": best["tflops"],
        "bf16_best_shape": [best["m"], best["n"], best["k"]],
        "shapes": rows,
    }


def copy_ceiling(nbytes: int = 2**32) -> dict:
    src = torch.rand(nbytes // 4, device="cuda") + 0.5
    dst = torch.empty_like(src)
    ms = _time_ms(lambda: dst.copy_(src), repeats=20, min_time_s=0.1)
    return {"bytes": nbytes, "copy_tbps": 2 * nbytes / (statistics.median(ms) / 1e3) / 1e12}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    began = time.time()
    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "matmul": matmul_search(),
        "copy": copy_ceiling(),
        "duration_s": 0.0,
    }
    result["duration_s"] = time.time() - began
    with open(args.output, "w") as handle:
        json.dump(result, handle, indent=2)
    print(json.dumps({k: v for k, v in result["matmul"].items() if k != "shapes"}), result["copy"])


if __name__ == "__main__":
    main()

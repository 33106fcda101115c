"""Ceilings to hold gpuval's numbers against, measured with no gpuval code on the same GPU.

The loop a user's job runs: many products (or copies) back to back, the host clock read once after a
synchronize before and once after a synchronize at the end, the rate from the total. No CUDA events,
no windows, no medians of gpuval's: what the two methods share is torch alone, so a timing mistake in
gpuval cannot hide in both. Each shape is run several times (passes) and the best and median pass kept.

- matmul: bf16 C = A @ B over a wider shape grid than gpuval's sweep, cubes included; FLOPs 2*m*n*k.
- copy: a plain `dst.copy_(src)` of 4 GiB, bytes read + written counted (2 x buffer).
Inputs are random normal values (zeros run faster and would flatter the GPU). Writes one JSON file.

    python tools/reference/reference.py --output reference.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _loop_s(fn, seconds: float) -> float:
    """Seconds per call of `fn` run back to back for about `seconds`, timed by the host around syncs."""
    torch.cuda.synchronize()
    began = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - began, 1e-6)
    calls = max(3, int(seconds / one))
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / calls


def _passes(fn, warmup_s: float, pass_s: float, passes: int) -> list[float]:
    _loop_s(fn, warmup_s)
    return [_loop_s(fn, pass_s) for _ in range(passes)]


def matmul_search(quick: bool) -> dict:
    # Ascending size, as gpuval's sweep runs, so both see the GPU warming up the same way.
    if quick:
        shapes = [(n, n, n) for n in (4096, 6144, 8192)]
    else:
        grid = {(mn, mn, k) for mn in (2048, 4096, 6144, 8192, 12288, 16384) for k in (4096, 8192, 16384)}
        cubes = {(n, n, n) for n in (2048, 4096, 6144, 8192, 10240, 12288, 16384)}
        shapes = sorted(grid | cubes, key=lambda s: s[0] * s[1] * s[2])
    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        seconds = _passes(lambda a=a, b=b, c=c: torch.matmul(a, b, out=c), 0.2, 0.15, 5)
        rates = [2 * m * n * k / s / 1e12 for s in seconds]
        rows.append(
            {"m": m, "n": n, "k": k, "tflops": statistics.median(rates), "tflops_best_pass": max(rates)}
        )
        del a, b, c
    best = max(rows, key=lambda r: r["tflops"])
    return {
        "method": "host clock around torch.cuda.synchronize(); ~0.15 s of back-to-back products per pass, "
        "5 passes after 0.2 s warm-up; tflops = median pass",
        "bf16_best_tflops": best["tflops"],
        "bf16_best_shape": [best["m"], best["n"], best["k"]],
        "shapes": rows,
    }


def copy_ceiling(nbytes: int = 2**32) -> dict:
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    seconds = _passes(lambda: dst.copy_(src), 0.2, 0.2, 5)
    rates = [2 * nbytes / s / 1e12 for s in seconds]
    return {"bytes": nbytes, "copy_tbps": statistics.median(rates), "copy_tbps_best_pass": max(rates)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--quick", action="store_true", help="the three cubes only")
    args = parser.parse_args()
    began = time.time()
    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "matmul": matmul_search(args.quick),
        "copy": copy_ceiling(),
        "duration_s": 0.0,
    }
    result["duration_s"] = time.time() - began
    with open(args.output, "w") as handle:
        json.dump(result, handle, indent=2)
    summary = {k: v for k, v in result["matmul"].items() if k not in ("shapes", "method")}
    print(json.dumps(summary), result["copy"])


if __name__ == "__main__":
    main()

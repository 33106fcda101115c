"""Another program on the GPU, for fault-injection runs: it multiplies, or holds memory, until killed.

    python tools/device/gpu_hog.py --compute            # bf16 8192^3 products back to back on GPU 0
    python tools/device/gpu_hog.py --memory-gib 70      # holds 70 GiB of GPU 0 and sleeps

Prints one line, `ready pid=<pid>`, once the GPU is busy or the memory is held. No gpuval code: it
stands for any other user's job.
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compute", action="store_true", help="multiply bf16 matrices back to back")
    parser.add_argument("--memory-gib", type=float, default=0.0, help="GiB of GPU memory to hold")
    parser.add_argument("--seconds", type=float, default=600.0, help="stop by itself after this long")
    args = parser.parse_args()
    held = []
    if args.memory_gib > 0:
        chunk = 2**30
        for _ in range(int(args.memory_gib)):
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda").fill_(1))
        torch.cuda.synchronize()
    a = b = c = None
    if args.compute:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        c = torch.empty_like(a)
        torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
    print(f"ready pid={os.getpid()}", flush=True)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        if args.compute:
            for _ in range(50):
                torch.matmul(a, b, out=c)
            torch.cuda.synchronize()
        else:
            time.sleep(0.5)


if __name__ == "__main__":
    main()

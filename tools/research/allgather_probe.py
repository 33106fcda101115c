"""Why gpuval's all_gather at 2-4 GiB read a few % under raw NCCL on 2xH200 (see its result folder,
benchmarks/results/2026-11-22-h200x2-allgather-probe/):
plain torch.distributed, no gpuval harness, timed with CUDA events like nccl-tests (5 warm-up, 20 timed ops
per block, median of 5 blocks), under variants that could explain it.

    torchrun --nproc-per-node=2 tools/research/allgather_probe.py --bind|--no-bind --output FILE.json

--bind: init_process_group(device_id=...) as gpuval does (eager NCCL init, ncclCommInitRankConfig);
--no-bind: the lazy default. Sizes 1, 2 and 4 GiB (S = whole output), float32 and bfloat16.
busbw = algbw * (n-1)/n (nccl-tests, doc/PERFORMANCE.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bind", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device if args.bind else None)
    n, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for size in (2**30, 2**31, 2**32):
            count = size // torch.tensor([], dtype=dtype).element_size()
            out = torch.empty(count, dtype=dtype, device=device)
            inp = torch.randn(count // n, device=device).to(dtype)
            for _ in range(5):
                dist.all_gather_into_tensor(out, inp)
            times = []
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                dist.barrier(device_ids=[local])
                start.record()
                for _ in range(20):
                    dist.all_gather_into_tensor(out, inp)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3 / 20)
            seconds = statistics.median(times)
            algbw = size / seconds / 1e9
            rows.append(
                {
                    "dtype": str(dtype),
                    "bytes": size,
                    "time_us": seconds * 1e6,
                    "algbw_gbps": algbw,
                    "busbw_gbps": algbw * (n - 1) / n,
                    "spread_us": [min(times) * 1e6, max(times) * 1e6],
                }
            )
            del out, inp
            torch.cuda.empty_cache()
    if rank == 0:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
        document = {"bind": args.bind, "ranks": n, "torch": torch.__version__, "nccl": nccl}
        with open(args.output, "w") as handle:
            json.dump({**document, "rows": rows}, handle, indent=2)
        for row in rows:
            size = f"{row['bytes'] >> 30} GiB"
            print(f"bind={args.bind} {row['dtype']:15} {size} busbw {row['busbw_gbps']:.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""GPU-to-GPU copy bandwidth for every ordered pair of GPUs on a node (a weak NVLink shows up here).

The first rank of each node drives all pairs, one at a time, with the other ranks waiting, so each
number is one link alone. Bytes counted: the buffer once (what crossed the link), GB/s = 1e9 B/s.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gpuval.bench.registry import Benchmark, BenchmarkSkipped, Context, register
from gpuval.config import ByteSize
from gpuval.metrics import MeasurementDecl, Metric
from gpuval.results import Measurement
from gpuval.scope import Scope
from gpuval.timing import TimedOptions, expected_timed_s, measure_with


class P2POptions(TimedOptions):
    # at least one float32: a smaller buffer holds no element and would time an empty copy
    bytes: ByteSize = Field(ge=4, description="buffer copied per pair")


def _defaults(quick: bool, on_gpu: bool) -> dict[str, Any]:
    return {"bytes": 2**28 if quick else 2**30, "warmup_s": 0.05, "min_time_s": 0.05 if quick else 0.1}


_PESSIMISTIC_BYTES_PER_S = 1e9  # one GPU-to-GPU copy through the host at its slowest: the phase's deadline


def expected_s(options: P2POptions, runtime: Any) -> float:
    """Seconds at the pessimistic rate: every ordered pair of the node's GPUs, timed as measure_with."""
    gpus = max(runtime.local_world_size, 1) if runtime.on_gpu else 0
    return gpus * (gpus - 1) * expected_timed_s(options, options.bytes / _PESSIMISTIC_BYTES_PER_S)


def run_p2p(ctx: Context, options: P2POptions) -> list[Measurement]:
    import torch

    runtime = ctx.runtime
    if runtime.device.type != "cuda":
        raise BenchmarkSkipped("no GPU: GPU-to-GPU copies need at least two GPUs on a node")
    gpus = torch.cuda.device_count()
    if gpus < 2:
        raise BenchmarkSkipped(f"{gpus} GPU visible to each process: P2P needs two or more on a node")
    measurements: list[Measurement] = []
    runtime.host_barrier()  # the other GPUs idle: no spinning NCCL kernel beside the copies
    if runtime.local_rank == 0:
        count = options.bytes // 4
        buffers = [torch.rand(count, device=f"cuda:{index}").add_(0.5) for index in range(gpus)]
        for src in range(gpus):
            for dst in range(gpus):
                if src == dst:
                    continue
                ctx.progress(f"p2p gpu{src}->gpu{dst}")
                target = torch.empty(count, device=f"cuda:{dst}")
                with torch.cuda.device(src):
                    # Timed on the source GPU's stream, which performs the copy (cudaMemcpyPeerAsync).
                    windows = measure_with(
                        lambda t=target, s=buffers[src]: t.copy_(s, non_blocking=True),
                        torch.device("cuda", src),
                        options,
                    )
                torch.cuda.synchronize(dst)
                measurements.append(
                    Measurement(
                        name="p2p",
                        scope=str(Scope.link(runtime.node_name, f"gpu{src}", f"gpu{dst}")),
                        params={
                            "src": src,
                            "dst": dst,
                            "bytes": count * 4,
                            "peer_access": bool(torch.cuda.can_device_access_peer(src, dst)),
                            "calls_per_window": windows.calls,
                        },
                        metrics={
                            "copy_gbps": count * 4 / windows.median_s / 1e9,
                            "copy_gbps_min": count * 4 / max(windows.seconds) / 1e9,
                            "copy_gbps_max": count * 4 / min(windows.seconds) / 1e9,
                        },
                        samples=len(windows.seconds),
                    )
                )
                del target
        del buffers
        torch.cuda.empty_cache()
    runtime.host_barrier()  # the other GPUs idle: no spinning NCCL kernel beside the copies
    return measurements


register(
    Benchmark(
        name="p2p",
        summary="GPU-to-GPU copy GB/s matrix within each node",
        options=P2POptions,
        defaults=_defaults,
        run=run_p2p,
        expected_s=expected_s,
        metrics=(
            MeasurementDecl(
                "p2p",
                (Metric("copy_gbps", "GB/s", +1, description="copy from src to dst GPU", plot=True),),
                identity=("src", "dst"),
                hint="check this GPU pair's NVLinks (nvidia-smi nvlink -s, -e) and peer access",
                view="pair_matrix",
                by_gpu_count=True,
            ),
        ),
        outlier_metrics=("copy_gbps",),
    )
)

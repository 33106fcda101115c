"""Memory bandwidth per GPU: device copy/read/write and pinned host<->device copies.

Bytes counted: copy = bytes read + bytes written (2 x buffer), read = buffer bytes read by a sum
reduction, write = buffer bytes written by a fill. Host<->device copies count the buffer once.
TB/s and GB/s are 1e12 and 1e9 bytes per second.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gpuval.bench.registry import Benchmark, Context, register
from gpuval.config import ByteSize
from gpuval.metrics import MeasurementDecl, Metric
from gpuval.results import Measurement
from gpuval.timing import CPU_TIMING, TimedOptions, Windows, expected_timed_s, measure_with


class MembwOptions(TimedOptions):
    # at least one float32 each: a smaller buffer holds no element, and its 0 bytes would read as 0 TB/s
    device_bytes: ByteSize = Field(ge=4, description="buffer size for device copy/read/write")
    host_bytes: ByteSize = Field(ge=4, description="pinned host buffer for host<->device copies")
    host_all_at_once: bool = Field(
        False,
        description="host<->device copies on every GPU of a node at once (the host's aggregate) instead "
        "of one GPU at a time (its own PCIe link, as nvbandwidth measures it)",
    )


def _defaults(quick: bool, on_gpu: bool) -> dict[str, Any]:
    if on_gpu:
        return {
            "device_bytes": 2**30 if quick else 2**32,
            "host_bytes": 2**28 if quick else 2**30,
            "min_time_s": 0.1 if quick else 0.3,
        }
    return {
        "device_bytes": 2**25 if quick else 2**26,
        "host_bytes": 2**20,
        "repeats": 5,
        **CPU_TIMING,
    }


# Pessimistic rates for the phase's deadline (gpuval.deadline), keyed by "on a GPU": device memory (a tenth
# of an A100's), pinned host copies (a PCIe gen3 x4 link); CPU memory of a loaded machine.
_PESSIMISTIC_DEVICE_BYTES_PER_S = {True: 2e11, False: 2e8}
_PESSIMISTIC_HOST_BYTES_PER_S = 1e9


def expected_s(options: MembwOptions, runtime: Any) -> float:
    """Seconds at the pessimistic rates: copy, read and write on the device; on a GPU the two host copies,
    one GPU of a node at a time (each rank waits for the node's others)."""
    on_gpu = bool(runtime.on_gpu)
    device_call_s = 2 * options.device_bytes / _PESSIMISTIC_DEVICE_BYTES_PER_S[on_gpu]
    total = 3 * expected_timed_s(options, device_call_s)
    if on_gpu:
        turns = 1 if options.host_all_at_once else max(runtime.local_world_size, 1)
        total += turns * 2 * expected_timed_s(options, options.host_bytes / _PESSIMISTIC_HOST_BYTES_PER_S)
    return total


def _rates(windows: Windows, bytes_counted: int, scale: float) -> tuple[float, float, float]:
    """(median, slowest, fastest) window's rate of calls that each moved `bytes_counted`, in `scale` units."""
    return (
        bytes_counted / windows.median_s / scale,
        bytes_counted / max(windows.seconds) / scale,
        bytes_counted / min(windows.seconds) / scale,
    )


def run_membw(ctx: Context, options: MembwOptions) -> list[Measurement]:
    import torch

    runtime = ctx.runtime
    device = runtime.device
    on_gpu = device.type == "cuda"
    scope = runtime.device_scope
    count = options.device_bytes // 4
    nbytes = count * 4
    src = torch.rand(count, device=device) + 0.5  # random, non-zero
    dst = torch.empty_like(src)

    runtime.barrier()
    results: dict[str, float] = {}
    spread: dict[str, float] = {}
    for label, fn, counted in (
        ("copy", lambda s=src, d=dst: d.copy_(s), 2 * nbytes),
        ("read", lambda s=src: s.sum(), nbytes),
        ("write", lambda d=dst: d.fill_(1.5), nbytes),
    ):
        ctx.progress(f"membw {label}")
        windows = measure_with(fn, device, options)
        median, low, high = _rates(windows, counted, 1e12)
        results[f"{label}_tbps"], spread[f"{label}_tbps_min"], spread[f"{label}_tbps_max"] = median, low, high
    del src, dst, fn  # the last lambda holds a buffer too
    if on_gpu:
        # One GPU of a node at a time by default: healthy GPUs copying at once share the host's memory
        # bandwidth and read below their links (benchmarks/results/2026-11-22-h200x4-device-run): the
        # host's limit, not a link's. A per-GPU threshold must see the GPU's own link.
        turns = [True] if options.host_all_at_once else runtime.local_turns()
        for mine in turns:
            if mine:
                for label, (median, low, high) in _host_copies(ctx, options).items():
                    results[f"{label}_gbps"] = median
                    spread[f"{label}_gbps_min"], spread[f"{label}_gbps_max"] = low, high
    return [
        Measurement(
            name="membw",
            scope=scope,
            params={
                "device_bytes": nbytes,
                "host_bytes": options.host_bytes if on_gpu else 0,
                "host_all_at_once": options.host_all_at_once,
            },
            metrics={**results, **spread},
            samples=options.repeats,
        )
    ]


def _host_copies(ctx: Context, options: MembwOptions) -> dict[str, tuple[float, float, float]]:
    """Pinned host->device ('h2d') and device->host ('d2h') copies of this rank's GPU: GB/s median,
    slowest and fastest call; the buffer's bytes are counted once."""
    import torch

    host_count = options.host_bytes // 4
    host = torch.rand(host_count).add_(0.5).pin_memory()
    on_device = torch.empty(host_count, device=ctx.runtime.device)
    rates = {}
    for label, fn in (
        ("h2d", lambda h=host, d=on_device: d.copy_(h, non_blocking=True)),
        ("d2h", lambda h=host, d=on_device: h.copy_(d, non_blocking=True)),
    ):
        ctx.progress(f"membw {label}")
        windows = measure_with(fn, ctx.runtime.device, options)
        rates[label] = _rates(windows, host_count * 4, 1e9)
    del host, on_device, fn
    torch.cuda.empty_cache()
    return rates


_PCIE_HINT = "check the PCIe link (nvidia-smi -q -d PCI: generation and width) and NUMA binding"

register(
    Benchmark(
        name="membw",
        summary="device copy/read/write TB/s and pinned host<->device GB/s per GPU",
        options=MembwOptions,
        defaults=_defaults,
        run=run_membw,
        expected_s=expected_s,
        metrics=(
            MeasurementDecl(
                "membw",
                (
                    Metric("copy_tbps", "TB/s", +1, description="HBM copy, read + written", plot=True),
                    Metric("read_tbps", "TB/s", +1, description="HBM read"),
                    Metric("write_tbps", "TB/s", +1, description="HBM write"),
                    # pinned copies ride on the host's memory and PCIe root as much as on the GPU: a
                    # healthy GPU can read low once (docs/thresholds.md, noisy host-side metrics)
                    Metric(
                        "h2d_gbps",
                        "GB/s",
                        +1,
                        hint=_PCIE_HINT,
                        description="pinned host to device",
                        noisy=True,
                    ),
                    Metric(
                        "d2h_gbps",
                        "GB/s",
                        +1,
                        hint=_PCIE_HINT,
                        description="device to pinned host",
                        noisy=True,
                    ),
                ),
                hint="check memory clocks and ECC / row-remapping state "
                "(nvidia-smi -q -d MEMORY,ECC,ROW_REMAPPER)",
                view="per_gpu",
            ),
        ),
        outlier_metrics=("copy_tbps",),
    )
)

"""A node's inventory as torch sees it: host, software versions and GPUs.

The NVML-based discovery (topology, ECC, NVLink, InfiniBand) builds on this; here only what every
benchmark run needs to be interpreted later.
"""

from __future__ import annotations

import os
import platform
import socket
from typing import Any

from gpuval import __version__


def local_gpu_names() -> list[str]:
    """GPU names through NVML (no CUDA context in this process), else through torch."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [
                pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
                for index in range(pynvml.nvmlDeviceGetCount())
            ]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: fall back to what torch sees (nothing on a CPU machine)
        pass
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]


def node_inventory(node_name: str | None = None) -> dict[str, Any]:
    import torch

    gpus = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append(
                {
                    "index": index,
                    "name": props.name,
                    "memory_total_bytes": int(props.total_memory),
                    "compute_capability": f"{props.major}.{props.minor}",
                    "multiprocessors": props.multi_processor_count,
                    "uuid": str(getattr(props, "uuid", "")),
                }
            )
    nccl = None
    if torch.cuda.is_available() and torch.distributed.is_nccl_available():
        version = torch.cuda.nccl.version()
        nccl = ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)
    return {
        "node": node_name or socket.gethostname(),
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "gpuval": __version__,
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "nccl": nccl,
        "gpu_count": len(gpus),
        "gpus": gpus,
    }

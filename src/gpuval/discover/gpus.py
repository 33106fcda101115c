"""GPUs without the full NVML snapshot: their names (to pick a profile), whether the node has any at all
(PCI bus, NVML) and, where NVML cannot be read but CUDA works, the device list torch sees."""

from __future__ import annotations

from typing import Any

from gpuval.discover.pci import nvidia_gpus
from gpuval.nvml import Nvml, available


def cpu_build_of_torch() -> bool:
    """Whether the installed torch is a CPU build (its version.py names no CUDA), found without importing
    it; False when that cannot be told, so that the caller asks torch itself."""
    from gpuval.discover.software import torch_build

    build = torch_build()
    return build is not None and build.get("cuda") is None


def local_gpu_names() -> list[str]:
    """GPU names through NVML (no CUDA context in this process), else through torch."""
    nvml = Nvml()
    try:
        handles = nvml.handles()
        if available(handles):
            names = (nvml("nvmlDeviceGetName", handle) for handle in handles if available(handle))
            return [name for name in names if available(name)]
    finally:
        nvml.shutdown()
    if cpu_build_of_torch():
        return []  # no driver, no library, and a torch that sees no GPU: not importing it saves seconds
    import torch  # no driver, no library: what torch sees

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]


def gpus_here() -> str | None:
    """What shows this node has NVIDIA GPUs, in words ('8 NVIDIA GPUs are on the PCI bus', 'NVML lists 8
    GPUs'), whether or not CUDA can use them; None when nothing does."""
    pci = nvidia_gpus()
    if pci:
        return f"{len(pci)} NVIDIA GPU{'s are' if len(pci) > 1 else ' is'} on the PCI bus"
    names = local_gpu_names()
    return f"NVML lists {len(names)} GPU{'s' if len(names) > 1 else ''}" if names else None


def torch_gpus() -> list[dict[str, Any]]:
    """CUDA devices as torch sees them (CUDA_VISIBLE_DEVICES applies), with the keys NVML's list has."""
    if cpu_build_of_torch():
        return []  # a CPU build of torch sees no GPU; not importing it saves seconds
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        gpus = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            bus = getattr(props, "pci_bus_id", None)
            gpus.append(
                {
                    "index": index,
                    "name": props.name,
                    "uuid": str(getattr(props, "uuid", "")) or None,
                    "pci_bus_id": (
                        f"{getattr(props, 'pci_domain_id', 0):08X}:{bus:02X}:"
                        f"{getattr(props, 'pci_device_id', 0):02X}.0"
                        if isinstance(bus, int)
                        else None
                    ),
                    "memory_total_bytes": int(props.total_memory),
                    "compute_capability": f"{props.major}.{props.minor}",
                    "multiprocessors": props.multi_processor_count,
                }
            )
        return gpus
    except Exception:  # noqa: BLE001 - a CUDA error here means no usable GPU, which the caller reports
        return []

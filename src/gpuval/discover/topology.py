"""How the GPUs connect: to each other (the `nvidia-smi topo -m` matrix, NVLinks per GPU) and to the
host (the NUMA node and CPUs nearest each GPU, from the PCI device in sysfs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuval.discover.host import read_text
from gpuval.nvml import GpuInfo, available

# nvmlDeviceGetNvLinkVersion answers NVML_NVLINK_VERSION_* (nvml.h), not the NVLink generation itself.
NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}


def topology_matrix(gpus: list[GpuInfo]) -> dict[str, Any]:
    """Row i, column j: how GPU i reaches GPU j, labelled as `nvidia-smi topo -m` does (X on the diagonal)."""
    return {
        "gpus": [gpu.index for gpu in gpus],
        "matrix": [
            ["X" if other.index == gpu.index else gpu.topology.get(other.index, "N/A") for other in gpus]
            for gpu in gpus
        ],
    }


def nvlink_summary(gpu: GpuInfo) -> dict[str, Any]:
    """Links up out of the links the GPU has, and their NVLink generation ('4.0' on Hopper)."""
    versions = sorted(
        {
            NVLINK_VERSIONS.get(link.version, str(link.version))
            for link in gpu.nvlinks
            if available(link.version)
        }
    )
    return {
        "up": sum(1 for link in gpu.nvlinks if link.up),
        "total": len(gpu.nvlinks),
        "version": ", ".join(versions) or None,
    }


def sysfs_pci_address(bus_id: str) -> str | None:
    """NVML's '00000000:00:06.0' -> Linux's '0000:00:06.0' (domain printed with %04x, lower case)."""
    domain, sep, rest = bus_id.partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest.lower()}" if sep else None
    except ValueError:
        return None


def gpu_affinity(bus_id: Any, numa_nodes: list[dict[str, Any]], root: Path = Path("/")) -> dict[str, Any]:
    """The NUMA node and CPU list nearest a GPU, as nvidia-smi topo's 'NUMA Affinity' and 'CPU Affinity'.

    From the PCI device's numa_node and local_cpulist in sysfs. The kernel says -1 where the firmware
    gave no proximity (VMs, single-socket hosts); on a host with one NUMA node that node is the answer.
    NVML's nvmlDeviceGetNumaNodeId is a different thing: the GPU's own memory as a NUMA node (Grace
    Hopper), nvidia-smi's 'GPU NUMA ID' column.
    """
    address = sysfs_pci_address(bus_id) if isinstance(bus_id, str) else None
    device = root / "sys/bus/pci/devices" / address if address else None
    numa_text = read_text(device / "numa_node") if device else None
    numa = int(numa_text) if numa_text and numa_text.lstrip("-").isdigit() else None
    if numa is not None and numa < 0:
        numa = None
    if numa is None and len(numa_nodes) == 1:
        numa = numa_nodes[0]["node"]
    cpus = read_text(device / "local_cpulist") if device else None
    if not cpus and numa is not None:
        cpus = next((node["cpulist"] for node in numa_nodes if node["node"] == numa), None)
    return {"numa_affinity": numa, "cpu_affinity": cpus or None}

"""One node's inventory: host, software, GPUs (NVML), topology, InfiniBand, mounts and scheduler context.

A plain JSON-able dict. `gpuval accept` and the cross-node checks read `node`, `gpu_count`, `gpus[]`
(`index`, `name`, `memory_total_bytes`), `pci_gpus` and `software.*`: those keys stay.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuval.discover.gpus import torch_gpus
from gpuval.discover.host import host_info
from gpuval.discover.network import infiniband_ports
from gpuval.discover.pci import nvidia_gpus
from gpuval.discover.scheduler import scheduler_context
from gpuval.discover.software import communication_env, software_versions
from gpuval.discover.storage import mounts
from gpuval.discover.topology import gpu_affinity, nvlink_summary, topology_matrix
from gpuval.discover.transport import nccl_transport
from gpuval.nvml import NvmlSnapshot, available, snapshot
from gpuval.runtime import node_name as default_node_name

SCHEMA = "gpuval.inventory/v1"


def node_inventory(
    node_name: str | None = None,
    library: Any = None,
    root: Path = Path("/"),
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Everything `gpuval discover` reports about this node; never raises for a missing driver or file.

    `library` replaces pynvml (tests replay recorded answers), `root` the file system /proc and /sys are
    read from, `environ` the process environment.
    """
    env = os.environ if environ is None else environ
    try:
        nvml = snapshot(library)
        # nvmlInit failed (no driver loaded, no NVML library): the snapshot has an error and no driver
        nvml_status = "ok" if nvml.ok else "no_driver" if nvml.driver_version is None else "error"
    except Exception as exc:  # noqa: BLE001 - snapshot() means never to raise; if it does, say so and go on
        nvml = NvmlSnapshot(error=f"NVML snapshot failed: {type(exc).__name__}: {exc}")
        nvml_status = "error"
    host = host_info(root)
    # A GPU whose handle NVML could not get has no name: it is listed apart, so that every entry of
    # `gpus` is a usable GPU and `gpu_count` counts what can run work.
    reachable = [gpu for gpu in nvml.gpus if available(gpu.name)]
    gpus = []
    for gpu in reachable:
        entry = gpu.to_json()
        entry.update(gpu_affinity(gpu.pci_bus_id, host["numa_nodes"], root))
        entry["nvlink"] = nvlink_summary(gpu)
        gpus.append(entry)
    gpu_source = "nvml" if gpus else None
    if not nvml.ok and not gpus:
        gpus = torch_gpus()  # no NVML (a container without the library) but CUDA may still work
        gpu_source = "torch" if gpus else None
    topology, infiniband = topology_matrix(reachable), infiniband_ports(root)
    return {
        "schema": SCHEMA,
        "node": node_name or default_node_name(dict(env)),
        "collected_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": host,
        "software": software_versions(nvml),
        "communication": communication_env(env),
        "nvml_status": nvml_status,  # ok | no_driver | error
        "nvml_error": nvml.error,
        "gpu_source": gpu_source,
        "gpu_count": len(gpus),
        "gpus": gpus,
        "gpus_lost": [
            {"index": gpu.index, "reason": gpu.name.reason} for gpu in nvml.gpus if not available(gpu.name)
        ],
        "pci_gpus": [gpu.to_json() for gpu in nvidia_gpus(root)],  # what the hardware holds, driver or not
        "topology": topology,
        "infiniband": infiniband,
        "nccl_transport": nccl_transport(env, infiniband, topology),
        "mounts": mounts(root),
        "scheduler": scheduler_context(env, root),
    }

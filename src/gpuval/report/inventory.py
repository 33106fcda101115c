"""The inventory for people: rich tables for the terminal, and a short plain block for a bug report
(after `accelerate env`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from gpuval.discover.storage import shown_to_people

TOPOLOGY_LEGEND = (
    "NV# = # bonded NVLinks · PIX = one PCIe bridge · PXB = several PCIe bridges · "
    "PHB = a PCIe host bridge · NODE = host bridges within a NUMA node · SYS = across NUMA nodes"
)


def _na(value: Any) -> str:
    return "N/A" if value is None or value == "" else str(value)


def _gib(count: Any) -> str:
    return f"{count / 2**30:.1f} GiB" if isinstance(count, (int, float)) else "N/A"


def _size(count: Any) -> str:
    if not isinstance(count, (int, float)):
        return ""
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def _on_off(value: Any) -> str:
    return {0: "off", 1: "on"}.get(value, "N/A")  # NVML's enable states; False and True compare the same


def _ecc(gpu: dict[str, Any]) -> str:
    current, pending = gpu.get("ecc_mode_current"), gpu.get("ecc_mode_pending")
    if pending is not None and current is not None and pending != current:
        return f"{_on_off(current)} (→{_on_off(pending)} at reset)"
    return _on_off(current)


def _pcie(gpu: dict[str, Any], which: str) -> str:
    gen, width = gpu.get(f"pcie_gen_{which}"), gpu.get(f"pcie_width_{which}")
    return "N/A" if gen is None and width is None else f"Gen{_na(gen)} x{_na(width)}"


def _nvlinks(gpu: dict[str, Any]) -> str:
    summary = gpu.get("nvlink") or {}
    if not summary.get("total"):
        return "none"
    version = f" (v{summary['version']})" if summary.get("version") else ""
    return f"{summary['up']}/{summary['total']} up{version}"


def _power(gpu: dict[str, Any]) -> str:
    watts = gpu.get("power_limit_w")
    return f"{watts:.0f} W" if isinstance(watts, (int, float)) else "N/A"


def _cpu_line(host: dict[str, Any]) -> str:
    cpu = host.get("cpu") or {}
    allowed = host.get("cpus_allowed")
    usable = f" ({allowed} usable here)" if allowed and allowed != cpu.get("threads") else ""
    return (
        f"{_na(cpu.get('model'))}: {_na(cpu.get('sockets'))} socket(s), {_na(cpu.get('cores'))} cores, "
        f"{_na(cpu.get('threads'))} threads{usable}"
    )


def _numa_line(host: dict[str, Any]) -> str:
    nodes = host.get("numa_nodes") or []
    return ", ".join(f"node{n['node']} CPUs {_na(n['cpulist'])}" for n in nodes) or "N/A"


def driver_line(inventory: dict[str, Any]) -> str | None:
    """The one line that says why no GPU is listed; None when NVML answered."""
    error = inventory.get("nvml_error")
    if error is None:
        return None
    if inventory.get("nvml_status") == "no_driver":
        return f"no NVIDIA driver: {error}"
    return f"NVML could not list the GPUs: {error}"


def pci_line(inventory: dict[str, Any]) -> str:
    """'PCI bus: 8 NVIDIA GPUs (8x 10de:2330)': what the hardware holds, whether or not a driver answers."""
    gpus = inventory.get("pci_gpus") or []
    if not gpus:
        return "PCI bus: no NVIDIA GPU"
    ids = Counter(gpu["pci_id"] for gpu in gpus)
    listed = ", ".join(f"{count}x {pci_id}" for pci_id, count in sorted(ids.items()))
    return f"PCI bus: {len(gpus)} NVIDIA GPU{'s' if len(gpus) > 1 else ''} ({listed})"


def host_table(inventory: dict[str, Any]) -> Table:
    host, software = inventory["host"], inventory["software"]
    table = Table(title=f"node {inventory['node']}", title_justify="left", show_header=False, box=None)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    rows = [
        ("OS", f"{_na(host.get('os'))} · kernel {_na(host.get('kernel'))} · {_na(host.get('architecture'))}"),
        ("CPU", _cpu_line(host)),
        ("NUMA", _numa_line(host)),
        ("memory", _gib(host.get("memory_total_bytes"))),
        (
            "python",
            f"{software['python']} · gpuval {software['gpuval']} · torch {_na(software.get('torch'))}",
        ),
        (
            "CUDA libraries",
            f"runtime {_na(software.get('cuda_runtime'))} · NCCL {_na(software.get('nccl'))} · "
            f"cuDNN {_na(software.get('cudnn'))}",
        ),
        (
            "driver",
            f"{_na(software.get('driver_version'))} · CUDA {_na(software.get('cuda_driver_version'))}",
        ),
    ]
    rows.append(("communication", communication_line(inventory)))
    transport = inventory.get("nccl_transport")
    if transport:  # gpuval.discover.transport: what the node's facts say NCCL would choose
        rows.append(("NCCL inside the node", transport["inside_node"]))
        rows.append(("NCCL between nodes", transport["between_nodes"]))
    for key, value in rows:
        table.add_row(key, value)
    return table


def communication_line(inventory: dict[str, Any]) -> str:
    """'deploy/env/hgx-ib.env · NCCL_IB_HCA=mlx5 …', or what is missing (inventories older than the field)."""
    comm = inventory.get("communication")
    if comm is None:
        return "not recorded"
    # GPUVAL_ENV_PROFILE names the deploy/env/ file sourced (an NCCL settings file, not an accept profile)
    profile = f"deploy/env/{comm['profile']}.env" if comm.get("profile") else "no deploy/env/ file"
    variables = " ".join(f"{key}={value}" for key, value in comm.get("variables", {}).items())
    return f"{profile} · {variables or 'no NCCL/gloo/torch.distributed variable set'}"


def gpu_table(inventory: dict[str, Any]) -> Table:
    software = inventory["software"]
    table = Table(
        title=f"GPUs · driver {_na(software.get('driver_version'))} · "
        f"CUDA {_na(software.get('cuda_driver_version'))}"
        + (" · from torch (NVML unavailable)" if inventory.get("gpu_source") == "torch" else ""),
        title_justify="left",
    )
    for column in ("GPU", "name", "bus id", "memory", "VBIOS", "MIG", "persist", "ECC", "power limit"):
        table.add_column(column, no_wrap=column in ("GPU", "bus id", "memory"))
    table.add_column("max clocks SM/mem")
    table.add_column("PCIe now / max")
    for gpu in inventory["gpus"]:
        table.add_row(
            str(gpu["index"]),
            _na(gpu.get("name")),
            _na(gpu.get("pci_bus_id")),
            _gib(gpu.get("memory_total_bytes")),
            _na(gpu.get("vbios_version")),
            _on_off(gpu.get("mig_mode_current")),
            _on_off(gpu.get("persistence_mode")),
            _ecc(gpu),
            _power(gpu),
            f"{_na(gpu.get('max_sm_clock_mhz'))}/{_na(gpu.get('max_mem_clock_mhz'))} MHz",
            f"{_pcie(gpu, 'current')} / {_pcie(gpu, 'max')}",
        )
    for lost in inventory.get("gpus_lost", []):
        table.add_row(str(lost["index"]), f"[bold red]unreachable: {lost['reason']}[/]", *[""] * 9)
    return table


def topology_table(inventory: dict[str, Any]) -> Table:
    """Laid out as `nvidia-smi topo -m`: the GPU matrix, then CPU and NUMA affinity per GPU."""
    topology = inventory["topology"]
    by_index = {gpu["index"]: gpu for gpu in inventory["gpus"]}
    table = Table(title="topology", title_justify="left", caption=TOPOLOGY_LEGEND, caption_justify="left")
    table.add_column("")
    for index in topology["gpus"]:
        table.add_column(f"GPU{index}", justify="center")
    for column in ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID", "NVLinks"):
        table.add_column(column)
    for index, row in zip(topology["gpus"], topology["matrix"], strict=True):
        gpu = by_index.get(index, {})
        table.add_row(
            f"GPU{index}",
            *row,
            _na(gpu.get("cpu_affinity")),
            _na(gpu.get("numa_affinity")),
            _na(gpu.get("numa_node")),
            _nvlinks(gpu),
        )
    return table


def infiniband_table(inventory: dict[str, Any]) -> Table:
    table = Table(title="InfiniBand / RDMA ports", title_justify="left")
    for column in ("HCA", "port", "state", "physical", "rate", "link layer", "netdev", "firmware"):
        table.add_column(column)
    for port in inventory["infiniband"]:
        state = _na(port.get("state"))
        table.add_row(
            port["hca"],
            str(port["port"]),
            state if state == "ACTIVE" else f"[yellow]{state}[/]",
            _na(port.get("phys_state")),
            _na(port.get("rate")),
            _na(port.get("link_layer")),
            ", ".join(port.get("netdevs") or []) or "N/A",
            _na(port.get("firmware")),
        )
    return table


def storage_table(inventory: dict[str, Any]) -> Table:
    table = Table(title="storage (shared file systems flagged)", title_justify="left")
    for column in ("mount point", "type", "shared", "device", "size"):
        table.add_column(column, overflow="fold")
    for mount in inventory["mounts"]:
        if not shown_to_people(mount):
            continue
        table.add_row(
            mount["mount_point"],
            mount["fs_type"],
            "[bold]shared[/]" if mount["shared"] else "",
            mount["device"],
            _size(mount.get("size_bytes")),
        )
    return table


def _joined(parts: list[tuple[str, Any]]) -> str:
    """'label value' for each value present, joined with ' · '."""
    return " · ".join(f"{label} {value}".strip() for label, value in parts if value not in (None, ""))


# (label, field) shown for a job, in this order; an empty label shows the value alone
_SLURM = (
    ("job", "job_id"),
    ("name", "job_name"),
    ("partition", "partition"),
    ("nodes", "nnodes"),
    ("", "job_nodelist"),
    ("step", "step_id"),
    ("task", "task"),
    ("local task", "localid"),
    ("on", "nodename"),
    ("GPUs on node", "gpus_on_node"),
    ("job GPUs", "job_gpus"),
)
_KUBERNETES = (("pod", "pod"), ("namespace", "namespace"), ("node", "node"))


def scheduler_lines(inventory: dict[str, Any]) -> list[str]:
    context = inventory["scheduler"]
    lines = []
    slurm = context.get("slurm")
    if slurm:
        task = f"{slurm['procid']} of {_na(slurm.get('ntasks'))}" if "procid" in slurm else None
        lines.append("Slurm " + _joined([(label, {**slurm, "task": task}.get(key)) for label, key in _SLURM]))
    kubernetes = context.get("kubernetes")
    if kubernetes:
        lines.append("Kubernetes " + _joined([(label, kubernetes.get(key)) for label, key in _KUBERNETES]))
    torchrun = context.get("torchrun")
    if torchrun:
        master = torchrun.get("master_addr")
        if master and torchrun.get("master_port"):
            master = f"{master}:{torchrun['master_port']}"
        rank = f"{torchrun['rank']} of {_na(torchrun.get('world_size'))}" if "rank" in torchrun else None
        lines.append(
            "torchrun "
            + _joined([("rank", rank), ("local rank", torchrun.get("local_rank")), ("master", master)])
        )
    visible = context.get("visible_devices") or {}
    if visible:
        lines.append(" · ".join(f"{name}={value!r}" for name, value in visible.items()))
    return lines or ["none (started by hand)"]


def print_inventory(inventory: dict[str, Any], console: Console) -> None:
    console.print(host_table(inventory))
    problem = driver_line(inventory)
    if problem:
        console.print(problem, markup=False, highlight=False, soft_wrap=True)
    console.print(pci_line(inventory), markup=False, highlight=False)
    if inventory["gpus"] or inventory.get("gpus_lost"):
        console.print(gpu_table(inventory))
    if inventory["topology"]["gpus"]:
        console.print(topology_table(inventory))
    if inventory["infiniband"]:
        console.print(infiniband_table(inventory))
    else:
        console.print("InfiniBand: no ports in /sys/class/infiniband")
    console.print(storage_table(inventory))
    for number, line in enumerate(scheduler_lines(inventory)):
        console.print(("scheduler: " if number == 0 else "           ") + line, markup=False, highlight=False)


def _gpu_summary(gpus: list[dict[str, Any]]) -> str:
    models = Counter((gpu.get("name"), _gib(gpu.get("memory_total_bytes"))) for gpu in gpus)
    return ", ".join(f"{count}x {name} {memory}" for (name, memory), count in models.items())


def paste_block(inventory: dict[str, Any]) -> str:
    """About 20-40 plain lines with what a bug report about a GPU node needs; no colour, no box drawing."""
    host, software = inventory["host"], inventory["software"]
    lines = [
        f"gpuval discover · node {inventory['node']} · {inventory.get('collected_at', '')}",
        f"- OS: {_na(host.get('os'))}, kernel {_na(host.get('kernel'))}, {_na(host.get('architecture'))}",
        f"- CPU: {_cpu_line(host)}",
        f"- NUMA: {_numa_line(host)}",
        f"- memory: {_gib(host.get('memory_total_bytes'))}",
        f"- python {software['python']} · gpuval {software['gpuval']} · torch {_na(software.get('torch'))}",
        f"- CUDA runtime {_na(software.get('cuda_runtime'))} · NCCL {_na(software.get('nccl'))} · "
        f"cuDNN {_na(software.get('cudnn'))}",
        f"- driver {_na(software.get('driver_version'))} · CUDA driver "
        f"{_na(software.get('cuda_driver_version'))}",
        f"- communication: {communication_line(inventory)}",
    ]
    problem = driver_line(inventory)
    if problem:
        lines.append(f"- {problem}")
    lines.append(f"- {pci_line(inventory)}")
    gpus = inventory["gpus"]
    if gpus:
        lines.append(f"- GPUs: {_gpu_summary(gpus)}")
        for gpu in gpus:
            lines.append(
                f"  GPU{gpu['index']} {_na(gpu.get('pci_bus_id'))} VBIOS {_na(gpu.get('vbios_version'))} "
                f"MIG {_on_off(gpu.get('mig_mode_current'))} persist {_on_off(gpu.get('persistence_mode'))} "
                f"ECC {_ecc(gpu)} {_power(gpu)} PCIe {_pcie(gpu, 'current')}/{_pcie(gpu, 'max')} "
                f"NVLink {_nvlinks(gpu)} NUMA {_na(gpu.get('numa_affinity'))}"
            )
    for lost in inventory.get("gpus_lost", []):
        lines.append(f"  GPU{lost['index']} unreachable: {lost['reason']}")
    topology = inventory["topology"]
    if topology["gpus"]:
        labels = [f"GPU{index}" for index in topology["gpus"]]
        width = max(len(cell) for cell in [*labels, *(c for row in topology["matrix"] for c in row)]) + 1
        lines.append("- topology:")
        lines.append("  " + " " * width + "".join(label.ljust(width) for label in labels).rstrip())
        for label, row in zip(labels, topology["matrix"], strict=True):
            lines.append("  " + label.ljust(width) + "".join(cell.ljust(width) for cell in row).rstrip())
    ports = inventory["infiniband"]
    lines.append(
        "- InfiniBand: "
        + (
            "; ".join(
                f"{p['hca']}/{p['port']} {_na(p.get('state'))} {_na(p.get('rate_gbps'))} Gb/s "
                f"{_na(p.get('link_layer'))}" + (f" ({', '.join(p['netdevs'])})" if p.get("netdevs") else "")
                for p in ports
            )
            or "none"
        )
    )
    shared = [m for m in inventory["mounts"] if m["shared"]]
    lines.append(
        "- shared file systems: "
        + ("; ".join(f"{m['mount_point']} {m['fs_type']} ({m['device']})" for m in shared) or "none")
    )
    shm = next((m for m in inventory["mounts"] if m["mount_point"] == "/dev/shm"), None)
    if shm and shm.get("size_bytes"):
        lines.append(f"- /dev/shm: {_size(shm['size_bytes'])}")
    lines.append("- scheduler: " + " | ".join(scheduler_lines(inventory)))
    return "\n".join(lines) + "\n"

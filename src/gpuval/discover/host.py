"""The host around the GPUs: OS, kernel, CPUs (sockets, cores, threads), NUMA nodes and memory.

Everything is read from /proc and /sys under `root`, so tests point it at a fake tree (tests/data/sysfs).
A file that is missing or unreadable gives None for its fields, never an exception.
"""

from __future__ import annotations

import platform
import re
import socket
from pathlib import Path
from typing import Any

# Arm cores by (implementer, part) from /proc/cpuinfo, which names no model on Arm; after lscpu's table.
ARM_CORES = {
    (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD40): "Neoverse-V1",
    (0x41, 0xD49): "Neoverse-N2",
    (0x41, 0xD4F): "Neoverse-V2",  # NVIDIA Grace
    (0x41, 0xD8E): "Neoverse-N3",
    (0x41, 0xD84): "Neoverse-V3",
}


def read_text(path: Path) -> str | None:
    """A small sysfs/procfs file, stripped; None when it is missing or unreadable."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def parse_cpulist(text: str | None) -> list[int]:
    """Kernel CPU list syntax: '0-3,8-11' -> [0, 1, 2, 3, 8, 9, 10, 11]; '' or None -> []."""
    cpus: list[int] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def natural_key(name: str) -> list[Any]:
    """'node10' after 'node2', 'mlx5_10' after 'mlx5_2'."""
    return [int(piece) if piece.isdigit() else piece for piece in re.split(r"(\d+)", name)]


def _cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    blocks = []
    for chunk in text.split("\n\n"):
        fields = {}
        for line in chunk.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "processor" in fields:
            blocks.append(fields)
    return blocks


def _arm_model(block: dict[str, str]) -> str | None:
    try:
        implementer, part = int(block["CPU implementer"], 16), int(block["CPU part"], 16)
    except (KeyError, ValueError):
        return None
    return ARM_CORES.get((implementer, part), f"Arm implementer {implementer:#x} part {part:#x}")


def cpu_info(root: Path = Path("/")) -> dict[str, Any]:
    """CPU model, sockets, physical cores and hardware threads.

    Sockets and cores come from /proc/cpuinfo's 'physical id' and 'core id' (x86), else from
    /sys/devices/system/cpu/cpuN/topology (Arm, whose cpuinfo has neither).
    """
    text = read_text(root / "proc/cpuinfo")
    blocks = _cpuinfo_blocks(text) if text else []
    if not blocks:
        return {"model": None, "sockets": None, "cores": None, "threads": None}
    model = next((b["model name"] for b in blocks if b.get("model name")), None) or _arm_model(blocks[0])
    cores: set[tuple[str, str]] = set()
    sockets: set[str] = set()
    for block in blocks:
        topology = root / f"sys/devices/system/cpu/cpu{block['processor']}/topology"
        socket_id = block.get("physical id") or read_text(topology / "physical_package_id")
        core_id = block.get("core id") or read_text(topology / "core_id")
        if socket_id is not None:
            sockets.add(socket_id)
        if socket_id is not None and core_id is not None:
            cores.add((socket_id, core_id))
    return {
        "model": model,
        "sockets": len(sockets) or None,
        "cores": len(cores) or None,
        "threads": len(blocks),
    }


def meminfo_bytes(text: str | None, key: str) -> int | None:
    """'MemTotal:  263998500 kB' (also 'Node 0 MemTotal: ...') -> bytes."""
    match = re.search(rf"{key}:\s+(\d+)\s*kB", text or "")
    return int(match.group(1)) * 1024 if match else None


def numa_nodes(root: Path = Path("/")) -> list[dict[str, Any]]:
    """Every NUMA node with its CPU list (kernel syntax, as nvidia-smi topo prints it) and memory."""
    base = root / "sys/devices/system/node"
    try:
        entries = [p for p in base.iterdir() if re.fullmatch(r"node\d+", p.name)]
    except OSError:
        return []
    nodes = []
    for path in sorted(entries, key=lambda p: natural_key(p.name)):
        cpulist = read_text(path / "cpulist")
        nodes.append(
            {
                "node": int(path.name[4:]),
                "cpulist": cpulist,
                "cpus": len(parse_cpulist(cpulist)),
                "memory_total_bytes": meminfo_bytes(read_text(path / "meminfo"), "MemTotal"),
            }
        )
    return nodes


def _os_name(root: Path) -> str | None:
    for path in (root / "etc/os-release", root / "usr/lib/os-release"):
        text = read_text(path)
        match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?$', text or "", re.MULTILINE)
        if match:
            return match.group(1)
    return None


def host_info(root: Path = Path("/")) -> dict[str, Any]:
    real = root == Path("/")
    status = read_text(root / "proc/self/status")
    allowed = re.search(r"^Cpus_allowed_list:\s*(\S+)", status or "", re.MULTILINE)
    return {
        "hostname": read_text(root / "proc/sys/kernel/hostname") or (socket.gethostname() if real else None),
        "os": _os_name(root),
        "kernel": read_text(root / "proc/sys/kernel/osrelease") or (platform.release() if real else None),
        "architecture": platform.machine() if real else None,
        "cpu": cpu_info(root),
        # CPUs this process may run on: a container or a Slurm allocation often gets fewer than the host has
        "cpus_allowed": len(parse_cpulist(allowed.group(1))) if allowed else None,
        "numa_nodes": numa_nodes(root),
        "memory_total_bytes": meminfo_bytes(read_text(root / "proc/meminfo"), "MemTotal"),
    }

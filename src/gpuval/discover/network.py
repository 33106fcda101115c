"""InfiniBand (and RoCE) ports from sysfs: /sys/class/infiniband/<hca>/ports/<n>/{state,phys_state,rate,
link_layer}, as `ibstat` shows them, without needing infiniband-diags installed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpuval.discover.host import natural_key, read_text


def split_state(text: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE', '5: LinkUp' -> 'LinkUp'."""
    if text is None:
        return None
    return text.partition(":")[2].strip() or text.strip()


def rate_gbps(text: str | None) -> float | None:
    """'400 Gb/sec (4X NDR)' -> 400.0; '2.5 Gb/sec (1X SDR)' -> 2.5."""
    match = re.match(r"\s*([\d.]+)\s*Gb/sec", text or "")
    return float(match.group(1)) if match else None


def _netdevs(hca: Path, port: int) -> list[str]:
    """Network interfaces of this port: device/net/<name>, whose dev_port counts ports from 0."""
    try:
        candidates = sorted((hca / "device/net").iterdir(), key=lambda p: natural_key(p.name))
    except OSError:
        return []
    names = []
    for netdev in candidates:
        dev_port = read_text(netdev / "dev_port")
        if dev_port is None or not dev_port.isdigit() or int(dev_port) + 1 == port:
            names.append(netdev.name)
    return names


def infiniband_ports(root: Path = Path("/")) -> list[dict[str, Any]]:
    base = root / "sys/class/infiniband"
    try:
        hcas = sorted(base.iterdir(), key=lambda p: natural_key(p.name))
    except OSError:
        return []  # no RDMA driver loaded, or no HCA
    ports = []
    for hca in hcas:
        try:
            port_dirs = sorted((hca / "ports").iterdir(), key=lambda p: natural_key(p.name))
        except OSError:
            continue
        for port_dir in port_dirs:
            if not port_dir.name.isdigit():
                continue
            rate = read_text(port_dir / "rate")
            ports.append(
                {
                    "hca": hca.name,
                    "port": int(port_dir.name),
                    "state": split_state(read_text(port_dir / "state")),
                    "phys_state": split_state(read_text(port_dir / "phys_state")),
                    "rate_gbps": rate_gbps(rate),
                    "rate": rate,
                    "link_layer": read_text(port_dir / "link_layer"),  # InfiniBand | Ethernet (RoCE)
                    "netdevs": _netdevs(hca, int(port_dir.name)),
                    "firmware": read_text(hca / "fw_ver"),
                }
            )
    return ports

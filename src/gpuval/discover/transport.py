"""Which NCCL transport this node's GPUs would use, where the node's own facts and NCCL's variables tell.

Between nodes NCCL uses its InfiniBand/RoCE verbs transport when an RDMA port is active on an HCA that
`NCCL_IB_HCA` admits and `NCCL_IB_DISABLE` is not 1, else TCP sockets on the interfaces `NCCL_SOCKET_IFNAME`
names; `NCCL_NET` picks one of them by name and `NCCL_NET_PLUGIN` loads another (then gpuval cannot tell).
Inside a node, GPUs joined by NVLink talk peer to peer over it; `NCCL_P2P_DISABLE=1` sends them through
shared memory instead, and `NCCL_SHM_DISABLE=1` as well through the network transport (how issue 51 makes
one host two nodes to NCCL). Across PCIe switches, host bridges or CPU sockets NCCL decides by its own
topology search and `NCCL_P2P_LEVEL`. The variables: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html
(NCCL_IB_HCA's forms: a prefix by default, `=` for exact names, `^` to exclude, `:port` to pick a port).
This is what the node's facts say NCCL would choose; NCCL_DEBUG=INFO's `NET/IB` or `NET/Socket` and `via
P2P/…` lines say what it did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _off(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip() == "1"


def _hca_admitted(spec: str, hca: str, port: int) -> bool:
    """Whether NCCL_IB_HCA (`mlx5`, `=mlx5_0:1,mlx5_1`, `^mlx5_2`) admits this HCA's port."""
    spec = spec.strip()
    if not spec:
        return True
    exclude, spec = spec.startswith("^"), spec.lstrip("^")
    exact, spec = spec.startswith("="), spec.lstrip("=")
    matched = False
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, wanted_port = item.partition(":")
        if (hca == name if exact else hca.startswith(name)) and (not wanted_port or wanted_port == str(port)):
            matched = True
    return not matched if exclude else matched


def between_nodes(environ: Mapping[str, str], infiniband: Sequence[Mapping[str, Any]]) -> str:
    """NCCL's transport to other nodes, in words, with what decided it."""
    plugin = environ.get("NCCL_NET_PLUGIN", "").strip()
    if plugin and plugin.lower() != "none":
        return f"cannot tell: NCCL_NET_PLUGIN={plugin} loads a network plugin of its own"
    chosen = environ.get("NCCL_NET", "").strip()
    sockets = "TCP sockets on " + (
        f"NCCL_SOCKET_IFNAME={environ['NCCL_SOCKET_IFNAME']}"
        if environ.get("NCCL_SOCKET_IFNAME")
        else "the interfaces NCCL picks (ib* first, then any but lo and docker*)"
    )
    if chosen.lower() == "socket":
        return f"{sockets} (NCCL_NET=Socket)"
    if _off(environ, "NCCL_IB_DISABLE"):
        return f"{sockets} (NCCL_IB_DISABLE=1)"
    spec = environ.get("NCCL_IB_HCA", "")
    active = [p for p in infiniband if str(p.get("state", "")).upper() == "ACTIVE"]
    admitted = [p for p in active if _hca_admitted(spec, str(p.get("hca")), int(p.get("port", 1)))]
    if admitted:
        layers = sorted({str(p.get("link_layer") or "InfiniBand") for p in admitted})
        names = ", ".join(f"{p['hca']}:{p['port']}" for p in admitted)
        kind = "RoCE" if layers == ["Ethernet"] else "InfiniBand" if layers == ["InfiniBand"] else "RDMA"
        return f"{kind} verbs on {len(admitted)} active port(s): {names}"
    if active:
        return f"{sockets}: NCCL_IB_HCA={spec} admits none of the {len(active)} active RDMA port(s)"
    why = "no RDMA port is active" if infiniband else "no RDMA device (no /sys/class/infiniband)"
    return f"{sockets}: {why}" + (" (NCCL_NET=IB would fail)" if chosen.upper() == "IB" else "")


def inside_node(environ: Mapping[str, str], topology: Mapping[str, Any]) -> str:
    """NCCL's transport between this node's GPUs, in words."""
    gpus, matrix = topology.get("gpus", []), topology.get("matrix", [])
    if len(gpus) < 2:
        return f"none: {len(gpus)} GPU" + ("" if len(gpus) == 1 else "s")
    if _off(environ, "NCCL_P2P_DISABLE"):
        if _off(environ, "NCCL_SHM_DISABLE"):
            return "the network transport, as between nodes (NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1)"
        return "shared memory through the host (NCCL_P2P_DISABLE=1)"
    labels = {str(label) for i, row in enumerate(matrix) for j, label in enumerate(row) if i != j}
    if labels and all(label.startswith("NV") for label in labels):
        return "NVLink peer to peer (every pair of GPUs joined by NVLink)"
    if labels and labels <= {"PIX", "PXB"}:
        return "PCIe peer to peer (every pair behind PCIe switches)"
    shown = ", ".join(sorted(labels)) or "unknown"
    return f"NCCL decides pair by pair (paths {shown}; NCCL_P2P_LEVEL sets how far peer to peer goes)"


def nccl_transport(
    environ: Mapping[str, str], infiniband: Sequence[Mapping[str, Any]], topology: Mapping[str, Any]
) -> dict[str, str]:
    """{'inside_node': …, 'between_nodes': …}: the node inventory's `nccl_transport`."""
    inside, between = inside_node(environ, topology), between_nodes(environ, infiniband)
    return {"inside_node": inside, "between_nodes": between}

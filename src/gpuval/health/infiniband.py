"""InfiniBand ports from sysfs: each must be ACTIVE, at the profile's rate, and as many as it expects.

Only ports whose link layer is InfiniBand are judged; Ethernet (RoCE) ports are listed by
`gpuval discover` but not held to IB states here. Ports are read under `ctx.root` (a fake tree in tests)
with discover's parser.
"""

from __future__ import annotations

from typing import Any

from gpuval.discover.network import infiniband_ports
from gpuval.health._common import at_least, link_scope, node_scope, skip
from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.results import Check, Status


def _port_ends(port: dict[str, Any]) -> tuple[str, str]:
    return str(port["hca"]), f"port{port['port']}"


def _state(ctx: HealthContext, port: dict[str, Any]) -> Check:
    scope = link_scope(ctx.node, *_port_ends(port))
    state, phys = port.get("state"), port.get("phys_state")
    if state == "ACTIVE":
        return Check(
            name="infiniband.state",
            status=Status.PASS,
            scope=scope,
            detail=f"ACTIVE ({phys or 'phys state ?'})",
        )
    if state is None:
        return skip("infiniband.state", scope, "sysfs gave no port state")
    if phys == "LinkUp":
        hint = "the link is up but no subnet manager configured it: check the subnet manager (sminfo, opensm)"
    else:
        hint = (
            "check the cable/transceiver and the switch port (ibstat, mlxlink), reseat or replace the cable"
        )
    return Check(
        name="infiniband.state",
        status=Status.FAIL,
        scope=scope,
        detail=f"port {port['port']} of {port['hca']} is {state} ({phys or 'phys state ?'}), not ACTIVE: "
        f"{hint}",
    )


def _rate(ctx: HealthContext, port: dict[str, Any], minimum: float) -> Check:
    scope = link_scope(ctx.node, *_port_ends(port))
    rate = port.get("rate_gbps")
    if rate is None:
        return Check(
            name="infiniband.rate_gbps",
            status=Status.SKIP,
            threshold={"min": minimum},
            unit="Gb/s",
            scope=scope,
            detail=f"sysfs gave no readable rate ({port.get('rate')!r})",
        )
    return at_least(
        "infiniband.rate_gbps",
        scope,
        rate,
        minimum,
        "Gb/s",
        port.get("rate") or f"{rate:g} Gb/s",
        f"{port['hca']} port {port['port']} runs at {port.get('rate')}, {minimum:g} Gb/s expected: "
        "the link trained down; check the cable/transceiver and the switch port speed (ibstat, mlxlink)",
    )


def _count(ctx: HealthContext, found: int, expected: int) -> Check:
    if found == expected:
        status, detail = Status.PASS, f"{found} InfiniBand ports"
    elif found < expected:
        status = Status.FAIL
        detail = (
            f"{found} InfiniBand ports, {expected} expected: check every HCA is seated and its driver loaded "
            "(ibstat, lspci | grep Mellanox, lsmod | grep mlx5_ib)"
        )
    else:
        status = Status.WARN
        detail = f"{found} InfiniBand ports, {expected} expected: set expect.ib_ports to what this node has"
    return Check(
        name="infiniband.ports",
        status=status,
        value=found,
        threshold={"equal": expected},
        unit="ports",
        scope=node_scope(ctx.node),
        detail=detail,
    )


def run(ctx: HealthContext) -> list[Check]:
    expect = ctx.profile.expect
    ports = [port for port in infiniband_ports(ctx.root) if port.get("link_layer") == "InfiniBand"]
    checks: list[Check] = []
    if expect.ib_ports is not None:
        checks.append(_count(ctx, len(ports), expect.ib_ports))
    if not ports:
        if expect.ib_rate_gbps is not None and expect.ib_ports is None:
            checks.append(
                Check(
                    name="infiniband.rate_gbps",
                    status=Status.FAIL,
                    threshold={"min": expect.ib_rate_gbps},
                    unit="Gb/s",
                    scope=node_scope(ctx.node),
                    detail=f"no InfiniBand port found, {expect.ib_rate_gbps:g} Gb/s ports expected: check "
                    "the HCAs are seated and their driver loaded (ibstat, lsmod | grep mlx5_ib)",
                )
            )
        if not checks:
            checks.append(skip("infiniband.state", node_scope(ctx.node), "no InfiniBand port on this node"))
        return checks
    for port in ports:
        checks.append(_state(ctx, port))
        if expect.ib_rate_gbps is not None:
            checks.append(_rate(ctx, port, expect.ib_rate_gbps))
    return checks


register(
    HealthCheck(name="infiniband", summary="InfiniBand ports ACTIVE at the expected rate and count", run=run)
)

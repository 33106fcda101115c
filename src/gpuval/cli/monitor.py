"""`gpuval monitor`: the live per-GPU dashboard and the Prometheus endpoint (gpuval.monitor does both)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpuval.cli.options import exits


@exits
def monitor(
    once: Annotated[
        bool, typer.Option(help="print one reading and exit (two samples --interval apart: rates need both)")
    ] = False,
    json_: Annotated[
        bool, typer.Option("--json", help="JSON: one object (--once) or one line per reading")
    ] = False,
    interval: Annotated[float, typer.Option(help="seconds between readings", min=0.1)] = 1.0,
    count: Annotated[int | None, typer.Option(help="stop after this many readings", min=1)] = None,
    prometheus: Annotated[
        str | None,
        typer.Option(help="serve DCGM-exporter-style metrics at HOST:PORT (PORT alone: 127.0.0.1)"),
    ] = None,
) -> int:
    """Live per-GPU dashboard, InfiniBand port rates, and Prometheus metrics named as DCGM-exporter's.

    Per GPU: utilisation, memory, temperature, power, SM clock, throttle reasons, PCIe and NVLink
    throughput; host CPU and memory where there is no GPU."""
    from gpuval.monitor import run_monitor

    return run_monitor(once=once, json_=json_, interval=interval, count=count, prometheus=prometheus)

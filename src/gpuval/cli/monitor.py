"""`gpuval monitor`: the live per-GPU dashboard and the Prometheus endpoint (gpuval.monitor takes the
readings and serves them; gpuval.report.dashboard draws one)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpuval.cli.options import exits
from gpuval.errors import EXIT_PASS

if TYPE_CHECKING:
    from rich.console import Console

# --interval at most a day: past it (inf, 1e308) the sleep between readings overflows or never ends
MAX_INTERVAL_S = 86400.0


@exits
def monitor(
    once: Annotated[
        bool,
        typer.Option(
            "--once", help="print one reading and exit (two samples --interval apart: rates need both)"
        ),
    ] = False,
    json_: Annotated[
        bool, typer.Option("--json", help="JSON: one object (--once) or one line per reading")
    ] = False,
    interval: Annotated[
        float,
        typer.Option(metavar="SECONDS", help="seconds between readings", min=0.1, max=MAX_INTERVAL_S),
    ] = 1.0,
    count: Annotated[
        int | None, typer.Option(metavar="N", help="stop after this many readings", min=1)
    ] = None,
    prometheus: Annotated[
        str | None,
        typer.Option(
            metavar="[HOST:]PORT",
            help="serve DCGM-exporter-style metrics at HOST:PORT (PORT alone: 127.0.0.1)",
        ),
    ] = None,
) -> int:
    """Live per-GPU dashboard, InfiniBand port rates, and Prometheus metrics named as DCGM-exporter's.

    Per GPU: utilisation, memory, temperature, power, SM clock, throttle reasons, PCIe and NVLink
    throughput; host CPU and memory where there is no GPU."""
    return run_monitor(once=once, json_=json_, interval=interval, count=count, prometheus=prometheus)


def run_monitor(
    once: bool,
    json_: bool,
    interval: float,
    count: int | None,
    prometheus: str | None,
    *,
    library: Any = None,
    root: Path = Path("/"),
    console: Console | None = None,
) -> int:
    """Show readings until `count` of them (one with `once`) or Ctrl-C; exit 0 either way.

    `--once` takes `interval` seconds: the reading shown is the second of a pair (gpuval.monitor). Where
    stdout is no terminal and --prometheus is given, only the exporter speaks (a service's log stays
    quiet). `library` and `root` are for tests: recorded NVML answers, a fake /proc and /sys.
    """
    from rich.console import Console
    from rich.live import Live

    from gpuval.monitor import monitoring
    from gpuval.report.dashboard import render

    # As the CLI's own console: a pipe gets a log-friendly width unless COLUMNS says otherwise.
    console = console or Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 150)
    with monitoring(interval, 1 if once else count, prometheus, library=library, root=root) as readings:
        if json_:
            for reading in readings:
                print(json.dumps(reading.to_json(), indent=2 if once else None), flush=True)
        elif once or not console.is_terminal:
            for reading in readings:
                if prometheus is None or once:
                    console.print(render(reading))
        else:
            with Live(console=console, auto_refresh=False) as live:
                for reading in readings:
                    live.update(render(reading), refresh=True)
    return EXIT_PASS

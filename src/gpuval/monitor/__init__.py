"""`gpuval monitor`: a live per-GPU dashboard, JSON for scripts, and a DCGM-style Prometheus exporter, all
fed by one sampler (sample.py); the dashboard (dashboard.py) and the exporter (exporter.py) only draw."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from gpuval.errors import EXIT_PASS, Interrupted
from gpuval.monitor.dashboard import render
from gpuval.monitor.exporter import parse_address, serve
from gpuval.monitor.sample import Reading, Sampler

__all__ = ["run_monitor"]


def _readings(
    sampler: Sampler, interval: float, count: int | None, publish: Callable[[Reading], None]
) -> Iterator[Reading]:
    """Readings `interval` seconds apart, after a first one that only starts the rates; endless when
    `count` is None. Each goes to `publish` (the exporter's latest) before it is yielded."""
    started = time.monotonic()
    publish(sampler.sample())
    for _ in itertools.count() if count is None else range(count):
        time.sleep(max(0.0, started + interval - time.monotonic()))
        started = time.monotonic()
        reading = sampler.sample()
        publish(reading)
        yield reading


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

    A rate (CPU %, NVLink, InfiniBand) needs two readings, so every reading shown is the second of a pair:
    the monitor reads once, waits `interval` and shows the next; `--once` takes `interval` seconds.
    Where stdout is no terminal and --prometheus is given, only the exporter speaks (a service's log stays
    quiet). `library` and `root` are for tests: recorded NVML answers, a fake /proc and /sys.
    """
    address = parse_address(prometheus) if prometheus is not None else None
    # As the CLI's own console: a pipe gets a log-friendly width unless COLUMNS says otherwise.
    console = console or Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 150)
    latest: dict[str, Reading] = {}
    sampler = Sampler(library, root)
    server = None
    try:
        if address is not None:
            server, _ = serve(address, lambda: latest.get("reading"))
            host, port = server.server_address[:2]
            shown_host = f"[{host}]" if ":" in host else host
            print(f"serving metrics at http://{shown_host}:{port}/metrics", file=sys.stderr, flush=True)
        readings = _readings(sampler, interval, 1 if once else count, lambda r: latest.update(reading=r))
        if json_:
            for reading in readings:
                print(json.dumps(reading.to_json(), indent=2 if once else None), flush=True)
        elif once or not console.is_terminal:
            for reading in readings:
                if address is None or once:
                    console.print(render(reading))
        else:
            with Live(console=console, auto_refresh=False) as live:
                for reading in readings:
                    live.update(render(reading), refresh=True)
    except (KeyboardInterrupt, Interrupted):
        pass  # Ctrl-C (or a service manager's SIGTERM) is how a live monitor is meant to end: exit 0
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        sampler.close()
    return EXIT_PASS

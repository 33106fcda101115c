"""`gpuval monitor`'s library: readings from one sampler (sample.py), published to a DCGM-style Prometheus
exporter (exporter.py) as they come. It returns readings and draws nothing: the dashboard that shows them
is gpuval.report.dashboard, and the command that picks how (table, live view, JSON) is gpuval.cli.monitor."""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpuval.errors import Interrupted
from gpuval.monitor.exporter import parse_address, serve
from gpuval.monitor.sample import Reading, Sampler

__all__ = ["monitoring"]


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


@contextmanager
def monitoring(
    interval: float,
    count: int | None,
    prometheus: str | None,
    *,
    library: Any = None,
    root: Path = Path("/"),
) -> Iterator[Iterator[Reading]]:
    """The readings, until `count` of them (endless when None) or Ctrl-C, which ends them quietly: Ctrl-C
    (or a service manager's SIGTERM) is how a live monitor is meant to end.

    A rate (CPU %, NVLink, InfiniBand) needs two readings, so every reading given is the second of a pair:
    the first comes `interval` seconds after the start. With `prometheus` (HOST:PORT) each reading is also
    served as metrics from the moment it is taken. The exporter and NVML are closed on the way out.
    `library` and `root` are for tests: recorded NVML answers, a fake /proc and /sys.
    """
    address = parse_address(prometheus) if prometheus is not None else None
    latest: dict[str, Reading] = {}
    sampler = Sampler(library, root)
    server = None
    try:
        if address is not None:
            server, _ = serve(address, lambda: latest.get("reading"))
            host, port = server.server_address[:2]
            shown_host = f"[{host}]" if ":" in host else host
            print(f"serving metrics at http://{shown_host}:{port}/metrics", file=sys.stderr, flush=True)
        yield _readings(sampler, interval, count, lambda r: latest.update(reading=r))
    except (KeyboardInterrupt, Interrupted):
        pass
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        sampler.close()

"""`gpuval monitor --prometheus`: the latest reading as Prometheus metrics, named, labelled and in the units
of DCGM-exporter (its etc/default-counters.csv), so dashboards and alerts written for it read these too.

Every metric is a gauge: DCGM-exporter declares PCIe and NVLink throughput as counters, but their values are
rates (KB/s, MB/s), which is what a gauge holds. Framebuffer MiB are not rounded down as DCGM's are. A GPU
field NVML could not give is not exported for that GPU. gpuval adds host and InfiniBand metrics under its
own `gpuval_` prefix. The registry is our own, not prometheus_client's global one, so the process's own
metrics do not mix in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuval.errors import UsageError
from gpuval.monitor.sample import GpuReading, Reading

GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"]
DEFAULT_HOST = "127.0.0.1"  # metrics stay on this machine unless HOST says otherwise


# name, help (DCGM-exporter's, unit included), the reading's fields it sums, bytes (or units) per unit
GPU_METRICS: tuple[tuple[str, str, tuple[str, ...], float], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", ("utilization_gpu_percent",), 1),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", ("utilization_memory_percent",), 1),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", ("memory_used_bytes",), 2**20),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", ("memory_free_bytes",), 2**20),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", ("temperature_c",), 1),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", ("power_w",), 1),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", ("sm_clock_mhz",), 1),
    (
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "Current clock throttle reasons (bit mask of nvmlClocksEventReason*).",
        ("clock_event_reasons",),
        1,
    ),
    ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "PCIe transmit throughput (in KB/s).", ("pcie_tx_bytes_per_s",), 1024),
    ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "PCIe receive throughput (in KB/s).", ("pcie_rx_bytes_per_s",), 1024),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "NVLink data sent and received over all links (in MB/s).",
        ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"),
        1e6,
    ),
)


def _gauge(gpu: GpuReading, attributes: tuple[str, ...], per: float) -> float | None:
    """The sum of the GPU's `attributes` in units of `per`; None when any is missing (not exported)."""
    values = [getattr(gpu, attribute) for attribute in attributes]
    if not all(isinstance(value, (int, float)) for value in values):
        return None
    return sum(values) / per


def _label(value: Any) -> str:
    return value if isinstance(value, str) else ""


def metrics(reading: Reading) -> list[GaugeMetricFamily]:
    """Every metric of one reading; the exporter serves these, tests read them directly too."""
    hostname = reading.hostname or ""
    families = []
    for name, documentation, attributes, per in GPU_METRICS:
        family = GaugeMetricFamily(name, documentation, labels=GPU_LABELS)
        for gpu in reading.gpus:
            value = _gauge(gpu, attributes, per)
            if value is not None:
                labels = [str(gpu.index), _label(gpu.uuid), _label(gpu.pci_bus_id), f"nvidia{gpu.index}"]
                family.add_metric([*labels, _label(gpu.name), hostname], value)
        families.append(family)
    host = reading.host
    for name, documentation, value in (
        (
            "gpuval_host_cpu_percent",
            "Busy share of all CPUs since the last reading (in %).",
            host.cpu_percent,
        ),
        ("gpuval_host_memory_used_bytes", "Memory in use: MemTotal - MemAvailable.", host.memory_used_bytes),
        ("gpuval_host_memory_total_bytes", "MemTotal of /proc/meminfo.", host.memory_total_bytes),
        (
            "gpuval_host_load1",
            "Load average over 1 minute.",
            host.load_average[0] if host.load_average else None,
        ),
    ):
        family = GaugeMetricFamily(name, documentation, labels=["Hostname"])
        if value is not None:
            family.add_metric([hostname], value)
        families.append(family)
    for direction in ("rx", "tx"):
        family = GaugeMetricFamily(
            f"gpuval_infiniband_{direction}_bytes_per_second",
            f"InfiniBand port data {'received' if direction == 'rx' else 'sent'}, from sysfs counters.",
            labels=["Hostname", "hca", "port"],
        )
        for port in reading.infiniband:
            value = getattr(port, f"{direction}_bytes_per_s")
            if value is not None:
                family.add_metric([hostname, port.hca, str(port.port)], value)
        families.append(family)
    return families


class ReadingCollector(Collector):
    """Serves whatever reading `latest` returns at scrape time; the monitor loop keeps it fresh."""

    def __init__(self, latest: Callable[[], Reading | None]) -> None:
        self.latest = latest

    def collect(self) -> Iterable[GaugeMetricFamily]:
        reading = self.latest()
        return metrics(reading) if reading is not None else []


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' or 'PORT' (these two on 127.0.0.1); '[::1]:9400' for IPv6."""
    host, _, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]") or DEFAULT_HOST
    if not port.isdigit() or int(port) > 65535:
        raise UsageError(
            f"--prometheus '{text}': expected HOST:PORT, :PORT or PORT, e.g. 9400 (127.0.0.1 only) "
            "or 0.0.0.0:9400 (every interface)"
        )
    return host, int(port)


def serve(
    address: tuple[str, int], latest: Callable[[], Reading | None]
) -> tuple[WSGIServer, threading.Thread]:
    """Serve /metrics at `address` from a daemon thread; port 0 takes a free port (server.server_port)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReadingCollector(latest))
    host, port = address
    try:
        return start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise UsageError(
            f"--prometheus {host}:{port}: cannot listen there: {exc.strerror or exc}; "
            "choose another HOST:PORT"
        ) from None

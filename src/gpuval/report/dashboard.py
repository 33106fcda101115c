"""A reading for people: one rich table row per GPU, one per InfiniBand port, and a line for the host.

A value NVML or sysfs could not give prints as N/A, as everywhere in gpuval; its reason stays in --json.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpuval.monitor.sample import GpuReading, Reading

NA = "N/A"


def _number(value: Any, unit: str = "", digits: int = 0) -> str:
    return f"{value:.{digits}f}{unit}" if isinstance(value, (int, float)) else NA


def _pair(first: Any, second: Any, scale: float = 1.0, digits: int = 0) -> str:
    """'131/700', '0.6/140.4'; N/A for a side that is missing."""

    def one(value: Any) -> str:
        return f"{value / scale:.{digits}f}" if isinstance(value, (int, float)) else NA

    if one(first) == NA and one(second) == NA:
        return NA
    return f"{one(first)}/{one(second)}"


def _rate(bytes_per_s: Any) -> str:
    """Decimal units, as link speeds are quoted: 1.5e9 -> '1.5 GB/s'."""
    if not isinstance(bytes_per_s, (int, float)):
        return NA
    for unit, factor in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= factor:
            return f"{bytes_per_s / factor:.1f} {unit}"
    return f"{bytes_per_s:.0f} B/s"


def _throttle(gpu: GpuReading) -> str:
    if not isinstance(gpu.clock_event_reasons, int):
        return NA
    return ", ".join(gpu.clock_reasons()) or "none"


def _name(value: Any) -> str:
    return value.removeprefix("NVIDIA ") if isinstance(value, str) else NA


def _host_line(reading: Reading) -> Text:
    host = reading.host
    load = " ".join(f"{value:.2f}" for value in host.load_average) if host.load_average else NA
    return Text(
        f"{reading.hostname or 'host'}  CPU {_number(host.cpu_percent, '%', 1)}  "
        f"memory {_pair(host.memory_used_bytes, host.memory_total_bytes, 2**30, 1)} GiB  load {load}"
    )


def _table(title: str, columns: tuple[str, ...], text: tuple[str, ...]) -> Table:
    """Units sit in the headers and one space parts the columns, so a GPU row fits 120 columns. Where it
    does not, only the `text` columns (a long throttle list) wrap: numbers never break."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, padding=0)
    for header in columns:
        if header in text:
            table.add_column(header)
        else:
            table.add_column(header, justify="right", no_wrap=True)
    return table


GPU_COLUMNS = (
    *("GPU", "name", "util %", "mem %", "memory GiB", "temp C", "power W", "SM MHz", "throttle"),
    *("PCIe tx", "PCIe rx", "NVLink tx", "NVLink rx"),
)


def _gpu_table(gpus: list[GpuReading]) -> Table:
    table = _table("GPUs", GPU_COLUMNS, text=("name", "throttle"))
    for gpu in gpus:
        table.add_row(
            str(gpu.index),
            _name(gpu.name),
            _number(gpu.utilization_gpu_percent),
            _number(gpu.utilization_memory_percent),
            _pair(gpu.memory_used_bytes, gpu.memory_total_bytes, 2**30, 1),
            _number(gpu.temperature_c),
            _pair(gpu.power_usage_w, gpu.power_limit_w),
            _number(gpu.sm_clock_mhz),
            _throttle(gpu),
            _rate(gpu.pcie_tx_bytes_per_s),
            _rate(gpu.pcie_rx_bytes_per_s),
            _rate(gpu.nvlink_tx_bytes_per_s),
            _rate(gpu.nvlink_rx_bytes_per_s),
        )
    return table


def _infiniband_table(reading: Reading) -> Table:
    table = _table("InfiniBand", ("port", "state", "link Gb/s", "rx", "tx"), text=("port", "state"))
    for port in reading.infiniband:
        table.add_row(
            f"{port.hca}/{port.port}",
            port.state or NA,
            _number(port.rate_gbps),
            _rate(port.rx_bytes_per_s),
            _rate(port.tx_bytes_per_s),
        )
    return table


def render(reading: Reading) -> RenderableType:
    """The whole dashboard for one reading."""
    parts: list[RenderableType] = [Text(f"gpuval monitor  {reading.time}", style="bold"), _host_line(reading)]
    if reading.no_gpu is not None:
        parts.append(Text(f"no GPU: {reading.no_gpu}"))
    if reading.gpus:
        parts.append(_gpu_table(reading.gpus))
    if reading.infiniband:
        parts.append(_infiniband_table(reading))
    return Group(*parts)

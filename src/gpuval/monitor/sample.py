"""One reading of this node for `gpuval monitor`: every GPU through NVML, InfiniBand port rates and the host's
CPU, memory and load from /proc and /sys. No UI here: the dashboard and the exporter both draw from it.

NVML goes through `gpuval.nvml.Nvml`, whose calls never raise: a field the GPU cannot give holds an
`Unavailable` with the reason, and one GPU's errors touch no other GPU's fields. CPU %, NVLink, InfiniBand and
the GPM profiling metrics (gpm.py) come from counters read twice, so the first reading of a `Sampler` holds
none of them (PCIe throughput is NVML's own 20 ms sample, there at once). The last XID comes from an event
thread the sampler starts with its first GPU reading (xid_watch.py) and stops in `close()`. The NVML library
(`library`), the filesystem root (`root`) and the clock are injectable: tests replay recorded NVML answers
over a fake /proc and /sys.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuval.discover.host import meminfo_bytes, read_text
from gpuval.discover.network import infiniband_ports
from gpuval.monitor.gpm import GpmReader
from gpuval.monitor.xid_watch import XidWatch
from gpuval.nvml import GpuRecord, Nvml, Unavailable, available, field_value, gpu_fields, scaled

NVLINK_ALL_LINKS = 0xFFFFFFFF  # scopeId UINT_MAX: nvml.h's sum over every link of a throughput field
# nvmlValueType_t -> the member of the nvmlValue_t union that holds the value (nvml.h)
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
FIRST_READING = Unavailable("a rate needs two readings")


@dataclass
class GpuReading(GpuRecord):
    """One GPU now; each field a value or Unavailable (why NVML could not give it). The fields it shares
    with the snapshot's GpuInfo are read by gpuval.nvml.gpu_fields and named as there."""

    index: int
    name: Any = None
    uuid: Any = None
    pci_bus_id: Any = None
    utilization_gpu_percent: Any = None
    utilization_memory_percent: Any = None  # time the memory controller was busy, DCGM's MEM_COPY_UTIL
    memory_used_bytes: Any = None
    memory_free_bytes: Any = None
    memory_total_bytes: Any = None
    temperature_c: Any = None
    power_usage_w: Any = None
    power_limit_w: Any = None
    sm_clock_mhz: Any = None
    mem_clock_mhz: Any = None
    clock_event_reasons: Any = None  # bit mask, gpuval.nvml.CLOCK_REASONS
    pcie_tx_bytes_per_s: Any = None
    pcie_rx_bytes_per_s: Any = None
    nvlink_tx_bytes_per_s: Any = None
    nvlink_rx_bytes_per_s: Any = None
    memory_temperature_c: Any = None  # the GPU memory's own sensor (HBM), NVML_FI_DEV_MEMORY_TEMP
    total_energy_mj: Any = None  # since the driver loaded
    encoder_utilization_percent: Any = None
    decoder_utilization_percent: Any = None
    pcie_replay_count: Any = None
    remapped_rows_correctable: Any = None
    remapped_rows_uncorrectable: Any = None
    remapping_pending: Any = None
    remapping_failed: Any = None
    last_xid: Any = None  # the last critical XID since the monitor started, 0 before any (xid_watch.py)
    # GPM (gpm.py): activities as ratios 0-1, traffic in bytes/s, over the last interval
    gpm_graphics_active_ratio: Any = None
    gpm_sm_active_ratio: Any = None
    gpm_sm_occupancy_ratio: Any = None
    gpm_tensor_active_ratio: Any = None
    gpm_dram_active_ratio: Any = None
    gpm_fp64_active_ratio: Any = None
    gpm_fp32_active_ratio: Any = None
    gpm_fp16_active_ratio: Any = None
    gpm_pcie_tx_bytes_per_s: Any = None
    gpm_pcie_rx_bytes_per_s: Any = None
    gpm_nvlink_tx_bytes_per_s: Any = None
    gpm_nvlink_rx_bytes_per_s: Any = None


@dataclass
class InfinibandPortReading:
    hca: str
    port: int
    state: str | None
    rate_gbps: float | None
    rx_bytes_per_s: float | None  # None on the first reading or when a counter is missing
    tx_bytes_per_s: float | None


@dataclass
class HostReading:
    cpu_percent: float | None  # busy share of all CPUs since the last reading; None on the first
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    load_average: tuple[float, float, float] | None  # 1, 5 and 15 minutes


@dataclass
class Reading:
    time: str  # ISO-8601, UTC
    hostname: str | None
    host: HostReading
    driver_version: str | None = None  # the exporter's DCGM_FI_DRIVER_VERSION label
    gpus: list[GpuReading] = field(default_factory=list)
    no_gpu: str | None = None  # why there is no GPU row: NVML's own reason
    infiniband: list[InfinibandPortReading] = field(default_factory=list)
    interval_s: float | None = None  # seconds since the previous reading: the span of every rate

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "hostname": self.hostname,
            "driver_version": self.driver_version,
            "interval_s": round(self.interval_s, 3) if self.interval_s is not None else None,
            "host": asdict(self.host),
            "no_gpu": self.no_gpu,
            "gpus": [gpu.to_json() for gpu in self.gpus],
            "infiniband": [asdict(port) for port in self.infiniband],
        }


@dataclass(frozen=True)
class CpuTimes:
    busy: int  # clock ticks, all CPUs
    total: int


def cpu_times(stat: str | None) -> CpuTimes | None:
    """The aggregate 'cpu' line of /proc/stat as busy and total ticks.

    proc(5): user nice system idle iowait irq softirq steal guest guest_nice; guest and guest_nice are
    already counted in user and nice, so the total stops at steal. Idle time is idle + iowait.
    """
    for line in (stat or "").splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            ticks = [int(part) for part in parts[1:9]]
            total = sum(ticks)
            return CpuTimes(busy=total - ticks[3] - (ticks[4] if len(ticks) > 4 else 0), total=total)
    return None


def cpu_percent(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    if before is None or after is None or after.total <= before.total:
        return None
    return 100.0 * (after.busy - before.busy) / (after.total - before.total)


def rate_per_s(before: Any, after: Any, seconds: float | None, unit_bytes: int = 1) -> float | None:
    """Bytes per second between two readings of a counter of `unit_bytes`-byte units; None when either
    reading is missing or the counter went back (a reset, a driver reload)."""
    if not isinstance(before, int) or not isinstance(after, int) or not seconds or after < before:
        return None
    return (after - before) * unit_bytes / seconds


def load_average(text: str | None) -> tuple[float, float, float] | None:
    """/proc/loadavg: '2.47 2.54 2.10 3/101 19542' -> (2.47, 2.54, 2.1)."""
    parts = (text or "").split()
    try:
        return float(parts[0]), float(parts[1]), float(parts[2])
    except (IndexError, ValueError):
        return None


def _counter(path: Path) -> int | None:
    text = read_text(path)
    return int(text) if text is not None and text.isdigit() else None


def _field_value(nvml: Nvml, entry: Any) -> Any:
    """One nvmlFieldValue_t: its value, or Unavailable named after the NVML error of that field alone."""
    code = field_value(entry, "nvmlReturn")
    if code != 0:
        return nvml.error_of(code)
    member = _VALUE_MEMBERS.get(field_value(entry, "valueType"))
    if not member:
        return Unavailable("unknown NVML value type")
    return field_value(field_value(entry, "value"), member)


def _nvlink_rate(before_kib: Any, after_kib: Any, seconds: float | None) -> Any:
    if not available(after_kib):
        return after_kib
    if not isinstance(before_kib, int):
        return FIRST_READING
    rate = rate_per_s(before_kib, after_kib, seconds, unit_bytes=1024)
    return Unavailable("the counter went back (a driver reload?)") if rate is None else rate


class Sampler:
    """Readings of this node; keeps the previous counters, so each reading's rates span the last interval."""

    def __init__(
        self, library: Any = None, root: Path = Path("/"), clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.nvml = Nvml(library)
        self.root = root
        self.clock = clock
        self.hostname = read_text(root / "proc/sys/kernel/hostname") or (
            socket.gethostname() if root == Path("/") else None
        )
        self._time: float | None = None
        self._cpu: CpuTimes | None = None
        self._ib: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        self._nvlink: dict[int, tuple[Any, Any]] = {}  # GPU index -> (tx KiB, rx KiB) counters
        self._gpm = GpmReader(self.nvml)
        self._xid: XidWatch | None = None  # started with the first GPU reading
        driver = self.nvml("nvmlSystemGetDriverVersion")
        self.driver_version = driver if isinstance(driver, str) else None

    def sample(self) -> Reading:
        now = self.clock()
        seconds = now - self._time if self._time is not None else None
        self._time = now
        cpu = cpu_times(read_text(self.root / "proc/stat"))
        meminfo = read_text(self.root / "proc/meminfo")
        total = meminfo_bytes(meminfo, "MemTotal")
        # MemAvailable: what `free` calls available (reclaimable page cache counts as free)
        unused = meminfo_bytes(meminfo, "MemAvailable")
        host = HostReading(
            cpu_percent=cpu_percent(self._cpu, cpu),
            memory_used_bytes=total - unused if total is not None and unused is not None else None,
            memory_total_bytes=total,
            load_average=load_average(read_text(self.root / "proc/loadavg")),
        )
        self._cpu = cpu
        gpus, no_gpu = self._gpus(seconds)
        return Reading(
            time=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            hostname=self.hostname,
            host=host,
            driver_version=self.driver_version,
            gpus=gpus,
            no_gpu=no_gpu,
            infiniband=self._infiniband(seconds),
            interval_s=seconds,
        )

    def close(self) -> None:
        if self._xid is not None:
            self._xid.stop()
        self._gpm.close()
        self.nvml.shutdown()

    def _infiniband(self, seconds: float | None) -> list[InfinibandPortReading]:
        readings = []
        counters = {}
        for port in infiniband_ports(self.root):
            key = (port["hca"], port["port"])
            base = self.root / "sys/class/infiniband" / port["hca"] / "ports" / str(port["port"]) / "counters"
            # Linux Documentation/ABI/stable/sysfs-class-infiniband: port_rcv_data / port_xmit_data count
            # "data octets, divided by 4 (lanes)": one unit is 4 bytes.
            counters[key] = (_counter(base / "port_rcv_data"), _counter(base / "port_xmit_data"))
            before = self._ib.get(key, (None, None))
            readings.append(
                InfinibandPortReading(
                    hca=port["hca"],
                    port=port["port"],
                    state=port["state"],
                    rate_gbps=port["rate_gbps"],
                    rx_bytes_per_s=rate_per_s(before[0], counters[key][0], seconds, unit_bytes=4),
                    tx_bytes_per_s=rate_per_s(before[1], counters[key][1], seconds, unit_bytes=4),
                )
            )
        self._ib = counters
        return readings

    def _gpus(self, seconds: float | None) -> tuple[list[GpuReading], str | None]:
        nvml = self.nvml
        if nvml.error is not None:
            return [], nvml.error
        handles = nvml.handles()
        if not available(handles):
            return [], f"cannot count GPUs: {handles.reason}"
        if not handles:
            return [], "NVML sees no GPU"
        if self._xid is None:
            self._xid = XidWatch(nvml, handles)
        gpus = []
        counters = {}
        for index, handle in enumerate(handles):
            if not available(handle):  # a GPU that fell off the bus still gets its row, with why
                gpus.append(GpuReading(index, **{f.name: handle for f in fields(GpuReading)[1:]}))
                continue
            gpu, counters[index] = self._gpu(index, handle)
            gpu.last_xid = self._xid.last_xid(index)
            before = self._nvlink.get(index, (None, None))
            gpu.nvlink_tx_bytes_per_s = _nvlink_rate(before[0], counters[index][0], seconds)
            gpu.nvlink_rx_bytes_per_s = _nvlink_rate(before[1], counters[index][1], seconds)
            gpus.append(gpu)
        self._nvlink = counters
        return gpus, None

    def _gpu(self, index: int, handle: Any) -> tuple[GpuReading, tuple[Any, Any]]:
        """The GPU's instantaneous fields, and its cumulative NVLink (tx, rx) KiB counters."""
        nvml, c = self.nvml, self.nvml.constant
        utilization = nvml("nvmlDeviceGetUtilizationRates", handle)
        # (percent, sampling period in us); NotSupported on GPUs without the engine
        encoder = nvml("nvmlDeviceGetEncoderUtilization", handle)
        decoder = nvml("nvmlDeviceGetDecoderUtilization", handle)
        memory_temperature = nvml("nvmlDeviceGetFieldValues", handle, [(c("NVML_FI_DEV_MEMORY_TEMP", 82), 0)])
        gpu = GpuReading(
            index=index,
            **gpu_fields(nvml, handle),
            **self._gpm.read(index, handle),
            utilization_gpu_percent=field_value(utilization, "gpu"),
            utilization_memory_percent=field_value(utilization, "memory"),
            encoder_utilization_percent=encoder[0] if available(encoder) else encoder,
            decoder_utilization_percent=decoder[0] if available(decoder) else decoder,
            memory_temperature_c=_field_value(nvml, memory_temperature[0])
            if available(memory_temperature)
            else memory_temperature,
            total_energy_mj=nvml("nvmlDeviceGetTotalEnergyConsumption", handle),
            # nvmlDeviceGetPcieThroughput: KB/s over a 20 ms sample, KiB as nvitop reads it
            pcie_tx_bytes_per_s=scaled(
                nvml("nvmlDeviceGetPcieThroughput", handle, c("NVML_PCIE_UTIL_TX_BYTES", 0)), 1024
            ),
            pcie_rx_bytes_per_s=scaled(
                nvml("nvmlDeviceGetPcieThroughput", handle, c("NVML_PCIE_UTIL_RX_BYTES", 1)), 1024
            ),
        )
        # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX: data payload in KiB since the driver loaded (nvml.h)
        fields_ = nvml(
            "nvmlDeviceGetFieldValues",
            handle,
            [
                (c("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138), NVLINK_ALL_LINKS),
                (c("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139), NVLINK_ALL_LINKS),
            ],
        )
        nvlink = (
            (_field_value(nvml, fields_[0]), _field_value(nvml, fields_[1]))
            if available(fields_)
            else (fields_, fields_)
        )
        return gpu, nvlink

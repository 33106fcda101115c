"""Hopper's profiling metrics through NVML's GPU Performance Monitoring (GPM), in DCGM's units.

GPM gives a metric over the span between two samples of a GPU's counters: `nvmlGpmSampleGet` once per
reading, then `nvmlGpmMetricsGet` over this reading's sample and the previous one. So, like every rate of the
monitor, the first reading has none, and each later one spans the interval since the reading before.

Units: NVML gives activities in percent (0-100) and PCIe/NVLink traffic in MiB/s (nvml.h,
nvmlGpmMetricId_t); DCGM's DCGM_FI_PROF_* fields, which the exporter's names follow, are ratios (0-1) and
bytes per second (dcgm_fields.h). The reading keeps DCGM's units, so `gpm_sm_active_ratio` is 0.375 where
NVML said 37.5.

A GPU without GPM (before Hopper: `nvmlGpmQueryDeviceSupport` says so), a driver or nvidia-ml-py without the
calls, and a sample NVML refuses all give Unavailable with the reason: the exporter leaves those fields out.
Only whole GPUs are read (the monitor lists no MIG instance); a GPU in MIG mode gets what NVML's whole-GPU
sample gives, or the reason it gives none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuval.nvml import Nvml, Unavailable, available, field_value

FIRST_READING = Unavailable("a GPM metric needs two readings")
NOT_HOPPER = Unavailable("NVML says this GPU has no GPM (Hopper and later have it)")


@dataclass(frozen=True)
class GpmMetric:
    field: str  # the GpuReading attribute it fills
    constant: str  # pynvml's name of the nvmlGpmMetricId_t value
    metric_id: int  # that value in nvml.h, for an nvidia-ml-py without the name
    scale: float  # NVML's unit -> the reading's (percent -> ratio, MiB/s -> bytes/s)


PERCENT, MIB = 0.01, float(2**20)
METRICS = (
    GpmMetric("gpm_graphics_active_ratio", "NVML_GPM_METRIC_GRAPHICS_UTIL", 1, PERCENT),
    GpmMetric("gpm_sm_active_ratio", "NVML_GPM_METRIC_SM_UTIL", 2, PERCENT),
    GpmMetric("gpm_sm_occupancy_ratio", "NVML_GPM_METRIC_SM_OCCUPANCY", 3, PERCENT),
    GpmMetric("gpm_tensor_active_ratio", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5, PERCENT),
    GpmMetric("gpm_dram_active_ratio", "NVML_GPM_METRIC_DRAM_BW_UTIL", 10, PERCENT),
    GpmMetric("gpm_fp64_active_ratio", "NVML_GPM_METRIC_FP64_UTIL", 11, PERCENT),
    GpmMetric("gpm_fp32_active_ratio", "NVML_GPM_METRIC_FP32_UTIL", 12, PERCENT),
    GpmMetric("gpm_fp16_active_ratio", "NVML_GPM_METRIC_FP16_UTIL", 13, PERCENT),
    GpmMetric("gpm_pcie_tx_bytes_per_s", "NVML_GPM_METRIC_PCIE_TX_PER_SEC", 20, MIB),
    GpmMetric("gpm_pcie_rx_bytes_per_s", "NVML_GPM_METRIC_PCIE_RX_PER_SEC", 21, MIB),
    GpmMetric("gpm_nvlink_rx_bytes_per_s", "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", 60, MIB),
    GpmMetric("gpm_nvlink_tx_bytes_per_s", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", 61, MIB),
)
FIELDS = tuple(metric.field for metric in METRICS)


def _all(value: Any) -> dict[str, Any]:
    return dict.fromkeys(FIELDS, value)


class GpmReader:
    """Keeps each GPU's previous GPM sample; `read` takes a new one and gives the metrics over the pair."""

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        self._supported: dict[int, bool] = {}  # GPU index -> NVML's answer, once it gave one
        self._previous: dict[int, Any] = {}  # GPU index -> its sample of the last reading

    def read(self, index: int, handle: Any) -> dict[str, Any]:
        """Every GPM field of one GPU: a value in the reading's unit, or Unavailable with the reason."""
        unsupported = self._unsupported(index, handle)
        if unsupported is not None:
            return _all(unsupported)
        nvml = self.nvml
        sample = nvml("nvmlGpmSampleAlloc")
        if not available(sample):
            return _all(sample)
        taken = nvml("nvmlGpmSampleGet", handle, sample)
        before = self._previous.pop(index, None)
        if not available(taken):
            nvml("nvmlGpmSampleFree", sample)
            if before is not None:  # the pair is broken: the next reading starts a new one
                nvml("nvmlGpmSampleFree", before)
            return _all(taken)
        self._previous[index] = sample
        if before is None:
            return _all(FIRST_READING)
        try:
            return self._metrics(before, sample)
        finally:
            nvml("nvmlGpmSampleFree", before)

    def close(self) -> None:
        for sample in self._previous.values():
            self.nvml("nvmlGpmSampleFree", sample)
        self._previous.clear()

    def _unsupported(self, index: int, handle: Any) -> Unavailable | None:
        if index not in self._supported:
            support = self.nvml("nvmlGpmQueryDeviceSupport", handle)
            if not available(support):
                return support  # not cached: an error may pass, a "no" from NVML does not
            self._supported[index] = bool(field_value(support, "isSupportedDevice"))
        return None if self._supported[index] else NOT_HOPPER

    def _metrics(self, before: Any, after: Any) -> dict[str, Any]:
        nvml = self.nvml
        request = nvml.new("c_nvmlGpmMetricsGet_t")
        if not available(request):
            return _all(request)
        request.version = nvml.constant("NVML_GPM_METRICS_GET_VERSION", 1)
        request.numMetrics = len(METRICS)
        request.sample1, request.sample2 = before, after
        for position, metric in enumerate(METRICS):  # the array has room for every metric NVML knows
            request.metrics[position].metricId = nvml.constant(metric.constant, metric.metric_id)
        answer = nvml("nvmlGpmMetricsGet", request)
        if not available(answer):
            return _all(answer)
        values: dict[str, Any] = {}
        for position, metric in enumerate(METRICS):
            slot = answer.metrics[position]
            code = slot.nvmlReturn
            values[metric.field] = slot.value * metric.scale if code == 0 else nvml.error_of(code)
        return values

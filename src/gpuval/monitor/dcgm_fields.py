"""The GPU metrics the exporter serves, one row per name: a data table, read row by row.

Names, Prometheus types and HELP texts are DCGM-exporter's (etc/default-counters.csv and
etc/dcp-metrics-included.csv of NVIDIA/dcgm-exporter), so its dashboards and alert rules read gpuval's
exporter unchanged; the two DCGM_FI_PROF_NVLINK_* names, which no dcgm-exporter file lists, carry a HELP in
the same style. Each row names the GpuReading fields it sums and the reading units per exported unit:
readings keep bytes, DCGM reports MiB, KB/s or MB/s for some fields. docs/monitor-metrics.md gives every row's
NVML source and meaning, with sources.

Types follow DCGM-exporter with one exception kept from before: PCIe and NVLink throughput are rates, so
they are gauges here although DCGM-exporter's files have declared them counters.
"""

from __future__ import annotations

from typing import NamedTuple

XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"  # carries err_code and err_msg labels as DCGM-exporter's does


class DcgmField(NamedTuple):
    name: str
    type: str  # "gauge" or "counter"
    help: str
    attributes: tuple[str, ...]  # GpuReading fields, summed
    per: float = 1  # reading units per exported unit


GPU_METRICS: tuple[DcgmField, ...] = (
    # clocks
    DcgmField("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", ("sm_clock_mhz",)),
    DcgmField("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", ("mem_clock_mhz",)),
    DcgmField(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "gauge",
        "Current clock throttle reasons (bit mask of nvmlClocksEventReason*).",
        ("clock_event_reasons",),
    ),
    # temperature
    DcgmField("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", ("memory_temperature_c",)),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", ("temperature_c",)),
    # power
    DcgmField("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", ("power_usage_w",)),
    DcgmField(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        ("total_energy_mj",),
    ),
    # PCIe
    DcgmField(
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "gauge",
        "PCIe transmit throughput (in KB/s).",
        ("pcie_tx_bytes_per_s",),
        1024,
    ),
    DcgmField(
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "gauge",
        "PCIe receive throughput (in KB/s).",
        ("pcie_rx_bytes_per_s",),
        1024,
    ),
    DcgmField(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", ("pcie_replay_count",)
    ),
    # utilization
    DcgmField("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", ("utilization_gpu_percent",)),
    DcgmField(
        "DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", ("utilization_memory_percent",)
    ),
    DcgmField(
        "DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", ("encoder_utilization_percent",)
    ),
    DcgmField(
        "DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", ("decoder_utilization_percent",)
    ),
    # errors
    DcgmField(XID_ERRORS, "gauge", "Value of the last XID error encountered.", ("last_xid",)),
    DcgmField(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        ("remapped_rows_uncorrectable",),
    ),
    DcgmField(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        ("remapped_rows_correctable",),
    ),
    DcgmField(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed",
        ("remapping_failed",),
    ),
    # memory
    DcgmField(
        "DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", ("memory_free_bytes",), 2**20
    ),
    DcgmField(
        "DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", ("memory_used_bytes",), 2**20
    ),
    # NVLink
    DcgmField(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "gauge",
        "NVLink data sent and received over all links (in MB/s).",
        ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"),
        1e6,
    ),
    # profiling (NVML GPM, Hopper and later)
    DcgmField(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        ("gpm_graphics_active_ratio",),
    ),
    DcgmField(
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        ("gpm_sm_active_ratio",),
    ),
    DcgmField(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "The ratio of number of warps resident on an SM.",
        ("gpm_sm_occupancy_ratio",),
    ),
    DcgmField(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        ("gpm_tensor_active_ratio",),
    ),
    DcgmField(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        ("gpm_dram_active_ratio",),
    ),
    DcgmField(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "gauge",
        "Ratio of cycles the fp64 pipes are active.",
        ("gpm_fp64_active_ratio",),
    ),
    DcgmField(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "gauge",
        "Ratio of cycles the fp32 pipes are active.",
        ("gpm_fp32_active_ratio",),
    ),
    DcgmField(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "gauge",
        "Ratio of cycles the fp16 pipes are active.",
        ("gpm_fp16_active_ratio",),
    ),
    DcgmField(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads "
        "- in bytes per second.",
        ("gpm_pcie_tx_bytes_per_s",),
    ),
    DcgmField(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads "
        "- in bytes per second.",
        ("gpm_pcie_rx_bytes_per_s",),
    ),
    DcgmField(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "The rate of data transmitted over all NVLinks - in bytes per second.",
        ("gpm_nvlink_tx_bytes_per_s",),
    ),
    DcgmField(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "gauge",
        "The rate of data received over all NVLinks - in bytes per second.",
        ("gpm_nvlink_rx_bytes_per_s",),
    ),
)

"""Record what NVML answers on a real GPU machine, so tests can replay it where no GPU exists.

Every query gpuval's discovery, health checks and monitor make is called for every GPU (and every NVLink,
and every GPU pair for topology); each answer is stored as JSON, an NVML error as {"error": NAME}. The
monitor's own queries (record_monitor) include GPM metrics over two samples `--gpm-interval` seconds apart
and one wait of the XID event set (record_xid_events), so run it while a GPU load runs to record real
activity (tools/device/exporter_device.sh). Host facts the checks read from /proc and /sys ride along.
Usage: record_nvml.py --output FILE [--gpm-interval S]. tests/nvml_replay.py replays what this writes.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import pynvml as nv

from gpuval.monitor.gpm import METRICS as GPM_METRICS


def plain(value: Any) -> Any:
    """ctypes structures, arrays and bytes as JSON values."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (ctypes.Structure, ctypes.Union)):  # a union (nvmlValue_t): every member
        return {name: plain(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, ctypes.Array):
        return [plain(item) for item in value]
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if hasattr(value, "__dict__") and not isinstance(value, (int, float, str)):
        return {key: plain(item) for key, item in vars(value).items() if not key.startswith("_")}
    return value


def call(name: str, *args: Any) -> Any:
    function = getattr(nv, name, None)
    if function is None:
        return {"error": "FunctionNotInThisBinding"}
    try:
        return plain(function(*args))
    except nv.NVMLError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - recorded as it happened
        return {"error": type(exc).__name__, "message": str(exc)}


PER_DEVICE = [
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetBoardPartNumber",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetBoardId",
    "nvmlDeviceGetInforomImageVersion",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
]
# GPM metrics recorded beside those gpuval reads (the kinds of tensor work, integer pipe), for later use.
GPM_EXTRA_IDS = (4, 6, 7, 8, 9)


def record_device(index: int, handle: Any, handles: list[Any]) -> dict[str, Any]:
    answers: dict[str, Any] = {name: call(name, handle) for name in PER_DEVICE}
    for error_type, label in (
        (nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected"),
        (nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
    ):
        for counter, counter_label in (
            (nv.NVML_VOLATILE_ECC, "volatile"),
            (nv.NVML_AGGREGATE_ECC, "aggregate"),
        ):
            answers[f"nvmlDeviceGetTotalEccErrors({label},{counter_label})"] = call(
                "nvmlDeviceGetTotalEccErrors", handle, error_type, counter
            )
    for cause, label in (
        (nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, "sbe"),
        (nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, "dbe"),
    ):
        answers[f"nvmlDeviceGetRetiredPages({label})"] = call("nvmlDeviceGetRetiredPages", handle, cause)
    for sensor, label in ((nv.NVML_TEMPERATURE_GPU, "gpu"),):
        answers[f"nvmlDeviceGetTemperature({label})"] = call("nvmlDeviceGetTemperature", handle, sensor)
    for threshold, label in (
        (nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, "slowdown"),
        (nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, "shutdown"),
        (getattr(nv, "NVML_TEMPERATURE_THRESHOLD_GPU_MAX", 3), "gpu_max"),
    ):
        answers[f"nvmlDeviceGetTemperatureThreshold({label})"] = call(
            "nvmlDeviceGetTemperatureThreshold", handle, threshold
        )
    for clock, label in (
        (nv.NVML_CLOCK_SM, "sm"),
        (nv.NVML_CLOCK_MEM, "mem"),
        (nv.NVML_CLOCK_GRAPHICS, "graphics"),
    ):
        answers[f"nvmlDeviceGetClockInfo({label})"] = call("nvmlDeviceGetClockInfo", handle, clock)
        answers[f"nvmlDeviceGetMaxClockInfo({label})"] = call("nvmlDeviceGetMaxClockInfo", handle, clock)
    answers["nvmlDeviceGetCpuAffinity(64)"] = call("nvmlDeviceGetCpuAffinity", handle, 64)
    answers.update(record_monitor(handle))
    links = []
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        entry = {"state": call("nvmlDeviceGetNvLinkState", handle, link)}
        if isinstance(entry["state"], dict):  # not supported: the rest would say the same
            links.append(entry)
            continue
        entry["version"] = call("nvmlDeviceGetNvLinkVersion", handle, link)
        entry["remote_pci"] = call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        entry["remote_device_type"] = call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        for counter, label in (
            (nv.NVML_NVLINK_ERROR_DL_REPLAY, "dl_replay"),
            (nv.NVML_NVLINK_ERROR_DL_RECOVERY, "dl_recovery"),
            (nv.NVML_NVLINK_ERROR_DL_CRC_FLIT, "dl_crc_flit"),
        ):
            entry[f"error_{label}"] = call("nvmlDeviceGetNvLinkErrorCounter", handle, link, counter)
        links.append(entry)
    answers["nvlinks"] = links
    answers["topology"] = {
        str(other): call("nvmlDeviceGetTopologyCommonAncestor", handle, handles[other])
        for other in range(len(handles))
        if other != index
    }
    answers["p2p_status_nvlink"] = {
        str(other): call("nvmlDeviceGetP2PStatus", handle, handles[other], nv.NVML_P2P_CAPS_INDEX_NVLINK)
        for other in range(len(handles))
        if other != index
    }
    return answers


def record_monitor(handle: Any) -> dict[str, Any]:
    """gpuval monitor's own per-GPU queries: PCIe throughput (KB/s over NVML's 20 ms window), the NVLink
    throughput fields 138/139 (cumulative KiB, scope UINT_MAX = every link) and the memory temperature
    field, as recorded structures, and whether GPM is supported. GPM itself and the event set are
    recorded by record_gpm and record_xid_events, which take time."""
    answers: dict[str, Any] = {}
    for counter, label in ((nv.NVML_PCIE_UTIL_TX_BYTES, "tx"), (nv.NVML_PCIE_UTIL_RX_BYTES, "rx")):
        answers[f"nvmlDeviceGetPcieThroughput({label})"] = call(
            "nvmlDeviceGetPcieThroughput", handle, counter
        )
    answers["nvmlDeviceGetFieldValues(nvlink_throughput)"] = call(
        "nvmlDeviceGetFieldValues", handle, [(138, 0xFFFFFFFF), (139, 0xFFFFFFFF)]
    )
    answers["nvmlDeviceGetFieldValues(memory_temp)"] = call(
        "nvmlDeviceGetFieldValues", handle, [(getattr(nv, "NVML_FI_DEV_MEMORY_TEMP", 82), 0)]
    )
    answers["nvmlGpmQueryDeviceSupport"] = call("nvmlGpmQueryDeviceSupport", handle)
    return answers


def _raised(exc: Exception) -> dict[str, str]:
    return {"error": type(exc).__name__, "message": str(exc)}


def record_gpm(handle: Any, interval_s: float) -> dict[str, Any]:
    """Two GPM samples `interval_s` apart and every metric gpuval reads over them (plus GPM_EXTRA_IDS), as
    NVML gives them: percent and MiB/s, each with its own return code and NVML's unit."""
    record: dict[str, Any] = {"interval_s": interval_s, "nvmlGpmSampleGet": []}
    samples = []
    try:
        for _ in range(2):
            samples.append(nv.nvmlGpmSampleAlloc())
            taken = call("nvmlGpmSampleGet", handle, samples[-1])  # the sample itself, or the error
            record["nvmlGpmSampleGet"].append(taken if isinstance(taken, dict) and "error" in taken else None)
            if len(samples) == 1:
                time.sleep(interval_s)
        ids = [getattr(nv, metric.constant, metric.metric_id) for metric in GPM_METRICS] + list(GPM_EXTRA_IDS)
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(ids)
        request.sample1, request.sample2 = samples
        for position, metric_id in enumerate(ids):
            request.metrics[position].metricId = metric_id
        nv.nvmlGpmMetricsGet(request)
        metrics = []
        for position in range(len(ids)):
            slot = request.metrics[position]
            unit = slot.metricInfo.unit
            metrics.append(
                {
                    "metricId": slot.metricId,
                    "nvmlReturn": slot.nvmlReturn,
                    "value": slot.value,
                    "unit": unit.decode(errors="replace") if unit else None,
                }
            )
        record["nvmlGpmMetricsGet"] = {"metrics": metrics}
    except Exception as exc:  # noqa: BLE001 - NotSupported (before Hopper), no GPM in this binding: as it happened
        record.setdefault("nvmlGpmMetricsGet", _raised(exc))
    finally:
        for sample in samples:
            call("nvmlGpmSampleFree", sample)
    return record


def record_xid_events(handles: list[Any], wait_ms: int = 500) -> tuple[dict[str, Any], list[Any]]:
    """One event set registered for critical XIDs on every GPU, waited on once: the system-level answers,
    and each GPU's answer to its registration."""
    try:
        event_set = nv.nvmlEventSetCreate()
    except Exception as exc:  # noqa: BLE001 - recorded as it happened
        return {"nvmlEventSetCreate": _raised(exc)}, [None for _ in handles]
    registered = [
        call("nvmlDeviceRegisterEvents", handle, nv.nvmlEventTypeXidCriticalError, event_set)
        for handle in handles
    ]
    began = time.monotonic()
    waited = call("nvmlEventSetWait_v2", event_set, wait_ms)
    answers = {
        "nvmlEventSetCreate": None,
        f"nvmlEventSetWait_v2({wait_ms})": waited,
        "waited_s": round(time.monotonic() - began, 3),
    }
    call("nvmlEventSetFree", event_set)
    return answers, registered


def host_facts() -> dict[str, Any]:
    def read(path: str) -> str | None:
        try:
            return Path(path).read_text()
        except OSError:
            return None

    infiniband = {}
    root = Path("/sys/class/infiniband")
    if root.exists():
        for port in sorted(root.glob("*/ports/*")):
            infiniband[str(port.relative_to(root))] = {
                name: read(str(port / name)) for name in ("state", "phys_state", "rate", "link_layer")
            }
    return {
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpuinfo_model": next(
            (
                line.split(":", 1)[1].strip()
                for line in (read("/proc/cpuinfo") or "").splitlines()
                if line.startswith("model name")
            ),
            None,
        ),
        "cpu_count": os.cpu_count(),
        "numa_nodes": sorted(p.name for p in Path("/sys/devices/system/node").glob("node[0-9]*")),
        "meminfo_head": (read("/proc/meminfo") or "").splitlines()[:3],
        "mounts": read("/proc/mounts"),
        "infiniband": infiniband,
        "kmsg_readable": os.access("/dev/kmsg", os.R_OK),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--gpm-interval", type=float, default=1.0, help="seconds between the two GPM samples")
    args = parser.parse_args()
    nv.nvmlInit()
    count = nv.nvmlDeviceGetCount()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    devices = [record_device(i, h, handles) for i, h in enumerate(handles)]
    for device, handle in zip(devices, handles, strict=True):
        device["gpm"] = record_gpm(handle, args.gpm_interval)
    xid_events, registered = record_xid_events(handles)
    for device, answer in zip(devices, registered, strict=True):
        device["nvmlDeviceRegisterEvents(xid_critical)"] = answer
    document = {
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "nvidia_ml_py": getattr(nv, "__version__", None),
        "system": {
            name: call(name)
            for name in (
                "nvmlSystemGetDriverVersion",
                "nvmlSystemGetNVMLVersion",
                "nvmlSystemGetCudaDriverVersion",
                "nvmlSystemGetCudaDriverVersion_v2",
            )
        },
        "device_count": count,
        "devices": devices,
        "xid_events": xid_events,
        "host": host_facts(),
    }
    nv.nvmlShutdown()
    for command in (["nvidia-smi", "topo", "-m"], ["nvidia-smi", "-q"]):
        try:  # kept as provenance for a person reading the test data, never parsed by gpuval
            document[" ".join(command)] = subprocess.run(
                command, capture_output=True, text=True, timeout=60
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            document[" ".join(command)] = f"unavailable: {exc}"
    with open(args.output, "w") as handle:
        json.dump(document, handle, indent=1, default=str)
    print(f"recorded {count} GPUs to {args.output}")


if __name__ == "__main__":
    main()

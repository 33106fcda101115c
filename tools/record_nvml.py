"""Record what NVML answers on a real GPU machine, so tests can replay it where no GPU exists.

Every query gpuval's discovery and health checks make is called for every GPU (and every NVLink, and
every GPU pair for topology); each answer is stored as JSON, an NVML error as {"error": NAME}. Host
facts the checks read from /proc and /sys ride along. Usage: record_nvml.py --output FILE.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import pynvml as nv


def plain(value: Any) -> Any:
    """ctypes structures, arrays and bytes as JSON values."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, ctypes.Structure):
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
]


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
    # gpuval monitor's own queries: PCIe throughput (KB/s over NVML's 20 ms window) and the NVLink
    # throughput fields 138/139 (cumulative KiB, scope UINT_MAX = every link), as recorded structures.
    for counter, label in ((nv.NVML_PCIE_UTIL_TX_BYTES, "tx"), (nv.NVML_PCIE_UTIL_RX_BYTES, "rx")):
        answers[f"nvmlDeviceGetPcieThroughput({label})"] = call(
            "nvmlDeviceGetPcieThroughput", handle, counter
        )
    answers["nvmlDeviceGetFieldValues(nvlink_throughput)"] = call(
        "nvmlDeviceGetFieldValues", handle, [(138, 0xFFFFFFFF), (139, 0xFFFFFFFF)]
    )
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
    args = parser.parse_args()
    nv.nvmlInit()
    count = nv.nvmlDeviceGetCount()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
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
        "devices": [record_device(i, h, handles) for i, h in enumerate(handles)],
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

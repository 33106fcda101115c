"""A pynvml stand-in that answers from a recording made on a real machine (tools/record_nvml.py).

NVML cannot exist without a GPU, so tests replay what NVML really answered on the lent machines; faulty
variants are the same recording with one answer changed. Errors are raised as pynvml's own exception
classes, named in the recording.
"""

from __future__ import annotations

import copy
import ctypes
import json
import queue
import threading
from pathlib import Path
from typing import Any

import pynvml

DATA = Path(__file__).parent / "data" / "nvml"

_ECC_TYPE = {
    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "uncorrected",
    pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: "corrected",
}
_ECC_COUNTER = {pynvml.NVML_VOLATILE_ECC: "volatile", pynvml.NVML_AGGREGATE_ECC: "aggregate"}
_RETIRE_CAUSE = {
    pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: "sbe",
    pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: "dbe",
}
_THRESHOLD = {
    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown",
    pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown",
    pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "gpu_max",
}
_CLOCK = {pynvml.NVML_CLOCK_SM: "sm", pynvml.NVML_CLOCK_MEM: "mem", pynvml.NVML_CLOCK_GRAPHICS: "graphics"}
_NVLINK_COUNTER = {
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "error_dl_replay",
    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "error_dl_recovery",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "error_dl_crc_flit",
}


def load(name: str) -> dict[str, Any]:
    """A recording by file stem, e.g. 'h200x2'; a deep copy, free to alter."""
    return copy.deepcopy(json.loads((DATA / f"{name}.json").read_text()))


def _answer(value: Any) -> Any:
    if isinstance(value, dict) and "error" in value:
        raise getattr(pynvml, value["error"], pynvml.NVMLError_Unknown)()
    return value


class ReplayNvml:
    """The pynvml functions gpuval calls, answered from `recording`; constants come from pynvml."""

    def __init__(self, recording: dict[str, Any], init_error: str | None = None) -> None:
        self.recording = recording
        self.init_error = init_error

    def __getattr__(self, name: str) -> Any:
        # constants, exception classes and the ctypes structures a caller fills in: pynvml's own
        if name.startswith(("NVML_", "NVMLError", "c_nvml", "nvmlEventType")):
            return getattr(pynvml, name)
        if name.startswith("nvmlDevice") and not name.startswith("nvmlDeviceGetHandle"):
            # a plain per-device query recorded under its own name
            def query(handle: int) -> Any:
                answers = self.recording["devices"][handle]
                if name not in answers:
                    raise pynvml.NVMLError_FunctionNotFound()
                return _answer(answers[name])

            return query
        raise AttributeError(name)

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        if self.init_error:
            raise getattr(pynvml, self.init_error)()

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlSystemGetDriverVersion(self) -> Any:  # noqa: N802
        return _answer(self.recording["system"]["nvmlSystemGetDriverVersion"])

    def nvmlSystemGetNVMLVersion(self) -> Any:  # noqa: N802
        return _answer(self.recording["system"]["nvmlSystemGetNVMLVersion"])

    def nvmlSystemGetCudaDriverVersion(self) -> Any:  # noqa: N802
        return _answer(self.recording["system"]["nvmlSystemGetCudaDriverVersion"])

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return self.recording["device_count"]

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if index >= len(self.recording["devices"]):
            raise pynvml.NVMLError_GpuIsLost()
        return index

    def _device(self, handle: int) -> dict[str, Any]:
        return self.recording["devices"][handle]

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter: int) -> Any:  # noqa: N802
        key = f"nvmlDeviceGetTotalEccErrors({_ECC_TYPE[error_type]},{_ECC_COUNTER[counter]})"
        return _answer(self._device(handle)[key])

    def nvmlDeviceGetRetiredPages(self, handle: int, cause: int) -> Any:  # noqa: N802
        return _answer(self._device(handle)[f"nvmlDeviceGetRetiredPages({_RETIRE_CAUSE[cause]})"])

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> Any:  # noqa: N802
        return _answer(self._device(handle)["nvmlDeviceGetTemperature(gpu)"])

    def nvmlDeviceGetTemperatureThreshold(self, handle: int, threshold: int) -> Any:  # noqa: N802
        return _answer(self._device(handle)[f"nvmlDeviceGetTemperatureThreshold({_THRESHOLD[threshold]})"])

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> Any:  # noqa: N802
        return _answer(self._device(handle)[f"nvmlDeviceGetClockInfo({_CLOCK[clock]})"])

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock: int) -> Any:  # noqa: N802
        return _answer(self._device(handle)[f"nvmlDeviceGetMaxClockInfo({_CLOCK[clock]})"])

    def _link(self, handle: int, link: int) -> dict[str, Any]:
        links = self._device(handle)["nvlinks"]
        if link >= len(links):
            raise pynvml.NVMLError_InvalidArgument()
        return links[link]

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> Any:  # noqa: N802
        return _answer(self._link(handle, link)["state"])

    def nvmlDeviceGetNvLinkVersion(self, handle: int, link: int) -> Any:  # noqa: N802
        return _answer(self._link(handle, link)["version"])

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> Any:  # noqa: N802
        return _answer(self._link(handle, link)["remote_pci"])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> Any:  # noqa: N802
        return _answer(self._link(handle, link)["remote_device_type"])

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> Any:  # noqa: N802
        return _answer(self._link(handle, link)[_NVLINK_COUNTER[counter]])

    def nvmlDeviceGetTopologyCommonAncestor(self, handle: int, other: int) -> Any:  # noqa: N802
        return _answer(self._device(handle)["topology"][str(other)])

    def nvmlDeviceGetP2PStatus(self, handle: int, other: int, caps: int) -> Any:  # noqa: N802
        return _answer(self._device(handle)["p2p_status_nvlink"][str(other)])

    def nvmlDeviceGetCpuAffinity(self, handle: int, size: int) -> Any:  # noqa: N802
        return _answer(self._device(handle)["nvmlDeviceGetCpuAffinity(64)"])


# --- the monitor's own queries (tools/record_nvml.py: record_monitor, record_xid_events) --------------------

SYNTHETIC = "synthetic-exporter"  # hand-made answers for the calls no recording holds yet: see its _source


def with_exporter_answers(recording: dict[str, Any]) -> dict[str, Any]:
    """`recording` with the synthetic exporter answers added to every device where it holds none of its
    own (a recording that has them keeps them), and the synthetic event-API answers likewise."""
    synthetic = load(SYNTHETIC)
    for device in recording["devices"]:
        for key, answer in synthetic["device"].items():
            device.setdefault(key, copy.deepcopy(answer))
    recording.setdefault("xid_events", synthetic["xid_events"])
    return recording


class ExporterReplay(ReplayNvml):
    """The recording plus the queries only `gpuval monitor` makes, answered as record_nvml.py records them:
    PCIe throughput, field values (NVLink throughput, memory temperature), GPM over two samples, and the
    XID event API. Field values and GPM results come back in pynvml's real ctypes structures.

    Events are those a test injects (`inject`), delivered by a wait that blocks up to its timeout as
    NVML's does; with none the wait times out, as the recorded wait on a healthy GPU did. `log` lists the
    event-set calls in order ("wait", "waited", "free"), `gpm_samples` the GPM samples not yet freed."""

    def __init__(self, recording: dict[str, Any]) -> None:
        super().__init__(recording)
        self.events: queue.Queue[tuple[int, int]] = queue.Queue()
        self.log: list[str] = []
        self._log_lock = threading.Lock()
        self._tokens: dict[int, ctypes.c_uint64] = {}  # GPM sample token -> its buffer, kept alive
        self._sampled: dict[int, int] = {}  # GPM sample token -> the device it was taken on
        self.gpm_samples: set[int] = set()

    def inject(self, device: int, xid: int) -> None:
        self.events.put((device, xid))

    def _note(self, what: str) -> None:
        with self._log_lock:
            self.log.append(what)

    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int) -> Any:  # noqa: N802 - pynvml's names
        label = {pynvml.NVML_PCIE_UTIL_TX_BYTES: "tx", pynvml.NVML_PCIE_UTIL_RX_BYTES: "rx"}[counter]
        return self._recorded(handle, f"nvmlDeviceGetPcieThroughput({label})")

    def nvmlDeviceGetFieldValues(self, handle: int, ids: list[tuple[int, int]]) -> Any:  # noqa: N802
        (key,) = {_FIELD_RECORDINGS.get(field_id) for field_id, _ in ids}  # one recorded call asked for all
        answer = self._recorded(handle, key) if key else []
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for value, (field_id, scope) in zip(values, ids, strict=True):
            value.fieldId, value.scopeId = field_id, scope
            entry = next((e for e in answer if (e["fieldId"], e["scopeId"]) == (field_id, scope)), None)
            if entry is None:  # a field the recording did not ask for: what a GPU without it answers
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            value.nvmlReturn, value.valueType = entry["nvmlReturn"], entry["valueType"]
            member = _VALUE_MEMBERS.get(entry["valueType"])
            if member in entry["value"]:
                setattr(value.value, member, entry["value"][member])
        return values

    def nvmlGpmQueryDeviceSupport(self, handle: int) -> Any:  # noqa: N802
        return self._recorded(handle, "nvmlGpmQueryDeviceSupport")

    def nvmlGpmSampleAlloc(self) -> Any:  # noqa: N802
        token = len(self._tokens) + 1
        self._tokens[token] = ctypes.c_uint64(token)
        self.gpm_samples.add(token)
        return ctypes.cast(ctypes.pointer(self._tokens[token]), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleGet(self, handle: int, sample: Any) -> Any:  # noqa: N802
        for answer in self._gpm(handle).get("nvmlGpmSampleGet", []):
            _answer(answer)  # a sample that failed when recorded fails here
        self._sampled[_token(sample)] = handle
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:  # noqa: N802
        first, second = _token(request.sample1), _token(request.sample2)
        handle = self._sampled[second]
        assert self._sampled[first] == handle, "both samples of a pair come from one GPU"
        recorded = _answer(self._gpm(handle)["nvmlGpmMetricsGet"])
        by_id = {metric["metricId"]: metric for metric in recorded["metrics"]}
        for position in range(request.numMetrics):
            slot = request.metrics[position]
            metric = by_id.get(slot.metricId)
            slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED if metric is None else metric["nvmlReturn"]
            slot.value = 0.0 if metric is None else metric["value"]
        return request

    def nvmlGpmSampleFree(self, sample: Any) -> None:  # noqa: N802
        self.gpm_samples.remove(_token(sample))  # a double free fails the test

    def nvmlEventSetCreate(self) -> str:  # noqa: N802
        _answer(
            self.recording.get("xid_events", {}).get(
                "nvmlEventSetCreate", {"error": "NVMLError_FunctionNotFound"}
            )
        )
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, event_set: str) -> None:  # noqa: N802
        assert types == pynvml.nvmlEventTypeXidCriticalError and event_set == "event-set"
        return self._recorded(handle, "nvmlDeviceRegisterEvents(xid_critical)")

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:  # noqa: N802
        self._note("wait")
        try:
            device, xid = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError_Timeout() from None
        finally:
            self._note("waited")
        data = pynvml.c_nvmlEventData_t()
        data.eventType, data.eventData = pynvml.nvmlEventTypeXidCriticalError, xid
        return _Event(device, data)

    def nvmlEventSetFree(self, event_set: str) -> None:  # noqa: N802
        self._note("free")

    def _recorded(self, handle: int, key: str) -> Any:
        answers = self._device(handle)
        if key not in answers:
            raise pynvml.NVMLError_FunctionNotFound()
        return _answer(answers[key])

    def _gpm(self, handle: int) -> dict[str, Any]:
        return self._recorded(handle, "gpm")


# field id -> the recording's key for the call that asked for it (record_nvml.record_monitor)
_FIELD_RECORDINGS = {
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "nvmlDeviceGetFieldValues(nvlink_throughput)",
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "nvmlDeviceGetFieldValues(nvlink_throughput)",
    pynvml.NVML_FI_DEV_MEMORY_TEMP: "nvmlDeviceGetFieldValues(memory_temp)",
}
# nvmlValueType_t -> the member of the nvmlValue_t union that holds the value (nvml.h)
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _token(sample: Any) -> int:
    return ctypes.cast(sample, ctypes.POINTER(ctypes.c_uint64)).contents.value


class _Event:
    """nvmlEventData_t as the watcher reads it: the replay's handle (an index) as the device."""

    def __init__(self, device: int, data: Any) -> None:
        self.device, self.eventType, self.eventData = device, data.eventType, data.eventData

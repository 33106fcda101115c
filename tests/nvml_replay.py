"""A pynvml stand-in that answers from a recording made on a real machine (tools/record_nvml.py).

NVML cannot exist without a GPU, so tests replay what NVML really answered on the lent machines; faulty
variants are the same recording with one answer changed. Errors are raised as pynvml's own exception
classes, named in the recording.
"""

from __future__ import annotations

import copy
import json
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
        if name.startswith("NVML_") or name.startswith("NVMLError"):
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

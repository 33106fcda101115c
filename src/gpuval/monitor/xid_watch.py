"""The last critical XID of each GPU, as DCGM's DCGM_FI_DEV_XID_ERRORS holds it, from NVML's event API.

One daemon thread waits on an event set registered for `nvmlEventTypeXidCriticalError` on every GPU. Each
wait ends after `wait_s` at the latest (nvmlEventSetWait_v2's timeout), so `stop()` returns within about one
wait, and the event set is freed only once the thread has left its last wait. A wait that ends early with
no event (an NVML error, a library that does not block) is followed by the rest of its interval on the stop
flag, so the loop never spins.

Values: a registered GPU reads 0 until its first XID, then the XID's number until a later one replaces it,
as DCGM's field does (NVIDIA/DCGM issue 277: it does not go back to 0). A GPU that refuses registration
(NotSupported) has no value, with the reason, and the exporter leaves it out.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

from gpuval.nvml import Nvml, Unavailable, available, field_value

WAIT_S = 0.5  # longest single wait: how long stop() may take
JOIN_MARGIN_S = 1.0  # beyond one wait, before stop() gives up on a thread stuck inside NVML


def _same_device(a: Any, b: Any) -> bool:
    """Whether two NVML device handles are the same GPU: pynvml's handles are ctypes pointers, which
    compare by object, so their addresses are compared; a replay's handles compare as they are."""
    if isinstance(a, ctypes._Pointer) and isinstance(b, ctypes._Pointer):
        return ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value
    return a is b or a == b


class XidWatch:
    """Starts watching at construction when any GPU accepts registration; `last_xid(index)` at any time."""

    def __init__(self, nvml: Nvml, handles: list[Any], wait_s: float = WAIT_S) -> None:
        self.nvml = nvml
        self.wait_s = wait_s
        self.wait_error: str | None = None  # the last wait that failed other than by timing out
        self._handles: dict[int, Any] = {}  # GPU index -> handle, for the GPUs registered
        self._last: dict[int, int] = {}  # GPU index -> last XID, 0 before the first
        self._refused: dict[int, str] = {}  # GPU index -> why it is not watched
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set = nvml("nvmlEventSetCreate")
        if not available(self._event_set):
            self._refused = {
                index: f"nvmlEventSetCreate: {self._event_set.reason}" for index in range(len(handles))
            }
            return
        xid_critical = nvml.constant("nvmlEventTypeXidCriticalError", 0x8)
        for index, handle in enumerate(handles):
            done = (
                nvml("nvmlDeviceRegisterEvents", handle, xid_critical, self._event_set)
                if available(handle)
                else handle
            )
            if available(done):
                self._handles[index], self._last[index] = handle, 0
            else:
                self._refused[index] = f"XID event registration: {done.reason}"
        if not self._handles:
            self._free()
            return
        self._thread = threading.Thread(target=self._run, name="gpuval-xid-events", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def last_xid(self, index: int) -> int | Unavailable:
        with self._lock:
            if index in self._last:
                return self._last[index]
        return Unavailable(self._refused.get(index, "not registered for XID events"))

    def stop(self) -> bool:
        """End the thread (within one wait) and free the event set; False when the thread is still inside
        NVML after a wait and the margin, and the set is left allocated rather than freed under it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.wait_s + JOIN_MARGIN_S)
            if self._thread.is_alive():
                return False
            self._thread = None
        self._free()
        return True

    def _free(self) -> None:
        if available(self._event_set):
            self.nvml("nvmlEventSetFree", self._event_set)  # its answer changes nothing
            self._event_set = Unavailable("freed")

    def _run(self) -> None:
        timeout_ms = max(1, int(self.wait_s * 1000))
        while not self._stop.is_set():
            began = time.monotonic()
            data = self.nvml("nvmlEventSetWait_v2", self._event_set, timeout_ms)
            if available(data):
                self._record(data)
                continue
            if data.error != "NVMLError_Timeout":
                self.wait_error = data.reason
            self._stop.wait(max(0.0, self.wait_s - (time.monotonic() - began)))

    def _record(self, data: Any) -> None:
        device, xid = field_value(data, "device"), field_value(data, "eventData")
        index = self.nvml("nvmlDeviceGetIndex", device)
        if not isinstance(index, int):  # a GPU that fell off the bus (XID 79) may not say its index
            index = next((i for i, handle in self._handles.items() if _same_device(handle, device)), None)
        if index in self._handles and isinstance(xid, int):
            with self._lock:
                self._last[index] = xid

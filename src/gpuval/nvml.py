"""The one thin layer over NVML (nvidia-ml-py). Queries never raise.

A query that fails (no driver, a field the GPU does not support, a GPU that fell off the bus) yields an
`Unavailable` sentinel carrying the reason, after nvitop: one broken field never kills a run, and every
consumer can still say why a value is missing. Units live in field names.

The fields that `gpuval monitor` reads too come from `gpu_fields`: one read and one name per quantity
(power is `power_usage_w` wherever gpuval reports it). The XID event wait (health/xid.py) and the GPU
name lookup (discover/gpus.py) go through `Nvml` as well: no other module calls pynvml.

`library` is the `pynvml` module by default; tests pass an object with the same functions that replays
answers recorded on real machines (tests/data/nvml/).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

# NVML_TOPOLOGY_* common-ancestor levels as `nvidia-smi topo -m` names them.
TOPOLOGY_LABELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

# Clock event ("throttle") reason bits, nvml.h nvmlClocksEventReason*.
CLOCK_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

NVLINK_REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch", 255: "unknown"}
REMAPPED_ROW_FIELDS = (
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapping_pending",
    "remapping_failed",
)


class Unavailable:
    """A value NVML could not give; falsy, printed as N/A, with the reason kept. `error`: the class name of
    the NVML exception behind it (`NVMLError_Timeout`, ...), where there was one."""

    __slots__ = ("error", "reason")

    def __init__(self, reason: str, error: str | None = None) -> None:
        self.reason = reason
        self.error = error

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"N/A ({self.reason})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unavailable) and other.reason == self.reason

    def __hash__(self) -> int:
        return hash(self.reason)


def available(value: Any) -> bool:
    return not isinstance(value, Unavailable)


def reason_of(exc: BaseException) -> str:
    name = type(exc).__name__
    text = str(exc).strip()
    return f"{name}: {text}" if text and text not in name else name


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def clock_reason_names(mask: Any) -> list[str]:
    """Names of the active clock event reasons; a bit nvml.h did not name when written shows in hex."""
    if not isinstance(mask, int):
        return []
    names = [label for bit, label in CLOCK_REASONS.items() if mask & bit]
    unnamed = mask & ~sum(CLOCK_REASONS)
    return [*names, f"{unnamed:#x}"] if unnamed else names


class GpuRecord:
    """What the snapshot's GpuInfo and the monitor's GpuReading share: the fields read by `gpu_fields`,
    under the same names, and one JSON form (Unavailable becomes null, its reason goes to 'unavailable')."""

    clock_event_reasons: Any

    def clock_reasons(self) -> list[str]:
        return clock_reason_names(self.clock_event_reasons)

    def _plain(self, name: str, value: Any) -> Any:
        return value

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        missing: dict[str, str] = {}
        for item in fields(self):  # every subclass is a dataclass
            value = getattr(self, item.name)
            if isinstance(value, Unavailable):
                out[item.name] = None
                missing[item.name] = value.reason
            else:
                out[item.name] = self._plain(item.name, value)
        out["clock_reasons"] = self.clock_reasons()
        out["unavailable"] = missing
        return out


@dataclass
class NvLink:
    index: int
    up: bool
    version: Any = None
    remote: Any = None  # "switch", "gpu", ... or Unavailable
    remote_pci_bus_id: Any = None
    replay_errors: Any = None
    recovery_errors: Any = None
    crc_flit_errors: Any = None


@dataclass
class GpuInfo(GpuRecord):
    index: int
    name: Any = None
    uuid: Any = None
    serial: Any = None
    pci_bus_id: Any = None
    vbios_version: Any = None
    memory_total_bytes: Any = None
    memory_used_bytes: Any = None
    memory_free_bytes: Any = None
    compute_capability: Any = None
    mig_mode_current: Any = None
    mig_devices: Any = None  # UUIDs of its MIG instances ('MIG-…') where MIG mode is on
    persistence_mode: Any = None
    ecc_mode_current: Any = None
    ecc_mode_pending: Any = None
    ecc_uncorrected_volatile: Any = None
    ecc_uncorrected_aggregate: Any = None
    ecc_corrected_volatile: Any = None
    ecc_corrected_aggregate: Any = None
    remapped_rows_correctable: Any = None
    remapped_rows_uncorrectable: Any = None
    remapping_pending: Any = None
    remapping_failed: Any = None
    retired_pages_sbe: Any = None
    retired_pages_dbe: Any = None
    retired_pages_pending: Any = None
    power_limit_w: Any = None
    power_default_limit_w: Any = None
    power_usage_w: Any = None
    sm_clock_mhz: Any = None
    max_sm_clock_mhz: Any = None
    mem_clock_mhz: Any = None
    max_mem_clock_mhz: Any = None
    temperature_c: Any = None
    temperature_slowdown_c: Any = None
    temperature_shutdown_c: Any = None
    clock_event_reasons: Any = None  # bit mask, CLOCK_REASONS
    pcie_gen_current: Any = None
    pcie_gen_max: Any = None
    pcie_width_current: Any = None
    pcie_width_max: Any = None
    pcie_replay_count: Any = None
    numa_node: Any = None
    compute_processes: Any = None  # list of {"pid", "used_memory_bytes"}
    nvlinks: list[NvLink] = field(default_factory=list)
    # other GPU index -> nvidia-smi topo label: "NV18", "PIX", "PHB", "SYS", ...
    topology: dict[int, str] = field(default_factory=dict)

    def _plain(self, name: str, value: Any) -> Any:
        if name == "nvlinks":
            return [
                {k: (None if isinstance(v, Unavailable) else v) for k, v in vars(link).items()}
                for link in value
            ]
        if name == "topology":
            return {str(k): v for k, v in value.items()}
        return value


@dataclass
class NvmlSnapshot:
    """Every GPU of this node as NVML sees it, or why NVML could not be read at all."""

    error: str | None = None  # set when NVML itself is missing (no driver): then gpus is empty
    driver_version: Any = None
    cuda_driver_version: Any = None  # e.g. "13.0"
    nvml_version: Any = None
    gpus: list[GpuInfo] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        def plain(value: Any) -> Any:
            return None if isinstance(value, Unavailable) else value

        return {
            "error": self.error,
            "driver_version": plain(self.driver_version),
            "cuda_driver_version": plain(self.cuda_driver_version),
            "nvml_version": plain(self.nvml_version),
            "gpus": [gpu.to_json() for gpu in self.gpus],
        }


class Nvml:
    """Calls into NVML that return a value or Unavailable, never an exception."""

    def __init__(self, library: Any = None) -> None:
        self.error: str | None = None
        if library is None:
            try:
                import pynvml as library
            except ImportError as exc:  # nvidia-ml-py is a dependency; a broken install says so
                self.lib = None
                self.error = f"nvidia-ml-py is not importable: {exc}"
                return
        self.lib = library
        try:
            library.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.error = reason_of(exc)

    def __call__(self, function: str, *args: Any) -> Any:
        if self.error is not None:
            return Unavailable(self.error)
        method = getattr(self.lib, function, None)
        if method is None:
            return Unavailable(f"{function} is not in this nvidia-ml-py")
        try:
            return _text(method(*args))
        except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported, GpuIsLost, ...
            return Unavailable(reason_of(exc), type(exc).__name__)

    def handles(self) -> list[Any] | Unavailable:
        """A handle per GPU index (Unavailable, with why, for a GPU NVML cannot reach), or Unavailable when
        NVML cannot count the GPUs (no driver included)."""
        count = self("nvmlDeviceGetCount")
        if not available(count):
            return count
        return [self("nvmlDeviceGetHandleByIndex", index) for index in range(count)]

    def constant(self, name: str, default: int) -> int:
        return getattr(self.lib, name, default) if self.lib is not None else default

    def error_of(self, code: int) -> Unavailable:
        """Unavailable for an NVML return code that came inside a structure (a field value, a GPM metric)
        rather than as an exception, named as pynvml names the exception for that code."""
        error_class = getattr(self.lib, "NVMLError", None)
        if error_class is None:
            return Unavailable(f"nvmlReturn {code}")
        exc = error_class(code)  # pynvml's NVMLError(code) is the subclass for that code
        return Unavailable(reason_of(exc), type(exc).__name__)

    def new(self, structure: str) -> Any:
        """A zeroed instance of one of the library's ctypes structures (`c_nvmlGpmMetricsGet_t`, ...), to be
        filled in and passed to a call; Unavailable where this nvidia-ml-py has no such structure."""
        kind = getattr(self.lib, structure, None) if self.error is None else None
        if kind is None:
            return Unavailable(self.error or f"{structure} is not in this nvidia-ml-py")
        return kind()

    def shutdown(self) -> None:
        if self.error is None and self.lib is not None:
            try:
                self.lib.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down a broken library changes nothing
                pass


def first_available(*values: Any) -> Any:
    for value in values:
        if available(value):
            return value
    return values[-1]


def gpu_fields(nvml: Nvml, handle: Any) -> dict[str, Any]:
    """The fields both the snapshot (GpuInfo) and the monitor (GpuReading) read, each a value or
    Unavailable, by the names both use: one read and one name per quantity."""
    c = nvml.constant
    memory = nvml("nvmlDeviceGetMemoryInfo", handle)
    return {
        "name": nvml("nvmlDeviceGetName", handle),
        "uuid": nvml("nvmlDeviceGetUUID", handle),
        "pci_bus_id": field_value(nvml("nvmlDeviceGetPciInfo", handle), "busId"),
        "memory_total_bytes": field_value(memory, "total"),
        "memory_used_bytes": field_value(memory, "used"),
        "memory_free_bytes": field_value(memory, "free"),
        "temperature_c": nvml("nvmlDeviceGetTemperature", handle, c("NVML_TEMPERATURE_GPU", 0)),
        "power_usage_w": scaled(nvml("nvmlDeviceGetPowerUsage", handle), 1e-3),  # NVML: milliwatts
        "power_limit_w": scaled(nvml("nvmlDeviceGetEnforcedPowerLimit", handle), 1e-3),
        "sm_clock_mhz": nvml("nvmlDeviceGetClockInfo", handle, c("NVML_CLOCK_SM", 1)),
        "mem_clock_mhz": nvml("nvmlDeviceGetClockInfo", handle, c("NVML_CLOCK_MEM", 2)),
        "clock_event_reasons": first_available(
            nvml("nvmlDeviceGetCurrentClocksEventReasons", handle),
            nvml("nvmlDeviceGetCurrentClocksThrottleReasons", handle),
        ),
        "pcie_replay_count": nvml("nvmlDeviceGetPcieReplayCounter", handle),
        **_remapped_rows(nvml, handle),
    }


def _remapped_rows(nvml: Nvml, handle: Any) -> dict[str, Any]:
    """nvmlDeviceGetRemappedRows: rows remapped for correctable and uncorrectable errors, and whether a
    remapping waits for a reset (pending) or found no spare row (failed); Unavailable before Ampere."""
    rows = nvml("nvmlDeviceGetRemappedRows", handle)  # (correctable, uncorrectable, pending, failure)
    if not available(rows):
        return dict.fromkeys(REMAPPED_ROW_FIELDS, rows)
    return dict(zip(REMAPPED_ROW_FIELDS, (rows[0], rows[1], bool(rows[2]), bool(rows[3])), strict=True))


def _mig_uuids(nvml: Nvml, handle: Any) -> Any:
    """The UUIDs of the MIG instances on a GPU in MIG mode (a slot with no instance is left out)."""
    slots = nvml("nvmlDeviceGetMaxMigDeviceCount", handle)
    if not available(slots):
        return slots
    instances = [nvml("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot) for slot in range(slots)]
    uuids = [nvml("nvmlDeviceGetUUID", instance) for instance in instances if available(instance)]
    return [str(uuid) for uuid in uuids if available(uuid)]


def _gpu(nvml: Nvml, index: int, handle: Any) -> GpuInfo:
    c = nvml.constant
    gpu = GpuInfo(index=index, **gpu_fields(nvml, handle))
    gpu.serial = nvml("nvmlDeviceGetSerial", handle)
    gpu.vbios_version = nvml("nvmlDeviceGetVbiosVersion", handle)
    capability = nvml("nvmlDeviceGetCudaComputeCapability", handle)
    gpu.compute_capability = f"{capability[0]}.{capability[1]}" if available(capability) else capability
    mig = nvml("nvmlDeviceGetMigMode", handle)
    gpu.mig_mode_current = mig[0] if available(mig) else mig
    if gpu.mig_mode_current == 1:
        gpu.mig_devices = _mig_uuids(nvml, handle)
    gpu.persistence_mode = nvml("nvmlDeviceGetPersistenceMode", handle)
    ecc = nvml("nvmlDeviceGetEccMode", handle)
    gpu.ecc_mode_current, gpu.ecc_mode_pending = (ecc[0], ecc[1]) if available(ecc) else (ecc, ecc)
    uncorrected, corrected = (
        c("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
        c("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0),
    )
    volatile, aggregate = c("NVML_VOLATILE_ECC", 0), c("NVML_AGGREGATE_ECC", 1)
    gpu.ecc_uncorrected_volatile = nvml("nvmlDeviceGetTotalEccErrors", handle, uncorrected, volatile)
    gpu.ecc_uncorrected_aggregate = nvml("nvmlDeviceGetTotalEccErrors", handle, uncorrected, aggregate)
    gpu.ecc_corrected_volatile = nvml("nvmlDeviceGetTotalEccErrors", handle, corrected, volatile)
    gpu.ecc_corrected_aggregate = nvml("nvmlDeviceGetTotalEccErrors", handle, corrected, aggregate)
    for attribute, cause in (
        ("retired_pages_sbe", c("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0)),
        ("retired_pages_dbe", c("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1)),
    ):
        pages = nvml("nvmlDeviceGetRetiredPages", handle, cause)
        setattr(gpu, attribute, len(pages) if available(pages) else pages)
    pending = nvml("nvmlDeviceGetRetiredPagesPendingStatus", handle)
    gpu.retired_pages_pending = bool(pending) if available(pending) else pending
    gpu.power_default_limit_w = scaled(nvml("nvmlDeviceGetPowerManagementDefaultLimit", handle), 1e-3)
    sm, mem = c("NVML_CLOCK_SM", 1), c("NVML_CLOCK_MEM", 2)
    gpu.max_sm_clock_mhz = nvml("nvmlDeviceGetMaxClockInfo", handle, sm)
    gpu.max_mem_clock_mhz = nvml("nvmlDeviceGetMaxClockInfo", handle, mem)
    gpu.temperature_slowdown_c = nvml(
        "nvmlDeviceGetTemperatureThreshold", handle, c("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1)
    )
    gpu.temperature_shutdown_c = nvml(
        "nvmlDeviceGetTemperatureThreshold", handle, c("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", 0)
    )
    gpu.pcie_gen_current = nvml("nvmlDeviceGetCurrPcieLinkGeneration", handle)
    # The link's maximum (GPU and slot together): a Gen5 GPU in a Gen4 slot is not a degraded link.
    gpu.pcie_gen_max = first_available(
        nvml("nvmlDeviceGetMaxPcieLinkGeneration", handle),
        nvml("nvmlDeviceGetGpuMaxPcieLinkGeneration", handle),
    )
    gpu.pcie_width_current = nvml("nvmlDeviceGetCurrPcieLinkWidth", handle)
    gpu.pcie_width_max = nvml("nvmlDeviceGetMaxPcieLinkWidth", handle)
    gpu.numa_node = nvml("nvmlDeviceGetNumaNodeId", handle)
    gpu.compute_processes = compute_processes_of(nvml, handle)
    gpu.nvlinks = _nvlinks(nvml, handle)
    return gpu


def compute_processes_of(nvml: Nvml, handle: Any) -> Any:
    """[{"pid", "used_memory_bytes"}] of every compute process on the GPU, or Unavailable."""
    processes = nvml("nvmlDeviceGetComputeRunningProcesses", handle)
    if not available(processes):
        return processes
    return [
        {"pid": field_value(p, "pid"), "used_memory_bytes": field_value(p, "usedGpuMemory")}
        for p in processes
    ]


def _nvlinks(nvml: Nvml, handle: Any) -> list[NvLink]:
    c = nvml.constant
    links = []
    for index in range(c("NVML_NVLINK_MAX_LINKS", 18)):
        state = nvml("nvmlDeviceGetNvLinkState", handle, index)
        if not available(state):
            continue  # this GPU has no link with that index (or no NVLink at all)
        remote_pci = nvml("nvmlDeviceGetNvLinkRemotePciInfo", handle, index)
        remote_type = nvml("nvmlDeviceGetNvLinkRemoteDeviceType", handle, index)
        links.append(
            NvLink(
                index=index,
                up=bool(state),
                version=nvml("nvmlDeviceGetNvLinkVersion", handle, index),
                remote=NVLINK_REMOTE_TYPES.get(remote_type, str(remote_type))
                if available(remote_type)
                else remote_type,
                remote_pci_bus_id=field_value(remote_pci, "busId"),
                replay_errors=nvml(
                    "nvmlDeviceGetNvLinkErrorCounter", handle, index, c("NVML_NVLINK_ERROR_DL_REPLAY", 0)
                ),
                recovery_errors=nvml(
                    "nvmlDeviceGetNvLinkErrorCounter", handle, index, c("NVML_NVLINK_ERROR_DL_RECOVERY", 1)
                ),
                crc_flit_errors=nvml(
                    "nvmlDeviceGetNvLinkErrorCounter", handle, index, c("NVML_NVLINK_ERROR_DL_CRC_FLIT", 2)
                ),
            )
        )
    return links


def field_value(value: Any, name: str) -> Any:
    if not available(value):
        return value
    if isinstance(value, dict):
        return _text(value.get(name))
    return _text(getattr(value, name, None))


def scaled(value: Any, factor: float) -> Any:
    return value * factor if isinstance(value, (int, float)) else value


def _topology(nvml: Nvml, gpus: list[GpuInfo], handles: list[Any]) -> None:
    """GPU pairs as `nvidia-smi topo -m` labels them: NV<links> where NVLink connects them, else the
    PCIe level of their closest common ancestor."""
    nvlink_caps = nvml.constant("NVML_P2P_CAPS_INDEX_NVLINK", 2)
    for gpu, handle in zip(gpus, handles, strict=True):
        for other, other_handle in zip(gpus, handles, strict=True):
            if other.index == gpu.index:
                continue
            active = [link for link in gpu.nvlinks if link.up]
            direct = [
                link
                for link in active
                if link.remote_pci_bus_id
                and str(link.remote_pci_bus_id).lower() == str(other.pci_bus_id).lower()
            ]
            status = nvml("nvmlDeviceGetP2PStatus", handle, other_handle, nvlink_caps)
            if direct:
                gpu.topology[other.index] = f"NV{len(direct)}"
            elif status == 0 and any(link.remote == "switch" for link in active):
                # Through NVSwitch every active link reaches every GPU: nvidia-smi shows the whole bond.
                gpu.topology[other.index] = f"NV{sum(1 for link in active if link.remote == 'switch')}"
            else:
                level = nvml("nvmlDeviceGetTopologyCommonAncestor", handle, other_handle)
                gpu.topology[other.index] = TOPOLOGY_LABELS.get(level, "N/A") if available(level) else "N/A"


def snapshot(library: Any = None) -> NvmlSnapshot:
    """Read every GPU of this node. Without a driver the snapshot carries the reason and no GPUs."""
    nvml = Nvml(library)
    if nvml.error is not None:
        return NvmlSnapshot(error=nvml.error)
    try:
        result = NvmlSnapshot(
            driver_version=nvml("nvmlSystemGetDriverVersion"),
            nvml_version=nvml("nvmlSystemGetNVMLVersion"),
        )
        cuda = nvml("nvmlSystemGetCudaDriverVersion")
        result.cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else cuda
        handles = nvml.handles()
        if not available(handles):
            result.error = f"cannot count GPUs: {handles.reason}"
            return result
        reachable: list[tuple[GpuInfo, Any]] = []  # GPUs that answered, each with its handle
        for index, handle in enumerate(handles):
            if not available(handle):
                result.gpus.append(GpuInfo(index=index, name=handle))  # a lost GPU still shows, with why
                continue
            gpu = _gpu(nvml, index, handle)
            result.gpus.append(gpu)
            if available(gpu.name):
                reachable.append((gpu, handle))
        _topology(nvml, [gpu for gpu, _ in reachable], [handle for _, handle in reachable])
        return result
    finally:
        nvml.shutdown()

"""`gpuval health` against NVML answers recorded on real machines (2xH200, 1xH100), and hand-made faulty
variants.

Each fault is the healthy recording with one answer changed, as NVML would give it on a broken node; it
must produce the right FAIL (or WARN), on the right scope, with a hint of what to do. Kernel logs and
InfiniBand sysfs trees are fake files under tests/data/.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pynvml
import pytest
from nvml_replay import ReplayNvml, load

from gpuval.config import load_profile
from gpuval.discover.pci import nvidia_gpus
from gpuval.errors import UsageError
from gpuval.health import pcie, smoke, xid
from gpuval.health import sdc as health_sdc
from gpuval.health._common import bus_key
from gpuval.health.cuda import CudaDevice, CudaView, read_view
from gpuval.health.run import health_result, node_health
from gpuval.nvml import snapshot
from gpuval.results import Status, json_schema, verdict

DATA = Path(__file__).parent / "data"
NODE = "n1"

# torch's words when no CUDA driver library loads (c10/cuda): a CUDA build of torch on a machine without
# the driver says this, as it does on a GPU node whose driver is gone.
NO_DRIVER = (
    "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a "
    "driver from http://www.nvidia.com/Download/index.aspx"
)


@dataclass(frozen=True)
class NoCudaHere:
    """How gpuval says that CUDA cannot run in this test process."""

    smoke: str  # smoke.matmul's SKIP
    rank: str  # the reason in a CPU rank's refusal, "CUDA can use no GPU here (...)"


def no_cuda_here() -> NoCudaHere:
    """By the torch build that runs the tests: a CPU build (CI's) is built without CUDA; a CUDA build (the
    device image's torch 2.11 on a machine with no GPU) finds no driver and says so in CUDA's words, as on a
    GPU node whose driver is gone. A CUDA build beside a driver is a machine these tests do not describe
    (CUDA could run): the test is skipped, saying so."""
    import ctypes

    import torch

    if torch.version.cuda is None:
        return NoCudaHere(
            smoke=f"this torch ({torch.__version__}) is built without CUDA: see cuda.visible",
            rank=f"torch {torch.__version__} is built without CUDA",
        )
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return NoCudaHere(
            smoke=f"CUDA cannot use the GPUs NVML lists ({NO_DRIVER}): see cuda.visible", rank=NO_DRIVER
        )
    pytest.skip(f"torch {torch.__version__} is a CUDA build and this machine has a CUDA driver (libcuda)")


@pytest.fixture
def h200():
    return load("h200x2")


@dataclass
class Machine:
    """A recorded machine judged by its built-in profile; `nvml`: a fresh copy of its answers to break."""

    nvml: dict
    profile: str
    nvlink: Status  # what nvlink.state/errors give on the healthy recording
    gpus: int  # GPUs on the recorded machine, the count its profile is set to expect
    machine_sets: tuple[str, ...] = ()  # what the recorded machine is not of its profile's HGX node

    def health(self, root, sets=(), gpus=None, **kwargs):
        return health(
            self.nvml,
            root,
            [*self.machine_sets, *sets],
            profile=self.profile,
            gpus=self.gpus if gpus is None else gpus,
            **kwargs,
        )


@pytest.fixture(
    params=[
        ("h200x2", "h200-sxm", Status.PASS, ()),  # 18 NVLinks per GPU through NVSwitch
        ("h200x4", "h200-sxm", Status.PASS, ()),
        # one SXM GPU passed through alone: NVML gives no NVLink, so it is judged as not expecting any
        ("h100x1", "h100-sxm", Status.SKIP, ("expect.nvlinks_per_gpu=null",)),
    ],
    ids=lambda param: param[0],
)
def machine(request) -> Machine:
    stem, profile, nvlink, machine_sets = request.param
    recording = load(stem)
    return Machine(recording, profile, nvlink, recording["device_count"], machine_sets)


@pytest.fixture
def empty_root(tmp_path: Path) -> Path:
    """A root with no /sys/class/infiniband and no /proc: nothing but what a test puts there."""
    root = tmp_path / "root"
    root.mkdir()
    return root


@pytest.fixture
def quiet_kmsg(tmp_path: Path) -> Path:
    path = tmp_path / "kmsg"
    path.write_text(
        "6,1,100,-;Linux version 6.18.44\n6,2,200,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n"
    )
    return path


def cuda_sees(recording, indices=None, **view):
    """The CUDA view of a process that can use the recorded GPUs `indices` (all by default): CUDA cannot
    run on this machine, so health is handed what CUDA would show, as `gpuval accept` hands it its ranks'."""
    devices = recording["devices"] if indices is None else [recording["devices"][i] for i in indices]
    return CudaView(devices=tuple(CudaDevice(d["nvmlDeviceGetUUID"], None) for d in devices), **view)


def health(
    recording,
    root,
    sets=(),
    kmsg=None,
    own_pids=frozenset(),
    profile="h200-sxm",
    library=None,
    gpus=2,
    cuda=None,
):
    loaded = load_profile(profile, [f"expect.gpu_count={gpus}", *sets])
    return node_health(
        loaded,
        NODE,
        library=library or ReplayNvml(recording),
        root=root,
        kmsg=kmsg,
        own_pids=set(own_pids),
        cuda=[cuda_sees(recording)] if cuda is None else cuda,
    )


def only(checks, name, status=None):
    found = [c for c in checks if c.name == name and (status is None or c.status is status)]
    assert found, f"no {name} {status}: {[(c.name, c.status.value) for c in checks]}"
    return found


def bad(checks):
    return [
        (c.name, c.status, c.scope) for c in checks if c.status in (Status.FAIL, Status.ERROR, Status.WARN)
    ]


# --- the healthy recording ------------------------------------------------------------------------------


def test_healthy_recording_passes(machine, empty_root, quiet_kmsg):
    checks = machine.health(empty_root, kmsg=quiet_kmsg)
    assert bad(checks) == []
    assert verdict(checks) is Status.PASS
    nvlink = {c.name: c.status for c in checks if c.name.startswith("nvlink.")}
    assert nvlink == {"nvlink.state": machine.nvlink, "nvlink.errors": machine.nvlink}
    passed = {c.name for c in checks if c.status is Status.PASS and not c.name.startswith("nvlink.")}
    skipped = {c.name: c.detail for c in checks if c.status is Status.SKIP}
    assert passed == {
        "expect.gpu_count",
        "expect.gpu_name",
        "expect.gpu_memory_gib",
        "gpu.reachable",
        "cuda.visible",
        "ecc.enabled",
        "ecc.uncorrected_volatile",
        "ecc.uncorrected_aggregate",
        "ecc.row_remapping",
        "clocks.event_reasons",
        "clocks.temperature",
        "pcie.width",
        "pcie.generation",
        "pcie.replays",
        "processes.foreign",
        "xid.kernel_log",
    }
    # What these recordings cannot show: H100/H200 remap rows instead of retiring pages, the machines
    # have no InfiniBand, this test process has no CUDA (a CPU build of torch, or a CUDA build with no
    # driver), and the replay has no NVML event API.
    assert set(skipped) - {"nvlink.state", "nvlink.errors"} == {
        "ecc.retired_pages",
        "infiniband.state",
        "smoke.matmul",
        "sdc.bitwise",
        "xid.events",
    }
    assert "NotSupported" in skipped["ecc.retired_pages"] and "remaps rows" in skipped["ecc.retired_pages"]
    assert skipped["infiniband.state"] == "no InfiniBand port on this node"
    assert skipped["smoke.matmul"] == no_cuda_here().smoke
    if machine.nvlink is Status.SKIP:
        assert skipped["nvlink.state"] == "this GPU has no NVLink (or NVML reports none)"
    scopes = {c.scope for c in checks if c.name == "ecc.enabled"}
    assert scopes == {f"gpu:n1/{index}" for index in range(machine.gpus)}
    assert "driver.version" not in {c.name for c in checks}  # no pin in the profile: no check


def test_result_of_a_health_run_is_valid_result_json(h200, empty_root):
    loaded = load_profile("h200-sxm", ["expect.gpu_count=2"])
    snap = snapshot(ReplayNvml(h200))
    checks = node_health(
        loaded,
        NODE,
        library=ReplayNvml(h200),
        root=empty_root,
        kmsg=None,
        snapshot=snap,
        cuda=[cuda_sees(h200)],
    )
    result = health_result(loaded, NODE, checks, snap, "2026-11-22T00:00:00+00:00", 1.5)
    document = json.loads(result.to_json())
    jsonschema.validate(document, json_schema())
    assert document["verdict"] == "PASS" and document["measurements"] == []
    assert document["inventory"]["nodes"][0]["nvml"]["gpus"][1]["pci_bus_id"] == "00000000:00:07.0"


# --- one fault at a time ------------------------------------------------------------------------------


def test_uncorrectable_ecc_error_on_the_last_gpu(machine, empty_root):
    last = machine.gpus - 1
    machine.nvml["devices"][last]["nvmlDeviceGetTotalEccErrors(uncorrected,volatile)"] = 2
    machine.nvml["devices"][last]["nvmlDeviceGetTotalEccErrors(uncorrected,aggregate)"] = 3
    checks = machine.health(empty_root)
    assert bad(checks) == [
        ("ecc.uncorrected_volatile", Status.FAIL, f"gpu:n1/{last}"),
        ("ecc.uncorrected_aggregate", Status.FAIL, f"gpu:n1/{last}"),
    ]
    volatile = only(checks, "ecc.uncorrected_volatile", Status.FAIL)[0]
    assert volatile.value == 2
    assert "2 uncorrectable ECC errors since the driver loaded" in volatile.detail
    assert "drain the node and run field diagnostics (dcgmi diag -r 3)" in volatile.detail
    assert verdict(checks) is Status.FAIL


def test_ecc_on_without_an_error_count_is_an_error_not_a_pass(h200, empty_root):
    h200["devices"][0]["nvmlDeviceGetTotalEccErrors(uncorrected,volatile)"] = {"error": "NVMLError_Unknown"}
    checks = health(h200, empty_root)
    assert bad(checks) == [("ecc.uncorrected_volatile", Status.ERROR, "gpu:n1/0")]
    assert verdict(checks) is Status.ERROR


def test_ecc_disabled_and_pending_change(h200, empty_root):
    h200["devices"][0]["nvmlDeviceGetEccMode"] = [0, 1]  # off now, on after the next reboot
    h200["devices"][1]["nvmlDeviceGetEccMode"] = [1, 0]  # on now, off after the next reboot
    checks = health(h200, empty_root)
    off, turning_off = (
        only(checks, "ecc.enabled", Status.FAIL)[0],
        only(checks, "ecc.enabled", Status.WARN)[0],
    )
    assert off.scope == "gpu:n1/0" and "reboot or reset the GPU to apply" in off.detail
    assert turning_off.scope == "gpu:n1/1" and "nvidia-smi -i 1 -e 1" in turning_off.detail


def test_down_nvlink_5_on_gpu0(h200, empty_root):
    h200["devices"][0]["nvlinks"][5]["state"] = 0
    checks = health(h200, empty_root)
    assert bad(checks) == [("nvlink.state", Status.FAIL, "link:n1/gpu0-nvlink5")]
    down = only(checks, "nvlink.state", Status.FAIL)[0]
    assert "NVLink 5 to the NVSwitch of GPU 0 is down (17 of 18 up; down: 5)" in down.detail
    assert "reseat/replace the NVLink/NVSwitch tray" in down.detail
    assert only(checks, "nvlink.state", Status.PASS)[0].scope == "gpu:n1/1"


def test_nvlink_error_counters_warn_per_link(h200, empty_root):
    h200["devices"][1]["nvlinks"][3]["error_dl_crc_flit"] = 7
    checks = health(h200, empty_root)
    assert bad(checks) == [("nvlink.errors", Status.WARN, "link:n1/gpu1-nvlink3")]
    assert "7 CRC errors on NVLink 3 of GPU 1" in only(checks, "nvlink.errors", Status.WARN)[0].detail


def test_gpu_without_nvlink_fails_where_the_profile_expects_18_and_skips_where_it_expects_none(
    h200, empty_root
):
    for link in h200["devices"][0]["nvlinks"]:
        link["state"] = {"error": "NVMLError_NotSupported"}
    checks = health(h200, empty_root)  # h200-sxm: expect.nvlinks_per_gpu 18
    assert bad(checks) == [("nvlink.state", Status.FAIL, "gpu:n1/0")]
    missing = only(checks, "nvlink.state", Status.FAIL)[0]
    assert (missing.value, missing.threshold) == (0, {"min": 18})
    assert "GPU 0 has 0 of the profile's 18 NVLinks up" in missing.detail
    assert "nvidia-fabricmanager" in missing.detail

    checks = health(h200, empty_root, ["expect.nvlinks_per_gpu=null"])
    skipped = [(c.name, c.scope) for c in checks if c.status is Status.SKIP and c.name.startswith("nvlink")]
    assert skipped == [("nvlink.state", "gpu:n1/0"), ("nvlink.errors", "gpu:n1/0")]
    assert bad(checks) == []


def test_the_lone_h100_fails_an_hgx_profile_for_its_missing_nvlinks(empty_root):
    checks = health(load("h100x1"), empty_root, profile="h100-sxm", gpus=1)
    assert bad(checks) == [("nvlink.state", Status.FAIL, "gpu:n1/0")]


def test_fewer_links_than_expected_fail_even_when_every_reported_link_is_up(h200, empty_root):
    del h200["devices"][1]["nvlinks"][12:]  # NVML reports 12 links, all up
    checks = health(h200, empty_root)
    assert bad(checks) == [("nvlink.state", Status.FAIL, "gpu:n1/1")]
    assert only(checks, "nvlink.state", Status.FAIL)[0].value == 12


def test_degraded_pcie_link_x8_of_x16(machine, empty_root):
    machine.nvml["devices"][0]["nvmlDeviceGetCurrPcieLinkWidth"] = 8
    checks = machine.health(empty_root)
    assert bad(checks) == [("pcie.width", Status.FAIL, "gpu:n1/0")]
    width = only(checks, "pcie.width", Status.FAIL)[0]
    assert (width.value, width.threshold) == (8, {"min": 16})
    assert "x8 of x16" in width.detail and "check the PCIe slot/riser, retrain the link" in width.detail


def test_lower_pcie_generation_is_only_a_warning(h200, empty_root):
    h200["devices"][1]["nvmlDeviceGetCurrPcieLinkGeneration"] = 1  # an idle GPU saving power
    checks = health(h200, empty_root)
    assert bad(checks) == [("pcie.generation", Status.WARN, "gpu:n1/1")]
    assert "re-check under load" in only(checks, "pcie.generation", Status.WARN)[0].detail


@pytest.mark.parametrize("replays, status", [(1000, Status.WARN), (10, Status.PASS)])
def test_pcie_replays_against_dcgm_rate(h200, empty_root, replays, status):
    (empty_root / "proc").mkdir()
    (empty_root / "proc" / "uptime").write_text("600.00 1100.00\n")  # 10 minutes since boot
    h200["devices"][0]["nvmlDeviceGetPcieReplayCounter"] = replays
    check = [c for c in health(h200, empty_root) if c.name == "pcie.replays" and c.scope == "gpu:n1/0"][0]
    assert check.status is status
    assert f"{replays} replays since boot, {replays / 10:.2g} a minute" in check.detail
    assert pcie.uptime_s(empty_root) == 600.0


@pytest.mark.parametrize(
    "reasons, status, words, hint",
    [
        (0x40, Status.FAIL, "hw_thermal_slowdown active", "check cooling (fans, airflow"),
        (0x8, Status.FAIL, "hw_slowdown active", "check cooling and power delivery"),
        (0x80 | 0x8, Status.FAIL, "hw_power_brake_slowdown, hw_slowdown active", "check the PSUs"),
        (0x20, Status.WARN, "sw_thermal_slowdown active", "check cooling"),
        (0x4 | 0x1, Status.PASS, "gpu_idle, sw_power_cap", ""),
    ],
)
def test_clock_event_reasons(machine, empty_root, reasons, status, words, hint):
    last = machine.gpus - 1
    for key in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        machine.nvml["devices"][last][key] = reasons
    checks = machine.health(empty_root)
    flagged = [] if status is Status.PASS else [("clocks.event_reasons", status, f"gpu:n1/{last}")]
    assert bad(checks) == flagged
    check = [c for c in checks if c.name == "clocks.event_reasons" and c.scope == f"gpu:n1/{last}"][0]
    assert check.status is status
    assert words in check.detail and hint in check.detail


@pytest.mark.parametrize("celsius, status", [(89, Status.FAIL), (85, Status.WARN), (83, Status.PASS)])
def test_temperature_against_the_slowdown_threshold(h200, empty_root, celsius, status):
    h200["devices"][0]["nvmlDeviceGetTemperature(gpu)"] = celsius  # slowdown threshold recorded: 89 C
    check = [c for c in health(h200, empty_root) if c.name == "clocks.temperature" and c.scope == "gpu:n1/0"][
        0
    ]
    assert (check.status, check.value) == (status, celsius)
    if status is not Status.PASS:
        assert "89 C slowdown threshold" in check.detail and "check cooling" in check.detail


def test_temperature_nvml_cannot_give_is_a_skip_with_the_reason(h200, empty_root):
    h200["devices"][0]["nvmlDeviceGetTemperature(gpu)"] = {"error": "NVMLError_NotSupported"}
    check = [c for c in health(h200, empty_root) if c.name == "clocks.temperature" and c.scope == "gpu:n1/0"][
        0
    ]
    assert check.status is Status.SKIP and "NotSupported" in check.detail


def test_missing_gpu(machine, empty_root):
    machine.nvml["device_count"] = 1  # the H200 recording loses its GPU 1; the H100 one is as recorded
    machine.nvml["devices"] = machine.nvml["devices"][:1]
    checks = machine.health(empty_root, gpus=2)
    assert bad(checks) == [("expect.gpu_count", Status.FAIL, "node:n1")]
    count = only(checks, "expect.gpu_count")[0]
    assert (count.value, count.threshold) == (1, {"equal": 2})
    assert (
        "1 GPUs visible, 2 expected" in count.detail and "reseat or replace the missing GPU" in count.detail
    )


def test_lost_gpu_fails_once_and_other_families_skip_it(h200, empty_root):
    h200["device_count"] = 3  # the driver counts a third GPU NVML cannot open (GpuIsLost)
    checks = health(h200, empty_root, sets=["expect.gpu_count=3"])
    assert bad(checks) == [
        ("expect.gpu_count", Status.FAIL, "node:n1"),
        ("gpu.reachable", Status.FAIL, "gpu:n1/2"),
    ]
    lost = only(checks, "gpu.reachable", Status.FAIL)[0]
    assert "GpuIsLost" in lost.detail and "Xid 79" in lost.detail
    assert "1 more counted by the driver" in only(checks, "expect.gpu_count")[0].detail
    assert all(
        "see gpu.reachable" in c.detail for c in checks if c.scope == "gpu:n1/2" and c.name != "gpu.reachable"
    )


def test_row_remapping_pending(h200, empty_root):
    h200["devices"][0]["nvmlDeviceGetRemappedRows"] = [
        0,
        1,
        1,
        0,
    ]  # correctable, uncorrectable, pending, failed
    checks = health(h200, empty_root)
    assert bad(checks) == [("ecc.row_remapping", Status.FAIL, "gpu:n1/0")]
    detail = only(checks, "ecc.row_remapping", Status.FAIL)[0].detail
    assert "reset the GPU (nvidia-smi -r -i 0) or reboot to apply pending row remapping" in detail
    assert "1 rows remapped for uncorrectable" in detail


def test_row_remapping_failed(h200, empty_root):
    h200["devices"][1]["nvmlDeviceGetRemappedRows"] = [0, 512, 0, 1]
    checks = health(h200, empty_root)
    assert bad(checks) == [("ecc.row_remapping", Status.FAIL, "gpu:n1/1")]
    assert "replace the GPU" in only(checks, "ecc.row_remapping", Status.FAIL)[0].detail


def test_retired_pages_where_supported(h200, empty_root):
    device = h200["devices"][0]
    device["nvmlDeviceGetRetiredPages(sbe)"] = [0x1000 * i for i in range(10)]
    device["nvmlDeviceGetRetiredPages(dbe)"] = [0x1000 * i for i in range(6)]
    device["nvmlDeviceGetRetiredPagesPendingStatus"] = 0
    check = only(health(h200, empty_root), "ecc.retired_pages", Status.WARN)[0]
    assert (check.scope, check.value) == ("gpu:n1/0", 16)
    device["nvmlDeviceGetRetiredPagesPendingStatus"] = 1
    check = only(health(h200, empty_root), "ecc.retired_pages", Status.FAIL)[0]
    assert "reset the GPU (nvidia-smi -r -i 0) or reboot to retire the pages" in check.detail


@pytest.mark.parametrize("pin, status", [("575.*", Status.FAIL), ("580.*", Status.PASS)])
def test_driver_version_pin(h200, empty_root, pin, status):
    checks = health(h200, empty_root, sets=[f"expect.driver_version={pin}"])
    check = only(checks, "driver.version")[0]
    assert (check.status, check.scope, check.threshold) == (status, "node:n1", {"match": pin})
    if status is Status.FAIL:
        assert "driver 580.159.04, the profile pins 575.*" in check.detail
        assert "install the pinned driver" in check.detail


def test_xid_79_in_the_kernel_log_names_gpu0_by_bus_id(h200, empty_root):
    checks = health(h200, empty_root, kmsg=DATA / "kmsg" / "xid79.txt")
    assert bad(checks) == [
        ("xid.kernel_log", Status.WARN, "gpu:n1/1"),
        ("xid.kernel_log", Status.FAIL, "gpu:n1/0"),
    ]
    fallen = only(checks, "xid.kernel_log", Status.FAIL)[0]
    assert fallen.value == 79
    assert (
        "Xid 79 (GPU has fallen off the bus) on GPU 0 2 times in the kernel log since boot" in fallen.detail
    )
    assert "drain the node and reboot" in fallen.detail
    app = only(checks, "xid.kernel_log", Status.WARN)[0]
    assert app.value == 13 and "application" in app.detail


def test_kernel_log_parsing_and_bus_ids():
    lines = (
        "4,9,99,-;NVRM: Xid (0000:3b:00): 31, pid=77, name=a.out, Ch 00000008, intr 10000000\n"
        "[  123.456] NVRM: Xid (PCI:0001:c1:00): 95, pid=1, Uncontained: FBHUB. RST: Yes, D-RST: No\n"
        "NVRM: GPU at PCI:0000:3b:00: GPU-0\n"
    )
    assert xid.parse_kernel_log(lines) == [
        (0.000099, "0000:3b:00", 31, "pid=77, name=a.out, Ch 00000008, intr 10000000"),
        (123.456, "0001:c1:00", 95, "pid=1, Uncontained: FBHUB. RST: Yes, D-RST: No"),
    ]
    assert bus_key("PCI:0001:c1:00") == bus_key("00000001:C1:00.0") == (1, 0xC1, 0)
    assert xid.describe(95).critical and not xid.describe(31).critical
    assert not xid.describe(999).critical  # an XID the table does not know is a WARN


def test_unreadable_kernel_log_is_a_skip_with_the_reason(h200, empty_root):
    checks = health(h200, empty_root, kmsg=empty_root / "no-such-kmsg")
    check = only(checks, "xid.kernel_log")[0]
    assert check.status is Status.SKIP and "cannot read" in check.detail


class EventReplay(ReplayNvml):
    """The replay plus NVML's event API: `events` are (device index, xid) delivered before a timeout."""

    def __init__(self, recording, events=(), refuse=False):
        super().__init__(recording)
        self.events, self.refuse, self.registered, self.waits = list(events), refuse, [], []

    def nvmlEventSetCreate(self):  # noqa: N802 - pynvml's names
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle, types, event_set):  # noqa: N802
        if self.refuse:
            raise pynvml.NVMLError_NotSupported()
        self.registered.append((handle, types, event_set))

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):  # noqa: N802
        self.waits.append(timeout_ms)
        if not self.events:
            raise pynvml.NVMLError_Timeout()
        device, code = self.events.pop(0)
        return _Event(device, code)

    def nvmlDeviceGetIndex(self, handle):  # noqa: N802
        return handle

    def nvmlEventSetFree(self, event_set):  # noqa: N802
        pass


class _Event:
    def __init__(self, device, code):
        self.device, self.eventType, self.eventData = device, 0x8, code


def test_critical_xid_during_the_nvml_event_wait(h200, empty_root):
    library = EventReplay(h200, events=[(1, 48)])
    checks = health(h200, empty_root, sets=["health.xid_window_s=0.2"], library=library)
    assert [(handle, types) for handle, types, _ in library.registered] == [(0, 0x8), (1, 0x8)]
    assert 0 < library.waits[0] <= 200
    assert bad(checks) == [("xid.events", Status.FAIL, "gpu:n1/1")]
    detail = only(checks, "xid.events", Status.FAIL)[0].detail
    assert "Xid 48 (double-bit ECC error) on GPU 1 during the 0.2 s NVML event wait" in detail


def test_quiet_event_wait_passes_and_refused_registration_skips(h200, empty_root):
    checks = health(h200, empty_root, sets=["health.xid_window_s=0.05"], library=EventReplay(h200))
    assert (
        "no critical XID during a 0.05 s wait on 2 GPUs" in only(checks, "xid.events", Status.PASS)[0].detail
    )
    checks = health(
        h200, empty_root, sets=["health.xid_window_s=0.05"], library=EventReplay(h200, refuse=True)
    )
    assert "NVMLError_NotSupported" in only(checks, "xid.events", Status.SKIP)[0].detail


def test_infiniband_port_down_in_a_fake_sysfs_tree(h200):
    root = DATA / "sysfs-health" / "ib-one-down"
    checks = health(h200, root, sets=["expect.ib_rate_gbps=400", "expect.ib_ports=2"])
    assert bad(checks) == [
        ("infiniband.state", Status.FAIL, "link:n1/mlx5_1-port1"),
        ("infiniband.rate_gbps", Status.FAIL, "link:n1/mlx5_1-port1"),
    ]
    down = only(checks, "infiniband.state", Status.FAIL)[0]
    assert "port 1 of mlx5_1 is DOWN (Disabled), not ACTIVE" in down.detail and "cable" in down.detail
    assert only(checks, "infiniband.state", Status.PASS)[0].scope == "link:n1/mlx5_0-port1"
    assert (
        only(checks, "infiniband.ports", Status.PASS)[0].value == 2
    )  # the Ethernet (RoCE) port is not counted
    assert [c.scope for c in checks if c.name == "infiniband.rate_gbps" and c.status is Status.PASS] == [
        "link:n1/mlx5_0-port1"
    ]


def test_expected_infiniband_ports_missing(h200, empty_root):
    checks = health(h200, empty_root, sets=["expect.ib_ports=8"])
    assert bad(checks) == [("infiniband.ports", Status.FAIL, "node:n1")]
    assert "0 InfiniBand ports, 8 expected" in only(checks, "infiniband.ports")[0].detail


def test_foreign_process_on_gpu1(h200, empty_root):
    # gpuval health (the Slurm health check, beside user jobs) WARNs by default; accept FAILs: see
    # test_foreign_processes.py
    (empty_root / "proc" / "4321").mkdir(parents=True)
    (empty_root / "proc" / "4321" / "comm").write_text("python3\n")
    h200["devices"][1]["nvmlDeviceGetComputeRunningProcesses"] = [{"pid": 4321, "usedGpuMemory": 40 * 2**30}]
    checks = health(h200, empty_root)
    assert bad(checks) == [("processes.foreign", Status.WARN, "gpu:n1/1")]
    detail = only(checks, "processes.foreign", Status.WARN)[0].detail
    assert (
        "pid 4321 (python3, 40.0 GiB) on GPU 1: benchmarks on it would be skewed or run out of memory"
        in detail
    )
    assert bad(health(h200, empty_root, own_pids={4321})) == []  # gpuval's own rank is not foreign


def test_a_family_that_raises_is_one_error_naming_it(h200, empty_root, monkeypatch):
    def broken(gpu, scope):
        raise KeyError("pcie_width_max")

    monkeypatch.setattr(pcie, "_width", broken)
    checks = health(h200, empty_root)
    assert bad(checks) == [("pcie.run", Status.ERROR, "node:n1")]
    assert "the pcie check crashed: KeyError" in only(checks, "pcie.run")[0].detail
    assert not [c for c in checks if c.name.startswith("pcie.") and c.name != "pcie.run"]
    assert only(checks, "ecc.enabled", Status.PASS)  # the other families still ran


# --- no driver, settings ------------------------------------------------------------------------------


def test_no_driver_skips_gpu_checks_and_fails_an_expected_count(h200, empty_root):
    library = ReplayNvml(h200, init_error="NVMLError_LibraryNotFound")
    checks = health(h200, empty_root, sets=["expect.gpu_count=8"], library=library)
    assert bad(checks) == [("expect.gpu_count", Status.FAIL, "node:n1")]
    count = only(checks, "expect.gpu_count")[0]
    assert "0 GPUs visible, 8 expected: no NVIDIA driver" in count.detail
    assert "install or load the NVIDIA driver" in count.detail
    skipped = [c for c in checks if c.status is Status.SKIP]
    assert {c.name for c in skipped} >= {"ecc", "clocks", "pcie", "nvlink", "xid", "smoke.matmul"}
    assert all("no NVIDIA driver" in c.detail for c in skipped if c.name != "infiniband.state")


def test_no_driver_with_the_cpu_profile_passes(h200, empty_root):
    library = ReplayNvml(h200, init_error="NVMLError_LibraryNotFound")
    checks = node_health(load_profile("cpu"), NODE, library=library, root=empty_root, kmsg=None)
    assert bad(checks) == []
    assert verdict(checks) is Status.PASS  # expect.gpu_count: 0 is shown to hold


def test_health_skip_leaves_families_out_and_rejects_unknown_names(h200, empty_root):
    checks = health(h200, empty_root, sets=["health.skip=[smoke, xid]"])
    assert not [c for c in checks if c.name.startswith(("smoke", "xid"))]
    with pytest.raises(UsageError, match="unknown health check 'smok' \\(did you mean 'smoke'\\?\\)"):
        health(h200, empty_root, sets=["health.skip=[smok]"])


def test_health_section_rejects_unknown_keys():
    with pytest.raises(
        UsageError, match="unknown key 'health.xid_windw_s' \\(did you mean 'xid_window_s'\\?\\)"
    ):
        load_profile("cpu", ["health.xid_windw_s=2"])


# --- which GPUs the node has: the PCI bus, NVML and CUDA -------------------------------------------------

H100_SXM = 0x2330  # the lent H100's NVML pciDeviceId is 0x233010de (tests/data/nvml/h100x1.json)


def pci_tree(root: Path, addresses, device_id=H100_SXM) -> Path:
    """A fake sysfs holding NVIDIA GPUs (3D controllers) at `addresses`, beside functions that are not GPUs:
    an NVSwitch, a GPU's HD-audio function and the BMC's VGA of another vendor."""
    functions = [(address, 0x10DE, 0x030200, device_id) for address in addresses]
    functions += [
        ("0000:05:00.0", 0x10DE, 0x068000, 0x22A3),  # NVSwitch: bridge, other
        ("0000:c1:00.1", 0x10DE, 0x040300, 0x22BA),  # audio function of a GPU
        ("0000:03:00.0", 0x1A03, 0x030000, 0x2000),  # ASPEED VGA
    ]
    for address, vendor, pci_class, device in functions:
        folder = root / "sys/bus/pci/devices" / address
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(f"0x{vendor:04x}\n")
        (folder / "class").write_text(f"0x{pci_class:06x}\n")
        (folder / "device").write_text(f"0x{device:04x}\n")
    return root


EIGHT = [f"0000:{bus:02x}:00.0" for bus in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)]


def test_the_pci_reader_lists_nvidia_display_controllers_only(empty_root):
    assert nvidia_gpus(empty_root) == []  # no sysfs here: nothing, no error
    pci_tree(empty_root, EIGHT[:2])
    drivers = empty_root / "sys/bus/drivers/nvidia"
    drivers.mkdir(parents=True)
    (empty_root / "sys/bus/pci/devices" / EIGHT[0] / "driver").symlink_to(drivers)
    vga = pci_tree(empty_root / "vga", ["0000:01:00.0"])  # a workstation GPU is a VGA controller
    (vga / "sys/bus/pci/devices/0000:01:00.0/class").write_text("0x030000\n")
    assert [gpu.to_json() for gpu in nvidia_gpus(empty_root)] == [
        {"address": "0000:18:00.0", "pci_id": "10de:2330", "driver": "nvidia"},
        {"address": "0000:2a:00.0", "pci_id": "10de:2330", "driver": None},
    ]
    assert [gpu.address for gpu in nvidia_gpus(vga)] == ["0000:01:00.0"]


def test_driver_not_loaded_with_gpus_on_the_pci_bus_fails_gpu_reachable(h200, empty_root):
    """NVML cannot start, but the hardware holds eight GPUs: a FAIL naming both, never a pass or a skip."""
    library = ReplayNvml(h200, init_error="NVMLError_DriverNotLoaded")
    checks = health(h200, pci_tree(empty_root, EIGHT), library=library, gpus=8)
    assert verdict(checks) is Status.FAIL
    assert bad(checks) == [
        ("expect.gpu_count", Status.FAIL, "node:n1"),
        ("gpu.reachable", Status.FAIL, "node:n1"),
    ]
    detail = only(checks, "gpu.reachable")[0].detail
    assert detail.startswith("8 NVIDIA devices on the PCI bus, NVML: NVMLError_DriverNotLoaded")
    assert "modprobe nvidia" in detail and "dmesg" in detail and "reinstall the driver" in detail
    assert "see gpu.reachable" not in only(checks, "cuda.visible", Status.SKIP)[0].detail  # no GPU to compare


def test_driver_not_loaded_fails_even_a_profile_that_expects_no_gpu(h200, empty_root):
    library = ReplayNvml(h200, init_error="NVMLError_DriverNotLoaded")
    checks = node_health(
        load_profile("cpu"), NODE, library=library, root=pci_tree(empty_root, EIGHT), kmsg=None
    )
    assert bad(checks) == [("gpu.reachable", Status.FAIL, "node:n1")]


def test_a_gpu_on_the_pci_bus_that_nvml_does_not_list_is_named_by_address(empty_root):
    recording = load("h200x4")
    recording["devices"].pop()  # GPU 00:09.0 is on the bus, but the driver no longer counts it
    recording["device_count"] = 3
    root = pci_tree(empty_root, [f"0000:00:{slot:02x}.0" for slot in (6, 7, 8, 9)])
    checks = health(recording, root, gpus=3)
    assert bad(checks) == [("gpu.reachable", Status.FAIL, "node:n1")]
    failed = only(checks, "gpu.reachable")[0]
    assert (failed.value, failed.threshold) == (3, {"equal": 4})
    assert (
        "4 NVIDIA GPUs on the PCI bus, NVML lists 3; not listed: 0000:00:09.0 (driver none)" in failed.detail
    )
    # a job given three of the node's four GPUs on purpose
    allowed = health(recording, root, sets=["health.allow_hidden_gpus=true"], gpus=3)
    assert bad(allowed) == [] and only(allowed, "gpu.reachable", Status.PASS)


def test_a_lost_gpu_on_the_pci_bus_fails_once(h200, empty_root):
    h200["device_count"] = 3  # NVML counts a third GPU it cannot open: it has no address to match
    root = pci_tree(empty_root, ["0000:00:06.0", "0000:00:07.0", "0000:00:08.0"])
    checks = health(h200, root, sets=["expect.gpu_count=3"])
    assert [c.scope for c in checks if c.name == "gpu.reachable"] == ["gpu:n1/2"]


def test_cuda_visible_devices_hiding_the_only_gpu_fails_with_counts_uuid_and_cudas_error(empty_root):
    """`CUDA_VISIBLE_DEVICES= gpuval health --set expect.gpu_count=1` on a one-GPU node."""
    h100 = load("h100x1")
    hidden = CudaView(error="No CUDA GPUs are available", visible_devices="")
    checks = health(
        h100, empty_root, profile="h100-sxm", gpus=1, sets=["expect.nvlinks_per_gpu=null"], cuda=[hidden]
    )
    assert bad(checks) == [("cuda.visible", Status.FAIL, "node:n1")]
    failed = only(checks, "cuda.visible")[0]
    assert (failed.value, failed.threshold) == (0, {"equal": 1})
    assert failed.detail.startswith("NVML lists 1 GPU, CUDA sees 0 (CUDA: No CUDA GPUs are available)")
    assert "not usable through CUDA: GPU 0 (GPU-beb0f669-6fb3-66ad-d389-26df51e5352f)" in failed.detail
    assert (
        "CUDA_VISIBLE_DEVICES='' hides them" in failed.detail and "health.allow_hidden_gpus" in failed.detail
    )
    assert "see cuda.visible" in only(checks, "smoke.matmul", Status.SKIP)[0].detail


def test_cuda_that_cannot_start_fails_with_its_own_error_and_the_fabric_manager_hint(h200, empty_root):
    """NVSwitch node with nvidia-fabricmanager down: NVML answers, CUDA's init returns error 802."""
    error = (
        "Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
        "NumCudaDevices() that might have already set an error? Error 802: system not yet initialized"
    )
    checks = health(h200, empty_root, cuda=[CudaView(error=error)])
    failed = only(checks, "cuda.visible", Status.FAIL)[0]
    assert f"NVML lists 2 GPUs, CUDA sees 0 (CUDA: {error})" in failed.detail
    assert "GPU 0 (GPU-247420ef-5061-c4d8-5cb1-c933f0299a49), GPU 1 (GPU-94b33ec6" in failed.detail
    assert "nvidia-fabricmanager" in failed.detail and "supports this CUDA" in failed.detail
    # allowing hidden GPUs never excuses an error
    assert only(
        health(h200, empty_root, sets=["health.allow_hidden_gpus=true"], cuda=[CudaView(error=error)]),
        "cuda.visible",
        Status.FAIL,
    )
    # srun --gpus-per-task=1 sets CUDA_VISIBLE_DEVICES per rank: the hint still names the fabric manager
    per_task = [CudaView(error=error, visible_devices=str(rank)) for rank in (0, 1)]
    detail = only(health(h200, empty_root, cuda=per_task), "cuda.visible", Status.FAIL)[0].detail
    assert "nvidia-fabricmanager" in detail and "hides them" not in detail


def test_a_gpu_cuda_cannot_see_is_named_unless_the_job_was_given_only_some(h200, empty_root):
    one = cuda_sees(h200, [0], visible_devices="0")
    failed = only(health(h200, empty_root, cuda=[one]), "cuda.visible", Status.FAIL)[0]
    assert failed.detail.startswith(
        "NVML lists 2 GPUs, CUDA sees 1; not usable through CUDA: GPU 1 (GPU-94b33ec6"
    )
    assert "CUDA_VISIBLE_DEVICES='0' hides them" in failed.detail
    allowed = only(
        health(h200, empty_root, sets=["health.allow_hidden_gpus=true"], cuda=[one]), "cuda.visible"
    )
    assert [c.status for c in allowed] == [Status.PASS] and "CUDA sees 1" in allowed[0].detail


def test_cuda_is_judged_on_the_union_of_the_nodes_ranks(h200, empty_root):
    """srun --gpus-per-task=1: each rank sees one GPU; the node's ranks together must see every GPU."""
    each = [cuda_sees(h200, [0], visible_devices="0"), cuda_sees(h200, [1], visible_devices="1")]
    assert only(health(h200, empty_root, cuda=each), "cuda.visible")[0].status is Status.PASS
    twice = [cuda_sees(h200, [0], visible_devices="0"), cuda_sees(h200, [0], visible_devices="0")]
    failed = only(health(h200, empty_root, cuda=twice), "cuda.visible", Status.FAIL)[0]
    assert "CUDA sees 1" in failed.detail and "GPU 1 (GPU-94b33ec6" in failed.detail
    one_broken = [
        cuda_sees(h200, [0]),
        CudaView(error="CUDA driver version is insufficient for CUDA runtime version"),
    ]
    failed = only(health(h200, empty_root, cuda=one_broken), "cuda.visible", Status.FAIL)[0]
    assert "(CUDA: CUDA driver version is insufficient" in failed.detail


def test_a_torch_without_cuda_on_a_gpu_node_is_an_error_of_the_checker(h200, empty_root):
    checks = health(h200, empty_root, cuda=[CudaView(built=False, torch="2.13.0+cpu")])
    error = only(checks, "cuda.visible", Status.ERROR)[0]
    assert (
        "torch (2.13.0+cpu) is built without CUDA" in error.detail and "install a CUDA build" in error.detail
    )
    assert verdict(checks) is Status.ERROR  # never PASS


class TorchStandIn:
    """torch as read_view sees it: CUDA cannot run here, so its answers are given (the only fake object)."""

    def __init__(self, cuda="12.8", error=None, uuids=()):
        self.__version__ = "2.13.0"
        self.version = SimpleNamespace(cuda=cuda)
        self.cuda = SimpleNamespace(
            init=self._init, device_count=lambda: len(uuids), get_device_properties=self._props
        )
        self.error, self.uuids = error, uuids

    def _init(self):
        if self.error:
            raise RuntimeError(self.error)

    def _props(self, index):
        return SimpleNamespace(uuid=self.uuids[index], pci_domain_id=0, pci_bus_id=6 + index, pci_device_id=0)


@pytest.mark.parametrize(
    ("build", "said"),
    [
        ("cpu", "this torch (2.13.0) is built without CUDA: see cuda.visible"),
        ("cuda-no-driver", f"CUDA cannot use the GPUs NVML lists ({NO_DRIVER}): see cuda.visible"),
    ],
)
def test_smoke_says_why_cuda_cannot_run_for_either_build_of_torch(build, said):
    """Both builds whatever torch runs the tests: a CPU build is the checker's fault, a CUDA build that
    finds no driver gives CUDA's own words, as on a broken GPU node."""
    torch = TorchStandIn(cuda=None) if build == "cpu" else TorchStandIn(error=NO_DRIVER + "\nmore")
    assert smoke.why_no_cuda(torch) == said


def test_read_view_keeps_cudas_own_error_and_nvmls_uuid_spelling(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    broken = read_view(
        TorchStandIn(error="CUDA driver initialization failed, you might not have a CUDA gpu.\nmore")
    )
    assert broken == CudaView(
        error="CUDA driver initialization failed, you might not have a CUDA gpu.",
        visible_devices="3",
        torch="2.13.0",
        given=("CUDA_VISIBLE_DEVICES", "3"),  # which GPUs are the job's (gpuval.health.job)
    )
    working = read_view(TorchStandIn(uuids=("beb0f669-6fb3-66ad-d389-26df51e5352f",)))
    assert working.devices == (CudaDevice("GPU-beb0f669-6fb3-66ad-d389-26df51e5352f", (0, 6, 0)),)
    assert working.error is None
    assert read_view(TorchStandIn(cuda=None)).built is False


# --- the CUDA smoke test, on the CPU device ---------------------------------------------------------------


def test_smoke_matmul_matches_the_cpu_reference():
    import torch

    passed, detail = smoke.smoke(torch.device("cpu"))
    assert passed, detail


def test_smoke_catches_an_unwritten_output_and_a_wrong_element(monkeypatch):
    import torch

    monkeypatch.setattr(smoke, "multiply", lambda a, b, out: None)  # a kernel that never ran
    passed, detail = smoke.smoke(torch.device("cpu"))
    assert not passed and f"{smoke.SIZE**2} of {smoke.SIZE**2} output elements were never written" in detail

    def one_bit_flip(a, b, out):
        torch.matmul(a, b, out=out)
        out[7, 11] += 2.0**-20  # a flipped mantissa bit, far below fp32 noise yet far above fp64's

    monkeypatch.setattr(smoke, "multiply", one_bit_flip)
    passed, detail = smoke.smoke(torch.device("cpu"))
    assert not passed and "1 of" in detail and "differ from the CPU result" in detail


class FakeCuda:
    """torch as the smoke family sees it on a GPU machine: CUDA numbers the recorded GPUs in reverse."""

    class OutOfMemoryError(RuntimeError):
        pass

    def __init__(self, recording, with_uuid=True):
        self.props = []
        for device in reversed(recording["devices"]):
            pci = device["nvmlDeviceGetPciInfo"]
            uuid = device["nvmlDeviceGetUUID"].removeprefix("GPU-") if with_uuid else ""
            self.props.append(
                SimpleNamespace(
                    uuid=uuid, pci_domain_id=pci["domain"], pci_bus_id=pci["bus"], pci_device_id=pci["device"]
                )
            )

    def is_available(self):
        return True

    def device_count(self):
        return len(self.props)

    def get_device_properties(self, index):
        return self.props[index]


@pytest.mark.parametrize("with_uuid", [True, False], ids=["by-uuid", "by-pci-bus-id"])
def test_smoke_runs_on_the_cuda_device_of_each_nvml_gpu(h200, empty_root, monkeypatch, with_uuid):
    cuda = FakeCuda(h200, with_uuid)
    monkeypatch.setitem(
        sys.modules,
        "torch",
        SimpleNamespace(cuda=cuda, device=lambda kind, index: SimpleNamespace(type=kind, index=index)),
    )
    ran = []

    def fake_smoke(device):
        ran.append(device.index)
        if device.index == 0:  # CUDA device 0 is NVML's GPU 1: its FAIL must name gpu:n1/1
            return False, "3 of 262144 elements differ from the CPU result (max error 0.5)"
        return True, "matches"

    monkeypatch.setattr(smoke, "smoke", fake_smoke)
    monkeypatch.setattr(health_sdc, "device_result", same_fingerprint)
    checks = health(h200, empty_root)
    assert sorted(ran) == [0, 1]  # every GPU once (at the same time); which is which: below
    assert bad(checks) == [("smoke.matmul", Status.FAIL, "gpu:n1/1")]
    detail = only(checks, "smoke.matmul", Status.FAIL)[0].detail
    assert "3 of 262144 elements differ" in detail and "dcgmi diag -r 3" in detail

    def cuda_error(device):
        raise RuntimeError("CUDA error: uncorrectable ECC error encountered\nmore lines")

    monkeypatch.setattr(smoke, "smoke", cuda_error)
    failed = only(health(h200, empty_root), "smoke.matmul", Status.FAIL)
    assert [c.scope for c in failed] == ["gpu:n1/0", "gpu:n1/1"]
    assert "CUDA failed on this GPU (CUDA error: uncorrectable ECC error encountered)" in failed[0].detail


def same_fingerprint(device, scope):
    return {"scope": scope, "model": "NVIDIA H200 (132 SMs)", "first": "ab" * 32, "second": "ab" * 32}


def test_sdc_names_the_nvml_gpu_whose_bytes_differ(h200, empty_root, monkeypatch):
    cuda = FakeCuda(h200, with_uuid=True)
    monkeypatch.setitem(
        sys.modules,
        "torch",
        SimpleNamespace(cuda=cuda, device=lambda kind, index: SimpleNamespace(type=kind, index=index)),
    )
    monkeypatch.setattr(smoke, "smoke", lambda device: (True, "matches"))
    h200["device_count"] = 2

    def fingerprints(device, scope):  # CUDA device 0 is NVML's GPU 1: it computes different bytes
        result = same_fingerprint(device, scope)
        return {**result, "first": "cd" * 32, "second": "cd" * 32} if device.index == 0 else result

    monkeypatch.setattr(health_sdc, "device_result", fingerprints)
    checks = only(health(h200, empty_root), "sdc.bitwise", Status.FAIL)
    # two GPUs that disagree: no majority names the wrong one, so both are suspect
    assert sorted(c.scope for c in checks) == ["gpu:n1/0", "gpu:n1/1"]


# --- the command, as a user runs it ----------------------------------------------------------------------


def _read(directory: Path) -> dict:
    document = json.loads((directory / "result.json").read_text())
    jsonschema.validate(document, json_schema())
    suite = ET.parse(directory / "junit.xml").getroot().find("testsuite")
    assert suite.get("tests") == str(len(document["checks"]))
    assert suite.get("failures") == str(sum(c["status"] == "FAIL" for c in document["checks"]))
    return document


def test_cli_health_on_this_cpu_machine_passes_with_the_cpu_profile(gpuval, tmp_path):
    proc = gpuval(["health", "--output", str(tmp_path / "out")], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gpuval health" in proc.stdout and "profile cpu" in proc.stdout
    document = _read(tmp_path / "out")
    assert document["verdict"] == "PASS" and document["profile"] == "cpu" and document["measurements"] == []
    statuses = {c["name"]: c["status"] for c in document["checks"]}
    assert statuses["expect.gpu_count"] == "PASS"
    assert statuses["ecc"] == "SKIP" and statuses["smoke.matmul"] == "SKIP"


def test_cli_health_expecting_8_gpus_without_a_driver_fails(gpuval, tmp_path):
    proc = gpuval(
        ["health", "--set", "expect.gpu_count=8", "--output", str(tmp_path / "out"), "--json"], tmp_path
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    document = json.loads(proc.stdout)
    assert document == _read(tmp_path / "out")
    failed = [c for c in document["checks"] if c["status"] == "FAIL"]
    assert [(c["name"], c["value"]) for c in failed] == [("expect.gpu_count", 0)]
    assert "0 GPUs visible, 8 expected" in failed[0]["detail"]


def test_cli_health_broken_profile_is_a_usage_error(gpuval, assert_usage_error, write_profile, tmp_path):
    path = write_profile("name: x\nexpect:\n  gpu_count: 8: 9\n", "broken.yaml")
    proc = gpuval(["health", "--profile", str(path), "--output", str(tmp_path / "out")], tmp_path)
    assert_usage_error(proc, "broken YAML at line 3", str(path))
    assert not (tmp_path / "out").exists()


def test_cli_health_unknown_family_in_skip_is_a_usage_error(gpuval, assert_usage_error, tmp_path):
    out = tmp_path / "out"
    proc = gpuval(
        ["health", "--profile", "cpu", "--set", "health.skip=[nvlnk]", "--output", str(out)], tmp_path
    )
    assert_usage_error(proc, "unknown health check 'nvlnk'", "did you mean 'nvlink'")
    assert not out.exists()


def fake_node(root: Path, recording: str = "h100x1", init_error: str | None = None) -> dict[str, str]:
    """The environment of a gpuval child process on a fake node: /sys read from `root` (GPUVAL_SYSFS_ROOT)
    and NVML answering from a recording, or failing to start with `init_error` (tests/dist/nvmlhook)."""
    from conftest import cli_env

    path = os.pathsep.join(
        filter(None, [str(DATA.parent / "dist" / "nvmlhook"), os.environ.get("PYTHONPATH")])
    )
    extra = {"GPUVAL_SYSFS_ROOT": str(root), "PYTHONPATH": path, "GPUVAL_TEST_NVML": recording}
    return cli_env(**extra, **({"GPUVAL_TEST_NVML_INIT_ERROR": init_error} if init_error else {}))


@pytest.mark.slow
def test_cli_on_a_node_whose_driver_is_not_loaded_fails_quickly_and_never_benchmarks_the_cpu(
    gpuval, tmp_path
):
    """Eight H100s on the PCI bus, NVML: DriverNotLoaded. health and accept pick h100-sxm from the PCI ids
    (not cpu) and FAIL within seconds; accept runs one rank and no benchmark; bench refuses (exit 3)."""
    env = fake_node(pci_tree(tmp_path / "root", EIGHT), init_error="NVMLError_DriverNotLoaded")
    proc = gpuval(["health", "--output", str(tmp_path / "health")], tmp_path, env=env, timeout=90)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    document = _read(tmp_path / "health")
    assert document["profile"] == "h100-sxm" and document["duration_s"] < 30
    failed = {c["name"]: c["detail"] for c in document["checks"] if c["status"] == "FAIL"}
    assert failed["gpu.reachable"].startswith(
        "8 NVIDIA devices on the PCI bus, NVML: NVMLError_DriverNotLoaded"
    )

    proc = gpuval(["accept", "--quick", "--output", str(tmp_path / "accept")], tmp_path, env=env, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    document = _read(tmp_path / "accept")
    assert document["verdict"] == "FAIL" and document["duration_s"] < 30
    assert document["world"] == {"size": 1, "nodes": 1, "backend": "gloo"} and document["measurements"] == []
    benchmark_checks = [c for c in document["checks"] if c["name"] in load_profile("h100-sxm").checks]
    assert benchmark_checks and {c["status"] for c in benchmark_checks} == {"SKIP"}
    assert all("gpu.reachable FAIL on node:" in c["detail"] for c in benchmark_checks)

    proc = gpuval(["bench", "matmul", "--quick"], tmp_path, env=env, timeout=90)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"gpuval: bench matmul: CUDA can use no GPU here ({no_cuda_here().rank}) "
        "although 8 NVIDIA GPUs are on the PCI bus: a benchmark would measure the CPU; gpuval health says why"
    ]


@pytest.mark.slow
def test_cli_accept_where_nvml_sees_a_gpu_cuda_cannot_use_runs_no_benchmark(gpuval, tmp_path):
    """NVML answers for the recorded H100 while CUDA here cannot run: one rank, no benchmark on the CPU in
    its place, the checks SKIP naming cuda.visible, and the verdict is not PASS."""
    env = fake_node(tmp_path / "root")  # nothing on this fake PCI bus: NVML alone says there is a GPU
    sets = ["--set", "expect.gpu_count=1", "--set", "expect.nvlinks_per_gpu=null"]
    proc = gpuval(
        ["accept", "--quick", *sets, "--output", str(tmp_path / "out")], tmp_path, env=env, timeout=120
    )
    document = _read(tmp_path / "out")
    assert proc.returncode in (1, 3) and document["verdict"] != "PASS", proc.stdout + proc.stderr
    assert (
        document["profile"] == "h100-sxm"
        and document["world"]["size"] == 1
        and document["measurements"] == []
    )
    assert [c["status"] for c in document["checks"] if c["name"] == "cuda.visible"] in (["ERROR"], ["FAIL"])
    benchmark_checks = [c for c in document["checks"] if c["name"] in load_profile("h100-sxm").checks]
    assert benchmark_checks and all(
        c["status"] == "SKIP" and "cuda.visible" in c["detail"] for c in benchmark_checks
    )


def test_cli_gpus_no_profile_knows_are_a_usage_error_naming_their_pci_ids(
    gpuval, assert_usage_error, tmp_path
):
    root = pci_tree(tmp_path / "root", EIGHT, device_id=0x2331)  # H100 PCIe: no built-in profile
    env = fake_node(root, init_error="NVMLError_DriverNotLoaded")
    proc = gpuval(["health", "--output", str(tmp_path / "out")], tmp_path, env=env, timeout=90)
    assert_usage_error(proc, "no built-in profile matches their PCI ids (8x 10de:2331)", "pass --profile")


@pytest.mark.dist
@pytest.mark.torch_version  # on the lowest torch too: the ranks' object gather
def test_health_under_torchrun_gathers_every_rank(tmp_path):
    from conftest import cli_env, run_cli

    torchrun = Path(sys.executable).with_name("torchrun")
    out = tmp_path / "out"
    proc = run_cli(
        ["health", "--output", str(out)],
        tmp_path,
        program=[str(torchrun), "--standalone", "--nproc_per_node=2", "-m", "gpuval"],
        env=cli_env(OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    document = _read(out)
    assert document["world"]["size"] == 2 and len(document["inventory"]["nodes"]) == 1
    sdc = sorted(c["scope"] for c in document["checks"] if c["name"] == "sdc.bitwise")
    assert [s.rsplit("/", 1)[1] for s in sdc] == ["0", "1"]  # one fingerprint per rank, compared at rank 0
    assert document["verdict"] == "PASS"


# --- what runs at the same time ------------------------------------------------------------------------


def test_a_waiting_family_runs_beside_the_others_and_the_checks_keep_their_order(monkeypatch):
    """The XID event window waits; the families after it must not wait for it. Here the waiting family
    passes only if a later family runs while it waits (run one after another, it would time out)."""
    import threading

    from gpuval.health import registry
    from gpuval.results import Check

    started = threading.Event()

    def waiter(ctx):
        ok = started.wait(timeout=20)
        return [Check(name="wait.window", status=Status.PASS if ok else Status.FAIL)]

    def worker(ctx):
        started.set()
        return [Check(name="work.done", status=Status.PASS)]

    families = {
        "first": registry.HealthCheck("first", "", lambda ctx: [Check(name="first.a", status=Status.PASS)]),
        "wait": registry.HealthCheck("wait", "", waiter, waits=True),
        "work": registry.HealthCheck("work", "", worker),
    }
    monkeypatch.setattr(registry, "all_checks", lambda: families)
    checks = registry.run_health(SimpleNamespace(node="n1"))
    assert [(c.name, c.status) for c in checks] == [
        ("first.a", Status.PASS),
        ("wait.window", Status.PASS),
        ("work.done", Status.PASS),
    ]


def test_each_gpu_computes_at_the_same_time_and_keeps_its_own_outcome():
    """Two GPUs' work meets at a barrier (run one after another, the barrier breaks); outcomes and
    exceptions come back in target order, each with its GPU's scope."""
    import threading

    meet = threading.Barrier(2, timeout=20)

    def work(scope, device):
        meet.wait()
        if device == "cuda:1":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return f"{scope} fine"

    outcomes = smoke.on_each_gpu([("gpu:n1/0", "cuda:0"), ("gpu:n1/1", "cuda:1")], work)
    assert outcomes[0] == ("gpu:n1/0", "gpu:n1/0 fine")
    assert outcomes[1][0] == "gpu:n1/1" and isinstance(outcomes[1][1], RuntimeError)

"""DCGM-exporter parity of `gpuval monitor --prometheus` (issue 22): the names, types, HELP and labels of
DCGM-exporter's default counters, units checked by hand, a value NVML does not give left out (never 0), one
GPU's NVML errors kept from the others, and the XID event thread.

Data: what the real recordings hold (tests/data/nvml/h100x1.json, h200x2.json: memory clock, energy, PCIe
replays, remapped rows, driver version) is replayed as recorded. Faults and hand-checkable units (memory
temperature, encoder/decoder, GPM, XID events, a failing call) are answered from
tests/data/nvml/synthetic-exporter.json, hand-made and saying so in its `_source`, whose round numbers make
the conversions checkable by hand. The last test replays the H100 recording tools/device/exporter_device.sh
made under a bf16 load (h100x1-load.json) and compares it with the scrape the exporter served beside it
(tests/data/exporter/h100x1-load-metrics.txt).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
import record_nvml
from nvml_replay import DATA, ExporterReplay, load, with_exporter_answers
from prometheus_client.parser import text_string_to_metric_families

from gpuval.monitor import xid_watch
from gpuval.monitor.dcgm_fields import GPU_METRICS
from gpuval.monitor.exporter import exposition, metrics
from gpuval.monitor.sample import Sampler
from gpuval.monitor.xid_watch import XidWatch
from gpuval.nvml import Nvml, Unavailable

DOCS = Path(__file__).resolve().parents[1] / "docs" / "monitor-metrics.md"
LOAD_RECORDING = DATA / "h100x1-load.json"  # tools/device/exporter_device.sh's nvml-load.json
LOAD_SCRAPE = DATA.parent / "exporter" / "h100x1-load-metrics.txt"  # its metrics-load.txt
PROF = [field.name for field in GPU_METRICS if field.name.startswith("DCGM_FI_PROF_")]
NEW_COUNTERS = (
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
)
# NVIDIA/dcgm-exporter etc/default-counters.csv (and dcp-metrics-included.csv for the commented-out
# profiling rows): name -> (type, HELP), as DCGM-exporter declares them.
DCGM_EXPORTER = {
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature (in C)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Total energy consumption since boot (in mJ)."),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries."),
    "DCGM_FI_DEV_ENC_UTIL": ("gauge", "Encoder utilization (in %)."),
    "DCGM_FI_DEV_DEC_UTIL": ("gauge", "Decoder utilization (in %)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for correctable errors"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_PROF_SM_ACTIVE": ("gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("gauge", "The ratio of number of warps resident on an SM."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    "DCGM_FI_PROF_DRAM_ACTIVE": (
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("gauge", "Ratio of cycles the fp64 pipes are active."),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("gauge", "Ratio of cycles the fp32 pipes are active."),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("gauge", "Ratio of cycles the fp16 pipes are active."),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads "
        "- in bytes per second.",
    ),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads "
        "- in bytes per second.",
    ),
}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The little of /proc the sampler reads besides NVML: the hostname the labels carry."""
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/hostname").write_text("gpu-node-07\n")
    return tmp_path


def exported(library: ExporterReplay, root: Path, readings: int = 2) -> tuple[str, dict[str, Any]]:
    """The exporter's text of the last of `readings` readings 2 s apart, and its families parsed back by
    prometheus_client's own parser."""
    sampler = Sampler(library, root, iter(range(0, 2 * readings, 2)).__next__)
    try:
        for _ in range(readings):
            reading = sampler.sample()
    finally:
        sampler.close()
    text = exposition(metrics(reading)).decode()
    return text, {family.name: family for family in text_string_to_metric_families(text)}


def by_gpu(families: dict[str, Any], name: str) -> dict[str, float]:
    return {sample.labels["gpu"]: sample.value for sample in families[name].samples}


def until(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


# --- what the real recordings hold --------------------------------------------------------------------------


def test_recorded_h100_answers_become_dcgm_counters_in_their_units(root):
    recording = load("h100x1")
    text, families = exported(ExporterReplay(recording), root)
    assert by_gpu(families, "DCGM_FI_DEV_MEM_CLOCK") == {"0": 2619}  # MHz, nvmlDeviceGetClockInfo(mem)
    assert by_gpu(families, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == {"0": 4067864}  # mJ, as NVML counts
    assert by_gpu(families, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER") == {"0": 0}
    for name in ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"):
        assert by_gpu(families, name) == {"0": 0}
    assert by_gpu(families, "DCGM_FI_DEV_ROW_REMAP_FAILURE") == {"0": 0}
    for name in NEW_COUNTERS:
        assert families[name].type == "counter", name
    labels = families["DCGM_FI_DEV_MEM_CLOCK"].samples[0].labels
    assert labels == {
        "gpu": "0",
        "UUID": recording["devices"][0]["nvmlDeviceGetUUID"],
        "pci_bus_id": "00000000:00:06.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "gpu-node-07",
        "DCGM_FI_DRIVER_VERSION": "580.159.04",
    }
    # Not in this recording (the replay answers FunctionNotFound, as NVML does for a call it lacks): left
    # out, never reported as 0.
    for name in ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_XID_ERRORS", *PROF):
        assert families[name].samples == [], name
        assert f"\n{name}{{" not in text


def test_remapped_rows_come_in_nvmls_order(root):
    """nvmlDeviceGetRemappedRows answers (correctable, uncorrectable, pending, failure)."""
    recording = load("h100x1")
    recording["devices"][0]["nvmlDeviceGetRemappedRows"] = [3, 1, 0, 1]
    _, families = exported(ExporterReplay(recording), root)
    assert by_gpu(families, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS") == {"0": 3}
    assert by_gpu(families, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS") == {"0": 1}
    assert by_gpu(families, "DCGM_FI_DEV_ROW_REMAP_FAILURE") == {"0": 1}


# --- the text format ----------------------------------------------------------------------------------------


def test_help_type_and_labels_are_dcgm_exporters_and_counters_keep_their_bare_name(root):
    text, families = exported(ExporterReplay(with_exporter_answers(load("h100x1"))), root)
    lines = text.splitlines()
    for name, (kind, help_text) in DCGM_EXPORTER.items():
        assert f"# HELP {name} {help_text}" in lines, name
        assert f"# TYPE {name} {kind}" in lines, name
        assert families[name].type == kind and families[name].samples, name
    for name in NEW_COUNTERS:  # prometheus_client's writer would have named them NAME_total
        assert f"{name}_total" not in text and sum(line.startswith(f"{name}{{") for line in lines) == 1
    prefix = (
        'gpu="0",UUID="GPU-beb0f669-6fb3-66ad-d389-26df51e5352f",pci_bus_id="00000000:00:06.0",device="nvidia0",'
        'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-07",DCGM_FI_DRIVER_VERSION="580.159.04"'
    )
    assert f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{prefix}}} 4067864" in lines  # "%d", as DCGM-exporter
    assert f'DCGM_FI_DEV_XID_ERRORS{{{prefix},err_code="0",err_msg="No Error"}} 0' in lines
    for line in lines:  # every other line is one sample: NAME{labels} VALUE
        assert line.startswith("# ") or re.fullmatch(r"[A-Za-z_:][\w:]*(\{[^{}]*\})? [-+0-9.e]+", line), line


# --- units by hand, from round numbers (synthetic-exporter.json, hand-made) ---------------------------------


def test_synthetic_answers_in_dcgm_units_by_hand(root):
    library = ExporterReplay(with_exporter_answers(load("h100x1")))
    _, first = exported(library, root, readings=1)
    assert all(first[name].samples == [] for name in PROF)  # GPM spans two readings: none on the first
    assert by_gpu(first, "DCGM_FI_DEV_MEMORY_TEMP") == {"0": 47}  # field 82, uiVal 47
    _, families = exported(library, root)
    assert by_gpu(families, "DCGM_FI_DEV_MEMORY_TEMP") == {"0": 47}  # C
    assert by_gpu(families, "DCGM_FI_DEV_ENC_UTIL") == {"0": 0}  # % of [util, sampling period]
    assert by_gpu(families, "DCGM_FI_DEV_DEC_UTIL") == {"0": 12}
    expected = {  # GPM answers: percent / 100, MiB/s x 2^20
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.96,  # 96.0 %
        "DCGM_FI_PROF_SM_ACTIVE": 0.375,  # 37.5 %
        "DCGM_FI_PROF_SM_OCCUPANCY": 0.125,  # 12.5 %
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.8125,  # 81.25 %
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.5,  # 50 %
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.0,
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.025,  # 2.5 %
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.0025,  # 0.25 %
        "DCGM_FI_PROF_PCIE_TX_BYTES": 1_572_864_000,  # 1500 MiB/s
        "DCGM_FI_PROF_PCIE_RX_BYTES": 524_288,  # 0.5 MiB/s
    }
    for name, value in expected.items():
        assert by_gpu(families, name) == {"0": pytest.approx(value, rel=1e-12)}, name
    # NVLink metrics NVML answered NotSupported one by one (no NVLink on this GPU): left out
    assert families["DCGM_FI_PROF_NVLINK_TX_BYTES"].samples == []
    assert families["DCGM_FI_PROF_NVLINK_RX_BYTES"].samples == []
    assert library.gpm_samples == set()  # every GPM sample taken was freed by close()


# --- omission and isolation ---------------------------------------------------------------------------------


def test_a_counter_a_gpu_does_not_support_is_left_out_for_that_gpu_not_zero(root):
    recording = with_exporter_answers(load("h200x2"))
    gpu1 = recording["devices"][1]
    gpu1["nvmlDeviceGetFieldValues(memory_temp)"][0]["nvmlReturn"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpu1["nvmlDeviceGetEncoderUtilization"] = {"error": "NVMLError_NotSupported"}
    gpu1["nvmlDeviceGetRemappedRows"] = {"error": "NVMLError_NotSupported"}  # as before Ampere
    gpu1["nvmlDeviceGetPcieReplayCounter"] = {"error": "NVMLError_NotSupported"}
    gpu1["nvmlGpmQueryDeviceSupport"]["isSupportedDevice"] = 0  # as before Hopper
    gpu1["nvmlDeviceRegisterEvents(xid_critical)"] = {"error": "NVMLError_NotSupported"}
    _, families = exported(ExporterReplay(recording), root)
    for name in (
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    ):
        assert set(by_gpu(families, name)) == {"0"}, name
    assert by_gpu(families, "DCGM_FI_DEV_DEC_UTIL") == {"0": 12, "1": 12}  # what GPU 1 does give stays
    assert by_gpu(families, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == {"0": 2436342, "1": 2394312}


def test_an_nvml_error_on_one_gpu_leaves_the_other_gpus_metrics_whole(root):
    healthy = with_exporter_answers(load("h200x2"))
    _, reference = exported(ExporterReplay(copy.deepcopy(healthy)), root)
    faulty = copy.deepcopy(healthy)
    gpu1 = faulty["devices"][1]
    for key in (
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetClockInfo(mem)",
        "nvmlDeviceGetFieldValues(memory_temp)",
        "nvmlDeviceGetEncoderUtilization",
        "nvmlDeviceGetDecoderUtilization",
        "nvmlGpmQueryDeviceSupport",
    ):
        gpu1[key] = {"error": "NVMLError_Unknown"}
    faulty["device_count"] = 3  # and a third GPU whose handle NVML cannot give (fell off the bus)
    _, families = exported(ExporterReplay(faulty), root)

    def gpu0(found: dict[str, Any]) -> dict[str, float]:
        values = {name: by_gpu(found, name) for name in found if name.startswith("DCGM_")}
        return {name: value["0"] for name, value in values.items() if "0" in value}

    assert gpu0(families) == gpu0(reference)  # GPU 0: every name, every value as without the faults
    assert len(gpu0(families)) >= 25
    for name in ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_PROF_SM_ACTIVE"):
        assert set(by_gpu(families, name)) == {"0"}, name
    assert by_gpu(families, "DCGM_FI_DEV_GPU_TEMP") == by_gpu(reference, "DCGM_FI_DEV_GPU_TEMP")
    assert all("2" not in by_gpu(families, field.name) for field in GPU_METRICS)  # the lost GPU: no sample


# --- the XID event thread -----------------------------------------------------------------------------------


def test_xid_thread_reports_an_injected_event_and_stops_within_its_timeout(root):
    recording = with_exporter_answers(load("h200x2"))
    recording["devices"][1]["nvmlDeviceGetIndex"] = {"error": "NVMLError_GpuIsLost"}  # XID 79's GPU: no index
    library = ExporterReplay(recording)
    nvml = Nvml(library)
    watch = XidWatch(nvml, nvml.handles(), wait_s=0.2)
    try:
        assert watch.running and (watch.last_xid(0), watch.last_xid(1)) == (0, 0)
        library.inject(1, 79)
        assert until(lambda: watch.last_xid(1) == 79)  # matched by its handle, since it has no index
        assert watch.last_xid(0) == 0
    finally:
        began = time.monotonic()
        assert watch.stop()
        stopped_s = time.monotonic() - began
    assert stopped_s <= 0.2 + 0.3, stopped_s  # one wait, at most
    assert not watch.running
    assert library.log.count("free") == 1 and library.log[-2:] == [
        "waited",
        "free",
    ]  # freed after the last wait


def test_an_xid_reaches_the_exporter_with_dcgm_exporters_labels(root):
    library = ExporterReplay(with_exporter_answers(load("h200x2")))
    sampler = Sampler(library, root, itertools.count(0, 2).__next__)
    try:
        sampler.sample()  # the first GPU reading starts the thread
        library.inject(1, 79)
        assert until(lambda: sampler.sample().gpus[1].last_xid == 79)
        families = {
            f.name: f for f in text_string_to_metric_families(exposition(metrics(sampler.sample())).decode())
        }
    finally:
        sampler.close()
    samples = {s.labels["gpu"]: s for s in families["DCGM_FI_DEV_XID_ERRORS"].samples}
    assert samples["1"].value == 79 and samples["0"].value == 0
    assert (samples["1"].labels["err_code"], samples["1"].labels["err_msg"]) == (
        "79",
        "GPU has fallen off the bus",
    )
    assert (samples["0"].labels["err_code"], samples["0"].labels["err_msg"]) == ("0", "No Error")


@pytest.mark.serial  # stop() within 0.55 s
def test_a_thread_stuck_inside_nvml_is_not_freed_under_and_stop_returns_in_time(monkeypatch):
    monkeypatch.setattr(xid_watch, "JOIN_MARGIN_S", 0.2)

    class Stuck(ExporterReplay):
        """An NVML whose wait ignores its timeout (a hung driver)."""

        release = threading.Event()

        def nvmlEventSetWait_v2(self, event_set, timeout_ms):  # noqa: N802 - pynvml's name
            self._note("wait")
            self.release.wait(10)
            raise pynvml.NVMLError_Timeout()

    library = Stuck(with_exporter_answers(load("h100x1")))
    nvml = Nvml(library)
    watch = XidWatch(nvml, nvml.handles(), wait_s=0.05)
    try:
        assert until(lambda: "wait" in library.log)
        began = time.monotonic()
        assert watch.stop() is False  # it says so, instead of hanging
        assert time.monotonic() - began <= 0.05 + 0.2 + 0.3
        assert "free" not in library.log  # the event set is not freed while NVML waits on it
    finally:
        Stuck.release.set()
    assert until(lambda: not watch.running)


def test_failed_waits_do_not_spin_and_refusals_leave_no_thread():
    class Failing(ExporterReplay):
        def nvmlEventSetWait_v2(self, event_set, timeout_ms):  # noqa: N802 - pynvml's name
            self._note("wait")
            raise pynvml.NVMLError_Unknown()

    library = Failing(with_exporter_answers(load("h100x1")))
    nvml = Nvml(library)
    watch = XidWatch(nvml, nvml.handles(), wait_s=0.1)
    time.sleep(0.35)
    assert watch.stop()
    assert library.log.count("wait") <= 5  # about one per 0.1 s, not thousands
    assert "NVMLError_Unknown" in watch.wait_error

    refused = load("h100x1")  # no recorded event API: nvmlEventSetCreate is FunctionNotFound
    nvml = Nvml(ExporterReplay(refused))
    watch = XidWatch(nvml, nvml.handles())
    assert not watch.running and isinstance(watch.last_xid(0), Unavailable)
    assert "nvmlEventSetCreate" in watch.last_xid(0).reason
    assert watch.stop()


# --- the recorder and the replay agree ----------------------------------------------------------------------


def test_what_record_nvml_writes_replays_to_the_same_exporter_text(root, monkeypatch):
    """The device script's recorder (tools/record_nvml.py), run against the replay, writes what the replay
    reads back: the exporter's text from the re-recorded answers equals the text from the originals."""
    source = with_exporter_answers(load("h200x2"))
    monkeypatch.setattr(record_nvml, "nv", ExporterReplay(copy.deepcopy(source)))
    rerecorded = copy.deepcopy(source)
    handles = [0, 1]
    for handle, device in zip(handles, rerecorded["devices"], strict=True):
        for key in [k for k in device if k.startswith(("nvmlDeviceGetFieldValues", "nvmlGpm", "gpm"))]:
            del device[key]  # recorded afresh below, from the replay of `source`
        device.update(record_nvml.record_monitor(handle))
        device["gpm"] = record_nvml.record_gpm(handle, 0.0)
    rerecorded["xid_events"], registered = record_nvml.record_xid_events(handles, wait_ms=10)
    for device, answer in zip(rerecorded["devices"], registered, strict=True):
        device["nvmlDeviceRegisterEvents(xid_critical)"] = answer
    rerecorded = json.loads(json.dumps(rerecorded, default=str))  # through JSON, as the file is written
    assert rerecorded["devices"][0]["nvmlDeviceGetFieldValues(memory_temp)"][0]["value"]["uiVal"] == 47
    assert rerecorded["xid_events"]["nvmlEventSetWait_v2(10)"]["error"] == "NVMLError_Timeout"
    original, _ = exported(ExporterReplay(source), root)
    replayed, _ = exported(ExporterReplay(rerecorded), root)
    assert replayed == original


# --- the documentation --------------------------------------------------------------------------------------


def test_the_metrics_page_lists_every_exported_name_with_its_type():
    rows = re.findall(r"^\| `(DCGM_FI_\w+)` \| (gauge|counter) \|", DOCS.read_text(), flags=re.MULTILINE)
    assert sorted(rows) == sorted((field.name, field.type) for field in GPU_METRICS)


# --- the H100 recording under load (tools/device/exporter_device.sh) ----------------------------------------


@pytest.mark.skipif(
    not LOAD_RECORDING.exists() or not LOAD_SCRAPE.exists(),
    reason="no H100 recording under load yet: tools/device/exporter_device.sh makes it (see its header)",
)
def test_h100_recording_under_load_replays_to_the_names_it_served(root):
    recording = load("h100x1-load")
    _, replayed = exported(ExporterReplay(recording), root)
    served = {f.name: f for f in text_string_to_metric_families(LOAD_SCRAPE.read_text())}

    def shape(families: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
        return {
            name: (family.type, sorted({key for sample in family.samples for key in sample.labels}))
            for name, family in families.items()
            if name.startswith("DCGM_") and family.samples
        }

    assert shape(replayed) == shape(served)  # the same names, types and label names on the GPU as replayed
    recorded = {m["metricId"]: m for m in recording["devices"][0]["gpm"]["nvmlGpmMetricsGet"]["metrics"]}
    assert by_gpu(replayed, "DCGM_FI_PROF_SM_ACTIVE") == {"0": pytest.approx(recorded[2]["value"] / 100)}
    assert by_gpu(replayed, "DCGM_FI_PROF_PCIE_TX_BYTES") == {
        "0": pytest.approx(recorded[20]["value"] * 2**20)
    }
    assert by_gpu(served, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")["0"] > 0  # the bf16 matmul load shows

"""The NVML layer against answers recorded on a lent 2xH200 machine (tests/data/nvml/h200x2.json)."""

from __future__ import annotations

import pytest
from nvml_replay import ReplayNvml, load

from gpuval.nvml import Nvml, Unavailable, available, snapshot


@pytest.fixture
def h200():
    return load("h200x2")


def test_snapshot_reads_the_recorded_machine(h200):
    snap = snapshot(ReplayNvml(h200))
    assert snap.ok
    assert snap.driver_version == "580.159.04"
    assert snap.cuda_driver_version == "13.0"  # 13000 from NVML
    assert [gpu.name for gpu in snap.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    gpu = snap.gpus[0]
    assert gpu.pci_bus_id == "00000000:00:06.0"
    assert gpu.memory_total_bytes == 150754820096
    assert gpu.compute_capability == "9.0"
    assert gpu.power_limit_w == pytest.approx(700.0)  # NVML answers milliwatts
    assert (gpu.pcie_gen_current, gpu.pcie_gen_max, gpu.pcie_width_current, gpu.pcie_width_max) == (
        5,
        5,
        16,
        16,
    )
    assert gpu.ecc_mode_current == 1 and gpu.ecc_uncorrected_volatile == 0
    assert gpu.clock_reasons() == ["gpu_idle"]
    assert len(gpu.nvlinks) == 18 and all(link.up and link.remote == "switch" for link in gpu.nvlinks)


def test_topology_matches_nvidia_smi_topo(h200):
    # The recording's own `nvidia-smi topo -m` shows GPU0-GPU1 as NV18 (18 links through NVSwitch).
    assert "NV18" in h200["nvidia-smi topo -m"]
    snap = snapshot(ReplayNvml(h200))
    assert snap.gpus[0].topology == {1: "NV18"}
    assert snap.gpus[1].topology == {0: "NV18"}


def test_without_nvlink_the_pcie_level_is_shown(h200):
    for device in h200["devices"]:
        device["p2p_status_nvlink"] = {key: 4 for key in device["p2p_status_nvlink"]}  # not supported
        for link in device["nvlinks"]:
            link["state"] = {"error": "NVMLError_NotSupported"}
    snap = snapshot(ReplayNvml(h200))
    assert snap.gpus[0].topology == {1: "PHB"}  # common ancestor 30 = host bridge
    assert snap.gpus[0].nvlinks == []


def test_unsupported_field_is_unavailable_with_its_reason(h200):
    snap = snapshot(ReplayNvml(h200))
    pages = snap.gpus[0].retired_pages_dbe  # H200 retires rows, not pages: NVML says NotSupported
    assert not available(pages)
    assert "NotSupported" in pages.reason
    assert snap.gpus[0].to_json()["retired_pages_dbe"] is None
    assert "NotSupported" in snap.gpus[0].to_json()["unavailable"]["retired_pages_dbe"]


def test_no_driver_gives_an_error_not_an_exception(h200):
    snap = snapshot(ReplayNvml(h200, init_error="NVMLError_LibraryNotFound"))
    assert not snap.ok and snap.gpus == []
    assert "LibraryNotFound" in snap.error


def test_a_lost_gpu_stays_in_the_list_with_the_reason(h200):
    h200["device_count"] = 3  # the driver counts a third GPU whose handle cannot be had
    snap = snapshot(ReplayNvml(h200))
    assert len(snap.gpus) == 3
    assert "GpuIsLost" in snap.gpus[2].name.reason


def test_query_of_a_broken_field_never_raises(h200):
    h200["devices"][0]["nvmlDeviceGetTemperature(gpu)"] = {"error": "NVMLError_GpuIsLost"}
    nvml = Nvml(ReplayNvml(h200))
    value = nvml("nvmlDeviceGetTemperature", 0, 0)
    assert isinstance(value, Unavailable) and "GpuIsLost" in value.reason
    assert isinstance(nvml("nvmlDeviceGetSomethingNew", 0), Unavailable)
    assert not Unavailable("x") and repr(Unavailable("x")) == "N/A (x)"


def test_a_gpu_that_answers_its_handle_but_not_its_name_keeps_the_rest_readable(h200):
    h200["devices"][1]["nvmlDeviceGetName"] = {"error": "NVMLError_GpuIsLost"}
    snap = snapshot(ReplayNvml(h200))
    assert "GpuIsLost" in snap.gpus[1].name.reason
    assert snap.gpus[0].name == "NVIDIA H200"
    assert snap.gpus[0].topology == {}  # its only peer cannot be placed

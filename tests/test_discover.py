"""`gpuval discover`: sysfs/procfs parsing on a fake tree (tests/data/sysfs), the inventory and its
rendering against NVML answers recorded on a 2xH200 and a 1xH100 machine, and the CLI on this machine
(no driver).
"""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from nvml_replay import ReplayNvml, load
from rich.console import Console

from gpuval.discover import node_inventory
from gpuval.discover.host import host_info, parse_cpulist
from gpuval.discover.network import infiniband_ports
from gpuval.discover.scheduler import scheduler_context
from gpuval.discover.software import software_versions, torch_build, version_text
from gpuval.discover.storage import mounts, shown_to_people
from gpuval.discover.topology import gpu_affinity, sysfs_pci_address
from gpuval.nvml import Nvml, snapshot
from gpuval.report.inventory import paste_block, print_inventory

FAKE_ROOT = Path(__file__).parent / "data" / "sysfs"
GIB = 2**30


# --- host, network, storage, scheduler from the fake tree -----------------------------------------


def test_host_from_the_fake_tree():
    assert host_info(FAKE_ROOT) == {
        "hostname": "gpu-node-07",
        "os": "Ubuntu 22.04.4 LTS",
        "kernel": "5.15.0-105-generic",
        "architecture": None,  # not in a file: only reported for the real root
        "cpu": {"model": "Intel(R) Xeon(R) Platinum 8480+", "sockets": 2, "cores": 4, "threads": 8},
        "cpus_allowed": 4,
        "numa_nodes": [
            {"node": 0, "cpulist": "0-1,4-5", "cpus": 4, "memory_total_bytes": 1056794624 * 1024},
            {"node": 1, "cpulist": "2-3,6-7", "cpus": 4, "memory_total_bytes": 1056794624 * 1024},
        ],
        "memory_total_bytes": 2113589248 * 1024,
    }


def test_an_empty_root_gives_nones_not_exceptions(tmp_path):
    host = host_info(tmp_path)
    assert host["cpu"] == {"model": None, "sockets": None, "cores": None, "threads": None}
    assert (host["numa_nodes"], host["memory_total_bytes"], host["os"]) == ([], None, None)
    assert infiniband_ports(tmp_path) == [] and mounts(tmp_path) == []


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8-9", [0, 1, 2, 3, 8, 9]), ("5", [5]), ("", []), (None, []), ("0-1,\n", [0, 1])],
)
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


def test_arm_cpu_is_named_from_implementer_and_part(tmp_path):
    # Grace's /proc/cpuinfo has no model name, physical id or core id: those come from sysfs topology
    (tmp_path / "proc").mkdir()
    block = "processor\t: {n}\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n"
    (tmp_path / "proc/cpuinfo").write_text("\n".join(block.format(n=n) for n in range(4)))
    for cpu in range(4):
        topology = tmp_path / f"sys/devices/system/cpu/cpu{cpu}/topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text("0\n")
        (topology / "core_id").write_text(f"{cpu}\n")
    assert host_info(tmp_path)["cpu"] == {"model": "Neoverse-V2", "sockets": 1, "cores": 4, "threads": 4}


def test_infiniband_ports_from_sysfs():
    assert infiniband_ports(FAKE_ROOT) == [
        {
            "hca": "mlx5_0",
            "port": 1,
            "state": "ACTIVE",
            "phys_state": "LinkUp",
            "rate_gbps": 400.0,
            "rate": "400 Gb/sec (4X NDR)",
            "link_layer": "InfiniBand",
            "netdevs": ["ib0"],
            "firmware": "28.39.1002",
        },
        {
            "hca": "mlx5_1",
            "port": 1,
            "state": "DOWN",
            "phys_state": "Disabled",
            "rate_gbps": 10.0,
            "rate": "10 Gb/sec (4X SDR)",
            "link_layer": "InfiniBand",
            "netdevs": [],
            "firmware": "28.39.1002",
        },
    ]


def test_mounts_flag_shared_file_systems_and_drop_kernel_ones():
    found = mounts(FAKE_ROOT)
    by_point = {m["mount_point"]: m for m in found}
    # proc, sysfs and cgroup2 are kernel interfaces, not storage
    assert list(by_point) == ["/", "/mnt/local scratch", "/etc/hosts", "/home", "/lustre/scratch", "/dev/shm"]
    assert by_point["/home"] == {
        "device": "10.0.0.5:/export/home",
        "mount_point": "/home",
        "fs_type": "nfs4",
        "shared": True,
        "read_only": False,
    }
    assert by_point["/lustre/scratch"]["shared"] and by_point["/lustre/scratch"]["read_only"]
    assert [m["mount_point"] for m in found if m["shared"]] == ["/home", "/lustre/scratch"]
    assert by_point["/mnt/local scratch"]["fs_type"] == "xfs"  # '\040' in /proc/mounts is a space
    # /dev/shm is mounted twice: the later one (a container's 64 MiB) is the one processes see
    assert by_point["/dev/shm"] == {
        "device": "shm",
        "mount_point": "/dev/shm",
        "fs_type": "tmpfs",
        "shared": False,
        "read_only": False,
        "size_bytes": 64 * 2**20,
    }
    shown = [m["mount_point"] for m in found if shown_to_people(m)]
    assert shown == ["/", "/mnt/local scratch", "/home", "/lustre/scratch", "/dev/shm"]  # not /etc/hosts


SLURM_ENV = {
    "SLURM_JOB_ID": "81423",
    "SLURM_JOB_NAME": "bringup",
    "SLURM_JOB_PARTITION": "h200",
    "SLURM_JOB_NODELIST": "gpu-node-[07-08]",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS": "16",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "3",
    "SLURM_STEP_ID": "0",
    "SLURMD_NODENAME": "gpu-node-07",
    "SLURM_GPUS_ON_NODE": "8",
    "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
    "CUDA_VISIBLE_DEVICES": "3",
    "HOME": "/home/alice",
}


def test_slurm_context_from_the_environment():
    context = scheduler_context(SLURM_ENV, FAKE_ROOT)
    assert context == {
        "launcher": "slurm",
        "slurm": {
            "job_id": 81423,
            "job_name": "bringup",
            "partition": "h200",
            "job_nodelist": "gpu-node-[07-08]",
            "nnodes": 2,
            "ntasks": 16,
            "step_id": 0,
            "procid": 3,
            "localid": 3,
            "nodename": "gpu-node-07",
            "gpus_on_node": 8,
            "job_gpus": "0,1,2,3,4,5,6,7",
        },
        "kubernetes": None,
        "torchrun": None,
        "visible_devices": {"CUDA_VISIBLE_DEVICES": "3"},
    }


def test_kubernetes_pod_under_torchrun():
    env = {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "HOSTNAME": "bringup-worker-1",
        "RANK": "9",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "bringup-master-0",
        "MASTER_PORT": "29500",
    }
    context = scheduler_context(env, FAKE_ROOT)
    assert context["launcher"] == "torchrun" and context["slurm"] is None
    assert context["kubernetes"] == {"pod": "bringup-worker-1", "namespace": "ml-team", "node": None}
    assert context["torchrun"] == {
        "rank": 9,
        "world_size": 16,
        "local_rank": 1,
        "master_addr": "bringup-master-0",
        "master_port": 29500,
    }
    assert scheduler_context({}, FAKE_ROOT) == {
        "launcher": "single",
        "slurm": None,
        "kubernetes": None,
        "torchrun": None,
        "visible_devices": {},
    }


# --- software and GPU affinity ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "text"),
    [
        ((2, 21, 5), "2.21.5"),
        (21905, "2.19.5"),
        (2708, "2.7.8"),
        (90100, "9.1.0"),
        (8907, "8.9.7"),
        (None, None),
    ],
)
def test_library_version_codes(code, text):
    assert version_text(code) == text


def test_software_versions_with_a_driver_and_cpu_torch():
    versions = software_versions(snapshot(ReplayNvml(load("h200x2"))))
    assert (versions["driver_version"], versions["cuda_driver_version"]) == ("580.159.04", "13.0")
    assert versions["nvml_version"] == "13.580.159.04"
    assert versions["torch"] == torch.__version__
    assert versions["cuda_runtime"] == torch.version.cuda
    if torch.version.cuda is None:  # the CPU build CI runs: no CUDA libraries to report, and no crash
        assert (versions["nccl"], versions["cudnn"]) == (None, None)


def test_torch_build_is_read_without_importing_torch(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")  # as in a fresh `gpuval discover` process
    build = torch_build()
    assert (build["__version__"], build["cuda"]) == (torch.__version__, torch.version.cuda)


def test_sysfs_pci_address():
    assert sysfs_pci_address("00000000:00:06.0") == "0000:00:06.0"
    assert sysfs_pci_address("00000001:1B:00.0") == "0001:1b:00.0"
    assert sysfs_pci_address("garbage") is None


def test_gpu_affinity_from_the_pci_device():
    nodes = host_info(FAKE_ROOT)["numa_nodes"]
    assert gpu_affinity("00000000:00:06.0", nodes, FAKE_ROOT) == {
        "numa_affinity": 1,
        "cpu_affinity": "2-3,6-7",
    }
    # no sysfs entry on a two-node host: unknown, not guessed
    assert gpu_affinity("00000000:00:07.0", nodes, FAKE_ROOT) == {"numa_affinity": None, "cpu_affinity": None}
    # one NUMA node: that node and its CPUs, whatever sysfs says (VMs report -1)
    single = [{"node": 0, "cpulist": "0-31", "cpus": 32, "memory_total_bytes": None}]
    assert gpu_affinity("00000000:00:07.0", single, FAKE_ROOT) == {"numa_affinity": 0, "cpu_affinity": "0-31"}


# --- the recorded machines (2xH200, 1xH100) ---------------------------------------------------------


def recorded_host_root(tmp_path: Path, host: dict) -> Path:
    """A /proc and /sys holding only what the recording kept of its host: mounts, memory, one NUMA node."""
    assert host["numa_nodes"] == ["node0"]
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/mounts").write_text(host["mounts"])
    (tmp_path / "proc/meminfo").write_text("\n".join(host["meminfo_head"]) + "\n")
    node0 = tmp_path / "sys/devices/system/node/node0"
    node0.mkdir(parents=True)
    (node0 / "cpulist").write_text(f"0-{host['cpu_count'] - 1}\n")  # the only node holds every CPU
    return tmp_path


def parse_topo_m(text: str) -> dict[str, dict[str, str]]:
    """`nvidia-smi topo -m` text -> {row: {column: cell}}; empty cells (tab padding) are dropped."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [line for line in text.splitlines() if line.strip()]
    header = [cell.strip() for cell in lines[0].split("\t") if cell.strip()]
    table = {}
    for line in lines[1:]:
        if not line.startswith("GPU"):
            break
        cells = [cell.strip() for cell in line.split("\t") if cell.strip()]
        table[cells[0]] = dict(zip(header, cells[1:], strict=True))
    return table


@pytest.fixture
def h200():
    return load("h200x2")


@pytest.fixture
def h200_inventory(h200, tmp_path):
    root = recorded_host_root(tmp_path, h200["host"])
    return node_inventory("h200-vm", ReplayNvml(h200), root, environ={})


def _render(inventory: dict) -> str:
    console = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    print_inventory(inventory, console)
    return console.export_text()


def test_inventory_of_the_recorded_machine(h200_inventory):
    inv = h200_inventory
    assert (inv["node"], inv["nvml_error"], inv["gpu_source"], inv["gpu_count"]) == (
        "h200-vm",
        None,
        "nvml",
        2,
    )
    # the keys gpuval accept's expect checks read
    assert [(g["index"], g["name"], g["memory_total_bytes"]) for g in inv["gpus"]] == [
        (0, "NVIDIA H200", 150754820096),
        (1, "NVIDIA H200", 150754820096),
    ]
    gpu = inv["gpus"][0]
    assert (gpu["pci_bus_id"], gpu["vbios_version"], gpu["uuid"]) == (
        "00000000:00:06.0",
        "96.00.A5.00.1A",
        "GPU-247420ef-5061-c4d8-5cb1-c933f0299a49",
    )
    for gpu in inv["gpus"]:
        assert gpu["nvlink"] == {"up": 18, "total": 18, "version": "4.0"}  # NVML_NVLINK_VERSION_4_0 = 6
        assert (gpu["pcie_gen_current"], gpu["pcie_width_current"]) == (5, 16)
        assert (gpu["pcie_gen_max"], gpu["pcie_width_max"]) == (5, 16)
    assert inv["software"]["driver_version"] == "580.159.04"
    assert inv["host"]["memory_total_bytes"] == 263998500 * 1024
    assert [m["mount_point"] for m in inv["mounts"] if shown_to_people(m)] == ["/", "/dev/shm"]
    assert inv["infiniband"] == [] and inv["gpus_lost"] == []
    json.dumps(inv)  # plain JSON all the way down (no Unavailable, no tuples of objects)


def test_inventory_of_the_recorded_h100(tmp_path):
    h100 = load("h100x1")
    # one H100 SXM passed through to a VM alone: NVML answers NotSupported for every NVLink index
    assert {json.dumps(link) for link in h100["devices"][0]["nvlinks"]} == {
        '{"state": {"error": "NVMLError_NotSupported", "message": "Not Supported"}}'
    }
    inv = node_inventory("h100-vm", ReplayNvml(h100), recorded_host_root(tmp_path, h100["host"]), environ={})
    assert (inv["nvml_error"], inv["gpu_source"], inv["gpu_count"], inv["gpus_lost"]) == (None, "nvml", 1, [])
    (gpu,) = inv["gpus"]
    assert (gpu["name"], gpu["memory_total_bytes"], gpu["pci_bus_id"], gpu["vbios_version"], gpu["uuid"]) == (
        "NVIDIA H100 80GB HBM3",
        85520809984,  # 81559 MiB, nvidia-smi's "FB Memory Usage Total"
        "00000000:00:06.0",
        "96.00.CF.00.01",
        "GPU-beb0f669-6fb3-66ad-d389-26df51e5352f",
    )
    assert (
        gpu["pcie_gen_current"],
        gpu["pcie_width_current"],
        gpu["pcie_gen_max"],
        gpu["pcie_width_max"],
    ) == (
        5,
        16,
        5,
        16,
    )
    assert (gpu["ecc_mode_current"], gpu["power_limit_w"], gpu["max_sm_clock_mhz"]) == (1, 700.0, 1980)
    assert gpu["nvlinks"] == [] and gpu["nvlink"] == {"up": 0, "total": 0, "version": None}
    assert (inv["software"]["driver_version"], inv["software"]["cuda_driver_version"]) == (
        "580.159.04",
        "13.0",
    )
    assert inv["host"]["memory_total_bytes"] == 131981020 * 1024
    text = _render(inv)
    for fragment in (
        "NVIDIA H100 80GB HBM3",
        "79.6 GiB",
        "96.00.CF.00.01",
        "1980/2619 MHz",
        "Gen5 x16 / Gen5 x16",
    ):
        assert fragment in text, fragment
    assert re.search(r"GPU0\s*│\s*X\s*│\s*0-15\s*│\s*0\s*│\s*N/A\s*│\s*none", text), text
    block = paste_block(inv)
    assert "- GPUs: 1x NVIDIA H100 80GB HBM3 79.6 GiB" in block
    assert "PCIe Gen5 x16/Gen5 x16 NVLink none NUMA 0" in block


@pytest.mark.parametrize(
    "stem, links, cpus",
    [
        ("h200x2", {"GPU0": {"GPU0": "X", "GPU1": "NV18"}, "GPU1": {"GPU0": "NV18", "GPU1": "X"}}, "0-31"),
        ("h100x1", {"GPU0": {"GPU0": "X"}}, "0-15"),
        (
            "h200x4",
            {f"GPU{i}": {f"GPU{j}": "X" if i == j else "NV18" for j in range(4)} for i in range(4)},
            "0-63",
        ),
    ],
)
def test_topology_equals_the_recorded_nvidia_smi_topo(stem, links, cpus, tmp_path):
    recording = load(stem)
    recorded = parse_topo_m(recording["nvidia-smi topo -m"])
    assert {row: {col: cells[col] for col in links} for row, cells in recorded.items()} == links
    inventory = node_inventory(
        stem, ReplayNvml(recording), recorded_host_root(tmp_path, recording["host"]), environ={}
    )
    topology = inventory["topology"]
    labels = [f"GPU{i}" for i in topology["gpus"]]
    ours = {
        row: dict(zip(labels, cells, strict=True))
        for row, cells in zip(labels, topology["matrix"], strict=True)
    }
    assert ours == links
    for gpu in inventory["gpus"]:
        row = recorded[f"GPU{gpu['index']}"]
        assert gpu["cpu_affinity"] == row["CPU Affinity"] == cpus
        assert str(gpu["numa_affinity"]) == row["NUMA Affinity"] == "0"
        assert gpu["numa_node"] is None and row["GPU NUMA ID"] == "N/A"


def test_rendered_tables_show_the_recorded_machine(h200_inventory):
    text = _render(h200_inventory)
    for fragment in (
        "GPUs · driver 580.159.04 · CUDA 13.0",
        "NVIDIA H200",
        "00000000:00:07.0",
        "140.4 GiB",
        "96.00.A5.00.1A",
        "700 W",
        "1980/3201 MHz",
        "Gen5 x16 / Gen5 x16",
    ):
        assert fragment in text, fragment
    # the topology rows as nvidia-smi topo -m lays them out, with affinity and the NVLink count after
    assert re.search(
        r"GPU0\s*│\s*X\s*│\s*NV18\s*│\s*0-31\s*│\s*0\s*│\s*N/A\s*│\s*18/18 up \(v4\.0\)", text
    ), text
    assert re.search(r"GPU1\s*│\s*NV18\s*│\s*X\s*│\s*0-31", text), text
    assert "no NVIDIA driver" not in text


def test_paste_block(h200_inventory):
    block = paste_block(h200_inventory)
    lines = block.splitlines()
    assert 15 <= len(lines) <= 40, block
    assert "driver 580.159.04 · CUDA driver 13.0" in block
    assert "- GPUs: 2x NVIDIA H200 140.4 GiB" in block
    assert re.search(r"^ +GPU0 +GPU1$", block, re.MULTILINE), block  # header row
    assert re.search(r"^  GPU0 +X +NV18$", block, re.MULTILINE), block
    assert re.search(r"^  GPU1 +NV18 +X$", block, re.MULTILINE), block
    assert "PCIe Gen5 x16/Gen5 x16 NVLink 18/18 up (v4.0) NUMA 0" in block
    assert not re.search(r"[┃│┏━]", block)  # plain text survives any issue tracker


def test_faulty_machine_shows_in_the_inventory(h200, tmp_path):
    h200["devices"][1]["nvlinks"][5]["state"] = 0  # one NVLink down
    h200["devices"][1]["nvmlDeviceGetCurrPcieLinkWidth"] = 8  # a degraded PCIe link
    h200["device_count"] = 3  # the driver counts a GPU whose handle it cannot get
    inv = node_inventory("bad", ReplayNvml(h200), recorded_host_root(tmp_path, h200["host"]), environ={})
    assert inv["gpu_count"] == 2  # what can run work; the lost one is listed apart, with why
    assert [lost["index"] for lost in inv["gpus_lost"]] == [2] and "GpuIsLost" in inv["gpus_lost"][0][
        "reason"
    ]
    assert inv["gpus"][1]["nvlink"] == {"up": 17, "total": 18, "version": "4.0"}
    text = _render(inv)
    assert "17/18 up" in text and "Gen5 x8 / Gen5 x16" in text and "unreachable" in text
    assert "GPU2 unreachable" in paste_block(inv)


def test_recorded_machine_on_the_fake_tree_with_slurm(h200):
    inv = node_inventory(None, ReplayNvml(h200), FAKE_ROOT, environ=SLURM_ENV)
    assert inv["node"] == "gpu-node-07"  # SLURMD_NODENAME, as gpuval accept names nodes
    # GPU0's PCI device sits on NUMA node 1 in the fake tree; GPU1 has no sysfs entry there
    assert [(g["numa_affinity"], g["cpu_affinity"]) for g in inv["gpus"]] == [(1, "2-3,6-7"), (None, None)]
    block = paste_block(inv)
    assert "mlx5_0/1 ACTIVE 400.0 Gb/s InfiniBand (ib0); mlx5_1/1 DOWN 10.0 Gb/s InfiniBand" in block
    assert "/home nfs4 (10.0.0.5:/export/home); /lustre/scratch lustre (10.0.1.10@o2ib:/scratch)" in block
    assert "- /dev/shm: 64 MiB" in block  # a container's default: too small for NCCL's shared memory
    assert (
        "- scheduler: Slurm job 81423 · name bringup · partition h200 · nodes 2 · gpu-node-[07-08] · step 0"
        " · task 3 of 16 · local task 3 · on gpu-node-07 · GPUs on node 8 · job GPUs 0,1,2,3,4,5,6,7"
        " | CUDA_VISIBLE_DEVICES='3'"
    ) in block
    text = _render(inv)
    assert re.search(r"mlx5_0\s*│\s*1\s*│\s*ACTIVE\s*│\s*LinkUp\s*│\s*400 Gb/sec \(4X NDR\)", text), text
    assert re.search(r"/lustre/scratch\s*│\s*lustre\s*│\s*shared", text), text


def test_a_gpu_whose_name_nvml_cannot_read_never_crashes_discover(h200, tmp_path):
    h200["devices"][1]["nvmlDeviceGetName"] = {"error": "NVMLError_GpuIsLost"}
    inv = node_inventory("n", ReplayNvml(h200), recorded_host_root(tmp_path, h200["host"]), environ={})
    assert inv["nvml_status"] == "error" or [lost["index"] for lost in inv["gpus_lost"]] == [1]
    assert "NVIDIA driver" not in _render(inv)  # the driver is there: the problem is NVML's answer
    assert "NVML could not list the GPUs" in _render(inv) or "unreachable" in _render(inv)


# --- no driver --------------------------------------------------------------------------------------


def test_no_driver_inventory_keeps_the_host_part(h200):
    inv = node_inventory("n", ReplayNvml(h200, init_error="NVMLError_LibraryNotFound"), FAKE_ROOT, environ={})
    assert inv["nvml_status"] == "no_driver" and "LibraryNotFound" in inv["nvml_error"]
    assert inv["host"]["cpu"]["sockets"] == 2 and len(inv["infiniband"]) == 2
    if not torch.cuda.is_available():
        assert (inv["gpu_count"], inv["gpus"], inv["gpu_source"]) == (0, [], None)
    assert inv["topology"] == {"gpus": [], "matrix": []}
    text = _render(inv)
    assert [line for line in text.splitlines() if "NVIDIA driver" in line] == [
        f"no NVIDIA driver: {inv['nvml_error']}"
    ]
    assert "GPUs ·" not in text and "topology" not in text
    assert "- no NVIDIA driver: NVMLError_LibraryNotFound" in paste_block(inv)


def test_gpus_on_the_pci_bus_show_without_a_driver(h200, tmp_path):
    """The hardware's own count, where NVML cannot start: 2 H200 (3D controllers) beside an NVSwitch."""
    for address, pci_class, device in (
        ("0000:18:00.0", "0x030200", "0x2335"),
        ("0000:2a:00.0", "0x030200", "0x2335"),
        ("0000:05:00.0", "0x068000", "0x22a3"),
    ):
        folder = tmp_path / "sys/bus/pci/devices" / address
        folder.mkdir(parents=True)
        for name, value in (("vendor", "0x10de"), ("class", pci_class), ("device", device)):
            (folder / name).write_text(value + "\n")
    library = ReplayNvml(h200, init_error="NVMLError_DriverNotLoaded")
    inv = node_inventory("n", library, tmp_path, environ={})
    assert [gpu["address"] for gpu in inv["pci_gpus"]] == ["0000:18:00.0", "0000:2a:00.0"]
    assert "PCI bus: 2 NVIDIA GPUs (2x 10de:2335)" in _render(inv)
    assert "- PCI bus: 2 NVIDIA GPUs (2x 10de:2335)" in paste_block(inv)
    no_gpu = node_inventory("n", library, FAKE_ROOT, environ={})
    assert no_gpu["pci_gpus"] == [] and "- PCI bus: no NVIDIA GPU" in paste_block(no_gpu)


needs_no_driver = pytest.mark.skipif(Nvml().error is None, reason="this machine has an NVIDIA driver")


@needs_no_driver
def test_cli_discover_without_a_driver(gpuval, tmp_path):
    proc = gpuval(["discover"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "no NVIDIA driver: " in proc.stdout
    assert "node " in proc.stdout and "storage" in proc.stdout


@needs_no_driver
def test_cli_discover_json_and_output_file(gpuval, tmp_path):
    target = tmp_path / "out" / "inventory.json"
    proc = gpuval(["discover", "--json", "--output", str(target)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert json.loads(target.read_text()) == printed
    assert printed["schema"] == "gpuval.inventory/v1"
    assert printed["nvml_error"] and printed["gpu_count"] == 0 and printed["gpus"] == []
    assert printed["host"]["memory_total_bytes"] > 0
    assert printed["scheduler"]["slurm"] is None  # the test's clean environment has no launcher


def test_cli_discover_output_that_cannot_be_written(gpuval, assert_usage_error, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = gpuval(["discover", "--output", str(blocker / "inventory.json")], tmp_path)
    assert_usage_error(proc, str(blocker))
    assert proc.stdout == ""
    proc = gpuval(["discover", "--output", str(tmp_path)], tmp_path)
    assert_usage_error(proc, "is a directory")


def test_the_communication_line_names_the_deploy_env_file_not_a_profile():
    """GPUVAL_ENV_PROFILE is the deploy/env/ file sourced: 'no gpuval profile' read as accept's profile."""
    from gpuval.discover.software import communication_env
    from gpuval.report.inventory import communication_line

    sourced = {"communication": communication_env({"GPUVAL_ENV_PROFILE": "hgx-ib", "NCCL_IB_HCA": "mlx5"})}
    assert communication_line(sourced) == "deploy/env/hgx-ib.env · NCCL_IB_HCA=mlx5"
    bare = {"communication": communication_env({})}
    assert communication_line(bare) == "no deploy/env/ file · no NCCL/gloo/torch.distributed variable set"

"""Only the GPUs a job was given are judged (issue 51, point 1): CUDA_VISIBLE_DEVICES (indices, UUIDs, MIG
instances), SLURM_STEP_GPUS / SLURM_JOB_GPUS and NVIDIA_VISIBLE_DEVICES name them; the node's other GPUs are
listed as not this job's, never FAILed and never PASSed on their behalf. Health runs on the recorded NVML
answers of a 4×H200 node (tests/data/nvml/h200x4.json), CUDA's view handed in as accept hands its ranks'."""

from __future__ import annotations

import pytest
from nvml_replay import ReplayNvml, load

from gpuval.config import load_profile
from gpuval.health.cuda import CudaDevice, CudaView
from gpuval.health.job import given, job_gpus
from gpuval.health.run import node_health
from gpuval.nvml import GpuInfo
from gpuval.results import Status

NODE = "n1"


@pytest.fixture
def h200x4():
    return load("h200x4")


def _gpus(recording) -> list[GpuInfo]:
    return [
        GpuInfo(index=i, uuid=d["nvmlDeviceGetUUID"], pci_bus_id="x")
        for i, d in enumerate(recording["devices"])
    ]


def _view(recording, indices, spec=None, **fields) -> CudaView:
    """What CUDA shows a process that can use the recorded GPUs `indices`, given its GPUs by `spec`."""
    devices = tuple(CudaDevice(recording["devices"][i]["nvmlDeviceGetUUID"], None) for i in indices)
    return CudaView(devices=devices, given=spec, **fields)


def _health(recording, views, gpus, sets=()):
    profile = load_profile("h200-sxm", [f"expect.gpu_count={gpus}", "expect.nvlinks_per_gpu=null", *sets])
    return node_health(profile, NODE, library=ReplayNvml(recording), cuda=views, kmsg=None)


def _bad(checks):
    return [(c.name, c.status, c.scope) for c in checks if c.status in (Status.FAIL, Status.ERROR)]


def _one(checks, name):
    (check,) = [c for c in checks if c.name == name]
    return check


# --- which variable names the GPUs ---------------------------------------------------------------------


def test_the_first_variable_set_names_the_gpus_in_cudas_and_the_launchers_order():
    assert given({}) is None
    assert given({"SLURM_JOB_GPUS": "4,5", "SLURM_STEP_GPUS": "5"}) == ("SLURM_STEP_GPUS", "5")
    assert given({"SLURM_JOB_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "0"}) == ("CUDA_VISIBLE_DEVICES", "0")
    assert given({"NVIDIA_VISIBLE_DEVICES": " all "}) == ("NVIDIA_VISIBLE_DEVICES", "all")
    assert given({"SLURM_JOB_GPUS": "4,5"}) == ("SLURM_JOB_GPUS", "4,5")


def test_indices_uuids_their_prefixes_and_mig_instances_name_nvmls_gpus(h200x4):
    gpus = _gpus(h200x4)
    uuid = [str(g.uuid) for g in gpus]
    cvd = "CUDA_VISIBLE_DEVICES"
    assert job_gpus([(cvd, "0,1")], gpus).indices == {0, 1}
    assert job_gpus([(cvd, f"{uuid[3]},{uuid[2][:12]}")], gpus).indices == {2, 3}  # a unique prefix
    assert job_gpus([(cvd, " 2 ")], gpus).indices == {2}
    # CUDA stops at the first entry that names no device: so does the reading
    assert job_gpus([(cvd, "1,7,2")], gpus).indices == {1}
    assert job_gpus([(cvd, "GPU-,3")], gpus) is None  # a prefix of every UUID names no single GPU
    # a MIG instance stands for the GPU that holds it
    gpus[2].mig_devices = ["MIG-5c2a0a5e-1111-2222-3333-444455556666", "MIG-77"]
    assert job_gpus([(cvd, "MIG-77")], gpus).indices == {2}
    assert job_gpus([(cvd, "MIG-88")], gpus) is None  # no GPU holds it: nothing gpuval can tell
    # Slurm's indices are NVML's; the step's are the job's
    assert job_gpus([("SLURM_STEP_GPUS", "3")], gpus).indices == {3}
    assert job_gpus([("SLURM_JOB_GPUS", "1,2")], gpus).source == "SLURM_JOB_GPUS='1,2'"


def test_what_restricts_nothing_judges_every_gpu(h200x4):
    gpus = _gpus(h200x4)
    for spec in [None, ("CUDA_VISIBLE_DEVICES", "0,1,2,3"), ("NVIDIA_VISIBLE_DEVICES", "all")]:
        assert job_gpus([spec], gpus) is None, spec
    # an empty value hides every GPU from CUDA: cuda.visible judges that, against every GPU
    for empty in [("CUDA_VISIBLE_DEVICES", ""), ("NVIDIA_VISIBLE_DEVICES", "none"), ("SLURM_JOB_GPUS", "")]:
        assert job_gpus([empty], gpus) is None, empty
    # inside a container the toolkit shows only what it names: NVML's four are the job's
    assert job_gpus([("NVIDIA_VISIBLE_DEVICES", "4,5,6,7")], gpus) is None
    assert job_gpus([("NVIDIA_VISIBLE_DEVICES", "1")], gpus).indices == {1}  # no container: NVML lists all


def test_the_nodes_job_gpus_are_the_union_over_its_ranks_and_any_unrestricted_rank_means_all(h200x4):
    gpus = _gpus(h200x4)
    per_task = [("CUDA_VISIBLE_DEVICES", "0"), ("CUDA_VISIBLE_DEVICES", "1")]
    job = job_gpus(per_task, gpus)
    assert job.indices == {0, 1} and job.source == "CUDA_VISIBLE_DEVICES='0'; CUDA_VISIBLE_DEVICES='1'"
    assert job_gpus([("CUDA_VISIBLE_DEVICES", "0"), None], gpus) is None


# --- health of a job given two of four GPUs ------------------------------------------------------------


def test_a_job_given_two_of_four_gpus_passes_on_them_and_lists_the_others(h200x4):
    """CUDA_VISIBLE_DEVICES=0,1 without device cgroups: NVML lists all four. Before, cuda.visible FAILed
    (GPUs 2 and 3 not usable through CUDA) unless health.allow_hidden_gpus was set."""
    spec = ("CUDA_VISIBLE_DEVICES", "0,1")
    checks = _health(h200x4, [_view(h200x4, [0, 1], spec, visible_devices="0,1")], gpus=2)
    assert _bad(checks) == []
    count = _one(checks, "expect.gpu_count")
    assert count.status is Status.PASS and count.value == 2  # the job's GPUs, counted against the profile
    cuda = _one(checks, "cuda.visible")
    assert cuda.status is Status.PASS and cuda.value == 2
    others = _one(checks, "gpu.not_this_job")
    assert others.status is Status.SKIP and others.value == 2 and others.scope == f"node:{NODE}"
    assert "2 GPUs of the node's 4 not given to this job (CUDA_VISIBLE_DEVICES='0,1')" in others.detail
    assert f"GPU 2 ({h200x4['devices'][2]['nvmlDeviceGetUUID']})" in others.detail
    judged = {c.scope for c in checks if c.scope.startswith("gpu:")}
    assert judged and judged <= {f"gpu:{NODE}/0", f"gpu:{NODE}/1"}  # nothing judged on GPUs 2 and 3
    # the profile's count is the job's: expecting the node's four FAILs
    failed = _one(_health(h200x4, [_view(h200x4, [0, 1], spec)], gpus=4), "expect.gpu_count")
    assert failed.status is Status.FAIL and failed.value == 2


def test_a_fault_on_a_gpu_that_is_not_the_jobs_is_not_judged_but_one_on_the_jobs_fails(h200x4):
    spec = ("CUDA_VISIBLE_DEVICES", "0,1")
    h200x4["devices"][3]["nvmlDeviceGetTotalEccErrors(uncorrected,volatile)"] = 2
    assert _bad(_health(h200x4, [_view(h200x4, [0, 1], spec)], gpus=2)) == []
    h200x4["devices"][1]["nvmlDeviceGetTotalEccErrors(uncorrected,volatile)"] = 2
    assert ("ecc.uncorrected_volatile", Status.FAIL, f"gpu:{NODE}/1") in _bad(
        _health(h200x4, [_view(h200x4, [0, 1], spec)], gpus=2)
    )


def test_a_gpu_the_job_was_given_that_cuda_cannot_use_still_fails(h200x4):
    spec = ("CUDA_VISIBLE_DEVICES", "0,1")
    checks = _health(h200x4, [_view(h200x4, [0], spec, visible_devices="0,1")], gpus=2)
    failed = _one(checks, "cuda.visible")
    assert failed.status is Status.FAIL and failed.threshold == {"equal": 2}
    assert f"GPU 1 ({h200x4['devices'][1]['nvmlDeviceGetUUID']})" in failed.detail
    assert "GPU 2" not in failed.detail and "GPU 3" not in failed.detail


def test_one_gpu_per_task_and_slurms_allocation_name_the_jobs_gpus(h200x4):
    per_task = [
        _view(h200x4, [2], ("CUDA_VISIBLE_DEVICES", "2")),
        _view(h200x4, [3], ("CUDA_VISIBLE_DEVICES", "3")),
    ]
    checks = _health(h200x4, per_task, gpus=2)
    assert _bad(checks) == [] and _one(checks, "gpu.not_this_job").value == 2
    slurm = _health(h200x4, [_view(h200x4, [0, 1, 2], ("SLURM_STEP_GPUS", "0,1,2"))], gpus=3)
    assert _bad(slurm) == [] and "GPU 3 (" in _one(slurm, "gpu.not_this_job").detail


def test_plain_gpuval_health_reads_its_own_environment(h200x4, monkeypatch):
    """No ranks' views handed in: the process's own variables name the job's GPUs."""
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "NVIDIA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_GPUS", "1")
    profile = load_profile("h200-sxm", ["expect.gpu_count=1", "expect.nvlinks_per_gpu=null"])
    checks = node_health(profile, NODE, library=ReplayNvml(h200x4), kmsg=None, exclude=frozenset({"cuda"}))
    assert _one(checks, "expect.gpu_count").status is Status.PASS
    assert "SLURM_JOB_GPUS='1'" in _one(checks, "gpu.not_this_job").detail


def test_accepts_node_inventory_counts_and_lists_the_jobs_gpus(h200x4):
    """What accept's checks across nodes (fleet.gpu_count) and its reports read: the job's GPUs."""
    from gpuval.health.job import for_job

    inventory = {"node": NODE, "gpu_count": 4, "gpus": [{"index": i, "name": "H200"} for i in range(4)]}
    assert for_job(inventory, None) is inventory
    job = job_gpus([("SLURM_STEP_GPUS", "1,3")], _gpus(h200x4))
    cut = for_job(inventory, job)
    assert cut["gpu_count"] == 2 and [g["index"] for g in cut["gpus"]] == [1, 3]
    assert cut["gpus_not_this_job"] == [0, 2] and cut["job_gpus"] == "SLURM_STEP_GPUS='1,3'"
    assert inventory["gpu_count"] == 4  # the node's own inventory is left as it was

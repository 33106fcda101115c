"""Which of a node's GPUs the job was given: those are judged and counted, the others are not this job's.

A job given two of eight GPUs without device cgroups (Slurm's `--gres` without `ConstrainDevices`, a shared
workstation, plain torchrun) still sees all eight through NVML; only a variable says which are its own. In
the order CUDA and the launchers apply them:

- `CUDA_VISIBLE_DEVICES`: what CUDA shows the process. Entries are device indices, GPU UUIDs (`GPU-…`, or
  a unique prefix of one) or MIG instance UUIDs (`MIG-…`, the GPU that holds the instance). CUDA stops
  at the first entry that names no device, and so does this reading. An index is NVML's index: CUDA
  numbers devices in PCI bus order under `CUDA_DEVICE_ORDER=PCI_BUS_ID`, and for GPUs of one model (an
  HGX node) its default order is the same.
- `SLURM_STEP_GPUS`, then `SLURM_JOB_GPUS`: the GPU indices Slurm allocated to the step or job on this node
  (with device cgroups NVML lists only those, and the indices then name every GPU it lists).
- `NVIDIA_VISIBLE_DEVICES`: the NVIDIA Container Toolkit's choice (`all`, indices or UUIDs); inside the
  container the toolkit already shows only those, so where NVML lists no more GPUs than it names, they are
  all the job's.

None of them set, `all`, or an empty or unreadable value: every GPU NVML lists is judged, as before (an
empty `CUDA_VISIBLE_DEVICES` hides every GPU from CUDA, which `cuda.visible` FAILs). Under `gpuval accept`
the node's job GPUs are the union over its ranks (`srun --gpus-per-task=1` gives each rank one).
Sources: https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#env-vars (CUDA_VISIBLE_DEVICES,
CUDA_DEVICE_ORDER), https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES
(SLURM_STEP_GPUS, SLURM_JOB_GPUS), https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html
(NVIDIA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuval.nvml import GpuInfo
from gpuval.results import Check, Status

# The variables that name a process's GPUs, the first one set deciding (module docstring).
VARIABLES = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "NVIDIA_VISIBLE_DEVICES")
_EVERY = ("all",)  # NVIDIA_VISIBLE_DEVICES: every GPU
_NONE = ("", "none", "void", "nodevfiles")  # no GPU named: nothing to restrict to


def given(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(variable, value) that names this process's GPUs, or None where none does."""
    env = os.environ if environ is None else environ
    for name in VARIABLES:
        if name in env:
            return name, env[name].strip()
    return None


@dataclass(frozen=True)
class JobGpus:
    """The GPUs of NVML's list (by NVML index) that the job was given, and the words that say why."""

    indices: frozenset[int]
    source: str  # "CUDA_VISIBLE_DEVICES='0,1'", several joined by '; ' when ranks differ

    def others(self, gpus: Sequence[GpuInfo]) -> list[GpuInfo]:
        return [gpu for gpu in gpus if gpu.index not in self.indices]


def _entry_gpu(entry: str, gpus: Sequence[GpuInfo]) -> GpuInfo | None:
    """The GPU one entry names: an index, a GPU UUID or unique prefix of one, or a MIG instance's UUID."""
    if entry.isdecimal():
        return next((gpu for gpu in gpus if gpu.index == int(entry)), None)
    if entry.startswith("MIG-"):
        holders = [gpu for gpu in gpus if isinstance(gpu.mig_devices, list) and entry in gpu.mig_devices]
        return holders[0] if holders else None
    if entry.startswith("GPU-"):
        found = [gpu for gpu in gpus if str(gpu.uuid or "").startswith(entry)]
        return found[0] if len(found) == 1 else None
    return None


def _named(name: str, value: str, gpus: Sequence[GpuInfo]) -> set[int] | None:
    """NVML indices one variable's value names; None where it restricts nothing gpuval can tell."""
    if value.lower() in _EVERY or value.lower() in _NONE:
        return None
    entries = [part.strip() for part in value.split(",")]
    if name == "NVIDIA_VISIBLE_DEVICES" and len(gpus) <= len(entries):
        return None  # inside the container the toolkit already shows only these
    picked: set[int] = set()
    for entry in entries:
        gpu = _entry_gpu(entry, gpus)
        if gpu is None:  # CUDA ignores an entry that names no device and every one after it
            break
        picked.add(gpu.index)
    return picked or None


def job_gpus(specs: Sequence[tuple[str, str] | None], gpus: Sequence[GpuInfo]) -> JobGpus | None:
    """The node's GPUs that its processes were given (`specs`: `given()` of each of the node's ranks), or
    None where any of them was given every GPU, or nothing can be told: then every GPU is the job's."""
    if not specs or not gpus:
        return None
    union: set[int] = set()
    for spec in specs:
        named = _named(*spec, gpus) if spec is not None else None
        if named is None:
            return None
        union |= named
    if union >= {gpu.index for gpu in gpus}:
        return None
    shown = sorted({f"{name}={value!r}" for name, value in specs if name})  # type: ignore[misc]
    return JobGpus(indices=frozenset(union), source="; ".join(shown))


def others_check(node: str, job: JobGpus, gpus: Sequence[GpuInfo]) -> Check:
    """SKIP, naming the node's GPUs that are not this job's: never judged, so never a FAIL and never a PASS
    on their behalf."""
    from gpuval.health._common import node_scope, plural

    others = job.others(gpus)
    named = ", ".join(f"GPU {gpu.index} ({gpu.uuid})" if gpu.uuid else f"GPU {gpu.index}" for gpu in others)
    return Check(
        name="gpu.not_this_job",
        status=Status.SKIP,
        value=len(others),
        unit="GPUs",
        scope=node_scope(node),
        detail=f"{plural(len(others), 'GPU')} of the node's {len(gpus)} not given to this job "
        f"({job.source}), not judged: {named}",
    )


def for_job(inventory: dict[str, Any], job: JobGpus | None) -> dict[str, Any]:
    """A node inventory (gpuval.discover) with its GPUs and count cut to the job's, and the others' NVML
    indices under `gpus_not_this_job`: what accept's checks across nodes and its reports then compare."""
    if job is None:
        return inventory
    every = inventory.get("gpus", [])
    gpus = [gpu for gpu in every if gpu.get("index") in job.indices]
    others = sorted(gpu.get("index") for gpu in every if gpu.get("index") not in job.indices)
    cut = {"gpus": gpus, "gpu_count": len(gpus), "gpus_not_this_job": others, "job_gpus": job.source}
    return {**inventory, **cut}

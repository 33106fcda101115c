"""Can CUDA use every GPU NVML lists? NVML talks to the driver; CUDA also needs its runtime to start (the
fabric manager on NVSwitch systems, a driver new enough for this CUDA) and shows a process only the GPUs
CUDA_VISIBLE_DEVICES leaves it. A GPU NVML lists but CUDA cannot use would go untested: FAIL, naming it.

Under `gpuval accept` each rank reads its own view and the health of a node compares NVML with the union
of its ranks' views: a launcher that binds one GPU to each task (srun --gpus-per-task=1) hides the others
from every single rank, not from the node. `health.allow_hidden_gpus` accepts a job that was given only
some of a shared node's GPUs. docs/gpu-visibility.md tells the whole story.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Any

from gpuval.errors import first_line
from gpuval.health._common import bus_key, node_scope, plural, reachable, skip, why_no_gpus
from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.nvml import GpuInfo
from gpuval.results import Check, Status

_FIX = (
    "check that nvidia-fabricmanager runs (systemctl status nvidia-fabricmanager, NVSwitch systems), that "
    "the driver supports this CUDA (nvidia-smi shows the newest CUDA it supports), and reboot if a GPU "
    "needs a reset"
)


@dataclass(frozen=True)
class CudaDevice:
    uuid: str | None  # NVML's spelling: 'GPU-…'
    bus: tuple[int, int, int] | None  # PCI (domain, bus, device), where torch gives it


@dataclass(frozen=True)
class CudaView:
    """What CUDA shows one process: the GPUs it can use, or why it can use none."""

    devices: tuple[CudaDevice, ...] = ()
    error: str | None = None  # CUDA's own reason when it cannot start or finds no device
    built: bool = True  # False: this torch has no CUDA at all
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES as the process had it; None: unset
    torch: str = ""  # torch's version
    given: tuple[str, str] | None = None  # the variable naming this process's GPUs (gpuval.health.job)


def _device(torch: Any, index: int) -> CudaDevice:
    props = torch.cuda.get_device_properties(index)
    uuid = str(getattr(props, "uuid", "") or "") or None
    if uuid and not uuid.startswith(("GPU-", "MIG-")):
        uuid = f"GPU-{uuid}"  # torch prints CUDA's UUID without NVML's prefix
    pci = tuple(getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    bus = (pci[0], pci[1], pci[2]) if all(isinstance(part, int) for part in pci) else None
    return CudaDevice(uuid=uuid, bus=bus)


def read_view(torch: Any = None) -> CudaView:
    """This process's CUDA view; `torch` is the torch module (a stand-in in tests)."""
    from gpuval.health.job import given

    if torch is None:
        import torch
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    mine = {"visible_devices": visible, "torch": str(getattr(torch, "__version__", "")), "given": given()}
    if torch.version.cuda is None:
        return CudaView(built=False, **mine)
    try:
        torch.cuda.init()  # raises CUDA's own error: no device, system not ready, driver too old, ...
        devices = tuple(_device(torch, index) for index in range(torch.cuda.device_count()))
    except Exception as exc:  # noqa: BLE001 - CUDA's reason is the finding
        return CudaView(error=first_line(exc), **mine)
    error = None if devices else "CUDA found no device"
    return CudaView(devices=devices, error=error, **mine)


def _seen_by(gpu: GpuInfo, views: list[CudaView]) -> bool:
    key = bus_key(gpu.pci_bus_id)
    return any(
        device.uuid == str(gpu.uuid) or (key is not None and device.bus == key)
        for view in views
        for device in view.devices
    )


def _seen_count(views: list[CudaView]) -> int:
    return len({device.uuid or device.bus for view in views for device in view.devices})


# What CUDA says when it can start but finds no GPU (CUDA_VISIBLE_DEVICES hid them all): not a fault of CUDA.
_NO_DEVICE = ("No CUDA GPUs are available", "no CUDA-capable device", "CUDA found no device")


def _hint(views: list[CudaView], errors: list[str]) -> str:
    masks = sorted({view.visible_devices for view in views if view.visible_devices is not None})
    if masks and all(any(words in error for words in _NO_DEVICE) for error in errors):
        shown = ", ".join(f"'{mask}'" for mask in masks)
        return (
            f"CUDA_VISIBLE_DEVICES={shown} hides them: unset it or list every GPU (a job given only some of "
            "a shared node's GPUs sets health.allow_hidden_gpus: true)"
        )
    return _FIX


def judge(node: str, gpus: list[GpuInfo], views: list[CudaView], allow_hidden: bool) -> Check:
    """NVML's GPUs (those it can open) against the CUDA views of this node's processes."""
    check = partial(Check, name="cuda.visible", scope=node_scope(node))
    if not all(view.built for view in views):
        torch = next(view.torch for view in views if not view.built)
        return check(
            status=Status.ERROR,
            detail=f"this torch ({torch}) is built without CUDA, so gpuval cannot use the "
            f"{plural(len(gpus), 'GPU')} NVML lists: install a CUDA build of torch where gpuval runs",
        )
    missing = [gpu for gpu in gpus if not _seen_by(gpu, views)]
    errors = sorted({view.error for view in views if view.error})
    seen = _seen_count(views)
    counts = f"NVML lists {plural(len(gpus), 'GPU')}, CUDA sees {seen}"
    if missing and allow_hidden and seen and not errors:
        detail = f"{counts}: the others are not this job's (health.allow_hidden_gpus)"
        return check(status=Status.PASS, value=seen, unit="GPUs", detail=detail)
    bound = {"equal": len(gpus)}
    if not missing and not errors:
        detail = f"CUDA sees all {plural(len(gpus), 'GPU')} NVML lists"
        return check(status=Status.PASS, value=seen, threshold=bound, unit="GPUs", detail=detail)
    said = f" (CUDA: {'; '.join(errors)})" if errors else ""
    named = ", ".join(f"GPU {gpu.index} ({gpu.uuid})" for gpu in missing)
    which = f"; not usable through CUDA: {named}" if missing else ""
    detail = f"{counts}{said}{which}: {_hint(views, errors)}"
    return check(status=Status.FAIL, value=seen, threshold=bound, unit="GPUs", detail=detail)


def run(ctx: HealthContext) -> list[Check]:
    gpus = [gpu for gpu in ctx.snapshot.gpus if reachable(gpu)]
    if not gpus:
        reason = (
            why_no_gpus(ctx.snapshot) if not ctx.snapshot.gpus else "no GPU answers NVML (see gpu.reachable)"
        )
        return [skip("cuda.visible", node_scope(ctx.node), reason)]
    views = ctx.cuda if ctx.cuda is not None else [read_view()]
    return [judge(ctx.node, gpus, views, ctx.profile.health.allow_hidden_gpus)]


def cpu_rank_problem(expected_gpus: int | None = None) -> str | None:
    """Why a process that runs on the CPU must not benchmark: its node has NVIDIA GPUs (or the profile
    expects `expected_gpus`) that CUDA cannot use here. None where there is no GPU to miss."""
    from gpuval.discover.gpus import gpus_here

    where = gpus_here() or (f"the profile expects {expected_gpus} GPUs" if expected_gpus else None)
    if where is None:
        return None
    view = read_view()
    cuda = view.error or (f"torch {view.torch} is built without CUDA" if not view.built else "no CUDA device")
    return f"CUDA can use no GPU here ({cuda}) although {where}: a benchmark would measure the CPU"


register(HealthCheck(name="cuda", summary="CUDA can use every GPU NVML lists", run=run))

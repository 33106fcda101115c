"""NVIDIA GPUs on the PCI bus, read from sysfs: what the hardware holds, whether or not a driver answers.

A function counts as a GPU when its vendor is NVIDIA (0x10de) and its class is a display controller of
subclass VGA (0x0300) or 3D controller (0x0302): data-centre GPUs are 3D controllers, a GPU with a display
output is VGA. NVSwitch chips (class 0x0680, "other bridge") and a GPU's HD-audio or USB functions have
other classes and are left out. Class codes: the PCI-SIG's PCI Code and ID Assignment Specification, as
the public pci.ids database (https://pci-ids.ucw.cz) lists them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)  # (base class << 8) | subclass: VGA-compatible, 3D controller
ROOT_VARIABLE = "GPUVAL_SYSFS_ROOT"  # for tests: a fake tree read in place of the real /sys


@dataclass(frozen=True)
class PciGpu:
    address: str  # "0000:18:00.0", as sysfs names the function
    device_id: int  # 0x2330 (H100 SXM5 80GB)
    driver: str | None  # the kernel driver bound to it ("nvidia", "vfio-pci"), None when none is

    @property
    def pci_id(self) -> str:
        """'10de:2330', as `lspci -nn` prints it."""
        return f"{NVIDIA_VENDOR:04x}:{self.device_id:04x}"

    def to_json(self) -> dict[str, str | None]:
        return {"address": self.address, "pci_id": self.pci_id, "driver": self.driver}


def system_root(root: Path = Path("/")) -> Path:
    """`root`, except that the real root becomes $GPUVAL_SYSFS_ROOT when that is set (tests point gpuval
    at a fake node through it; nothing else sets it)."""
    override = os.environ.get(ROOT_VARIABLE)
    return Path(override) if override and root == Path("/") else root


def _hex(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def _driver(device: Path) -> str | None:
    try:
        return (device / "driver").resolve(strict=True).name
    except OSError:
        return None


def nvidia_gpus(root: Path = Path("/")) -> list[PciGpu]:
    """Every NVIDIA GPU function under ROOT/sys/bus/pci/devices, by address; [] where sysfs is not there."""
    base = system_root(root) / "sys/bus/pci/devices"
    try:
        devices = sorted(base.iterdir())
    except OSError:
        return []
    gpus = []
    for device in devices:
        device_class = _hex(device / "class")
        if _hex(device / "vendor") != NVIDIA_VENDOR or device_class is None:
            continue
        device_id = _hex(device / "device")
        if device_class >> 8 in GPU_CLASSES and device_id is not None:
            gpus.append(PciGpu(address=device.name, device_id=device_id, driver=_driver(device)))
    return gpus

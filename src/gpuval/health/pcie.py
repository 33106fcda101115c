"""The GPU's PCIe link: width and generation against the link's maximum, and link-level replays.

Width does not drop with power saving, so a narrower link is a fault (slot, riser, cable, GPU). An idle
GPU may downshift its generation to save power, so a lower generation is only a WARN to re-check under
load. Replays are retransmissions after link errors; DCGM's bound is 8 a minute
(dcgm/hardware_limits: DCGM_LIMIT_MAX_PCIREPLAY_RATE), applied here to the count since boot.
"""

from __future__ import annotations

from pathlib import Path

from gpuval.health._common import at_least, per_gpu, unavailable
from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.nvml import GpuInfo
from gpuval.results import Check, Status

REPLAYS_PER_MINUTE_MAX = 8.0  # DCGM_LIMIT_MAX_PCIREPLAY_RATE


def uptime_s(root: Path) -> float | None:
    """Seconds since boot from ROOT/proc/uptime; None where it cannot be read."""
    try:
        return float((root / "proc" / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _width(gpu: GpuInfo, scope: str) -> Check:
    now, most = gpu.pcie_width_current, gpu.pcie_width_max
    if not isinstance(now, int) or not isinstance(most, int):
        return unavailable("pcie.width", scope, now if not isinstance(now, int) else most, "PCIe link width")
    return at_least(
        "pcie.width",
        scope,
        now,
        most,
        "lanes",
        f"x{now}",
        f"x{now} of x{most}: the link trained narrow; check the PCIe slot/riser, retrain the link "
        "(reseat the GPU or riser, then reboot) and replace the riser or cable if it stays narrow",
    )


def _generation(gpu: GpuInfo, scope: str) -> Check:
    now, most = gpu.pcie_gen_current, gpu.pcie_gen_max
    if not isinstance(now, int) or not isinstance(most, int):
        return unavailable(
            "pcie.generation", scope, now if not isinstance(now, int) else most, "PCIe generation"
        )
    return at_least(
        "pcie.generation",
        scope,
        now,
        most,
        "",
        f"Gen{now}",
        f"Gen{now} of Gen{most}: an idle GPU may downshift to save power; re-check under load "
        "(nvidia-smi -q -d PCI while a benchmark runs) and check the slot/riser if it stays low",
        below=Status.WARN,
    )


def _replays(gpu: GpuInfo, scope: str, minutes: float | None) -> Check:
    count = gpu.pcie_replay_count
    if not isinstance(count, int):
        return unavailable("pcie.replays", scope, count, "PCIe replay count")
    if minutes:
        rate = count / minutes
        high = rate > REPLAYS_PER_MINUTE_MAX
        measure = f"{count} replays since boot, {rate:.2g} a minute"
        if high:
            measure += f", over {REPLAYS_PER_MINUTE_MAX:g}"
    else:
        high = count > 0  # without the uptime no rate: any replay is worth a look
        measure = f"{count} replays"
    return Check(
        name="pcie.replays",
        status=Status.WARN if high else Status.PASS,
        value=count,
        unit="replays",
        scope=scope,
        detail=f"{measure}: the PCIe link retransmits after errors; "
        "check the PCIe slot/riser and cabling, and watch whether the count keeps rising"
        if high
        else measure,
    )


def run(ctx: HealthContext) -> list[Check]:
    seconds = uptime_s(ctx.root)
    minutes = seconds / 60 if seconds else None
    return per_gpu(
        ctx,
        ("pcie.width", "pcie.generation", "pcie.replays"),
        lambda gpu, scope: [_width(gpu, scope), _generation(gpu, scope), _replays(gpu, scope, minutes)],
    )


register(HealthCheck(name="pcie", summary="PCIe link width, generation and replays", run=run))

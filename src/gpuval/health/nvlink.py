"""NVLink: every link NVML reports must be up; data-link error counters should stay at zero.

With `expect.nvlinks_per_gpu` (18 on HGX H100/H200) a GPU with fewer links up FAILs, also when NVML shows
no NVLink at all: a node whose NVLinks vanished (fabric manager down, a tray out) must not pass as a
PCIe-only machine. Without it, a GPU with no NVLink is SKIP.

A down link is one FAIL per link (scope `link:NODE/gpuI-nvlinkJ`), so a CI system lists exactly which
links to look at. Replay, recovery and CRC counters only ever grow; any count is a WARN to watch.
"""

from __future__ import annotations

from gpuval.health._common import link_scope, per_gpu, plural, skip
from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.nvml import GpuInfo
from gpuval.results import Check, Status

_COUNTERS = (("replay_errors", "replay"), ("recovery_errors", "recovery"), ("crc_flit_errors", "CRC"))


def _state(node: str, gpu: GpuInfo, scope: str) -> list[Check]:
    links = gpu.nvlinks
    down = [link for link in links if not link.up]
    if not down:
        return [
            Check(
                name="nvlink.state",
                status=Status.PASS,
                value=len(links),
                unit="links",
                scope=scope,
                detail=f"{plural(len(links), 'link')} up",
            )
        ]
    indices = ", ".join(str(link.index) for link in down)
    checks = []
    for link in down:
        to = " to the NVSwitch" if link.remote == "switch" else ""
        checks.append(
            Check(
                name="nvlink.state",
                status=Status.FAIL,
                value=len(links) - len(down),
                threshold={"equal": len(links)},
                unit="links up",
                scope=link_scope(node, f"gpu{gpu.index}", f"nvlink{link.index}"),
                detail=f"NVLink {link.index}{to} of GPU {gpu.index} is down ({len(links) - len(down)} of "
                f"{len(links)} up; down: {indices}): check nvidia-smi nvlink -s and that "
                "nvidia-fabricmanager runs, then reseat/replace the NVLink/NVSwitch tray",
            )
        )
    return checks


def _errors(node: str, gpu: GpuInfo, scope: str) -> list[Check]:
    checks = []
    answered = 0
    for link in gpu.nvlinks:
        counts = {label: getattr(link, field) for field, label in _COUNTERS}
        known = {label: value for label, value in counts.items() if isinstance(value, int)}
        answered += bool(known)
        bad = {label: value for label, value in known.items() if value > 0}
        if bad:
            shown = ", ".join(f"{value} {label}" for label, value in bad.items())
            checks.append(
                Check(
                    name="nvlink.errors",
                    status=Status.WARN,
                    value=sum(bad.values()),
                    threshold={"max": 0},
                    unit="errors",
                    scope=link_scope(node, f"gpu{gpu.index}", f"nvlink{link.index}"),
                    detail=f"{shown} errors on NVLink {link.index} of GPU {gpu.index}: watch whether they "
                    "grow (nvidia-smi nvlink -e); if they do, reseat/replace the NVLink/NVSwitch tray",
                )
            )
    if not answered:
        return [skip("nvlink.errors", scope, "NVML gave no NVLink error counters")]
    if not checks:
        checks.append(
            Check(
                name="nvlink.errors",
                status=Status.PASS,
                value=0,
                unit="errors",
                scope=scope,
                detail=f"no replay, recovery or CRC errors on {plural(answered, 'link')}",
            )
        )
    return checks


def _count(gpu: GpuInfo, scope: str, expected: int) -> list[Check]:
    up = sum(link.up for link in gpu.nvlinks)
    if up >= expected:
        return []
    return [
        Check(
            name="nvlink.state",
            status=Status.FAIL,
            value=up,
            threshold={"min": expected},
            unit="links up",
            scope=scope,
            detail=f"GPU {gpu.index} has {up} of the profile's {expected} NVLinks up "
            f"(NVML reports {plural(len(gpu.nvlinks), 'link')}): check nvidia-smi nvlink -s, that "
            "nvidia-fabricmanager runs and the GPU is not passed through alone; then the NVSwitch tray",
        )
    ]


def run(ctx: HealthContext) -> list[Check]:
    expected = ctx.profile.expect.nvlinks_per_gpu

    def judge(gpu: GpuInfo, scope: str) -> list[Check]:
        if not gpu.nvlinks:
            if expected:
                return _count(gpu, scope, expected) + [
                    skip("nvlink.errors", scope, "this GPU shows no NVLink to count errors on")
                ]
            reason = "this GPU has no NVLink (or NVML reports none)"
            return [skip("nvlink.state", scope, reason), skip("nvlink.errors", scope, reason)]
        state = _state(ctx.node, gpu, scope)
        if expected and all(check.status == Status.PASS for check in state):
            state = _count(gpu, scope, expected) or state
        return state + _errors(ctx.node, gpu, scope)

    return per_gpu(ctx, ("nvlink.state", "nvlink.errors"), judge)


register(HealthCheck(name="nvlink", summary="NVLink links up, data-link error counters", run=run))

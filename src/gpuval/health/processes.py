"""Foreign compute processes: another job on a GPU makes every benchmark on it wrong.

gpuval's own processes (`ctx.own_pids`) are not foreign. A process is named from ROOT/proc/PID/comm
where that is visible (in a container NVML may report host PIDs that /proc here does not show).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuval.health._common import per_gpu, unavailable
from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.nvml import GpuInfo
from gpuval.results import Check, Status


def _describe(process: dict[str, Any], root: Path) -> str:
    pid = process.get("pid")
    parts = []
    try:
        parts.append((root / "proc" / str(pid) / "comm").read_text().strip())
    except OSError:
        pass
    used = process.get("used_memory_bytes")
    if isinstance(used, int):
        parts.append(f"{used / 2**30:.1f} GiB")
    return f"pid {pid}" + (f" ({', '.join(parts)})" if parts else "")


def run(ctx: HealthContext) -> list[Check]:
    def judge(gpu: GpuInfo, scope: str) -> list[Check]:
        processes = gpu.compute_processes
        if not isinstance(processes, list):
            return [unavailable("processes.foreign", scope, processes, "list of compute processes")]
        foreign = [p for p in processes if p.get("pid") not in ctx.own_pids]
        if not foreign:
            return [Check(name="processes.foreign", status=Status.PASS, value=0, scope=scope, detail="none")]
        shown = ", ".join(_describe(process, ctx.root) for process in foreign)
        return [
            Check(
                name="processes.foreign",
                status=Status.WARN,
                value=len(foreign),
                threshold={"max": 0},
                unit="processes",
                scope=scope,
                detail=f"{shown} on GPU {gpu.index}: another job is using this GPU; benchmarks would be "
                "wrong (wait for it or stop it: nvidia-smi shows its owner)",
            )
        ]

    return per_gpu(ctx, ("processes.foreign",), judge)


register(HealthCheck(name="processes", summary="no foreign compute processes on the GPUs", run=run))

"""Foreign compute processes: another program on a tested GPU makes every benchmark on it wrong.

gpuval's own processes (`ctx.own_pids`) are not foreign. A process is named from ROOT/proc/PID/comm and
its owner from ROOT/proc/PID/status where those are visible (in a container NVML may report host PIDs that
/proc here does not show). Memory NVML counts as used that no listed process holds is held by programs
this node cannot see (another container's: recent drivers list only processes of this PID namespace).

`health.foreign_processes` says what either is: `fail`, `warn`, or `auto` - FAIL in `gpuval accept`,
whose benchmarks it would skew or crowd out of memory, and WARN in `gpuval health`, which also runs as a
Slurm health check beside user jobs (a WARN there must not drain the node).
"""

from __future__ import annotations

import pwd
from pathlib import Path
from typing import Any

from gpuval.health._common import per_gpu, unavailable
from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.nvml import GpuInfo
from gpuval.results import Check, Status

GIB = 2**30
# Used memory no listed process accounts for, above which it is another program's. An idle GPU shows only
# the driver's reservation, and gpuval's own ranks add little beside it (even where a driver reports a
# process's usage as 0 or N/A and its context lands here); the larger of 2 GiB and 5% of the GPU is far
# above both, while a job that crowds out the benchmarks holds tens of GiB. The measured figures:
# docs/foreign-processes.md.
UNSEEN_MIN_BYTES = 2 * GIB
UNSEEN_MIN_FRACTION = 0.05
OPT_OUT = "; on a shared node set health.foreign_processes: warn"  # said where a foreign process FAILs


def _comm(proc: Path) -> str | None:
    try:
        return (proc / "comm").read_text().strip() or None
    except OSError:
        return None


def _user(proc: Path) -> str | None:
    """'user NAME' (or 'uid N' where this system has no name for it) from the real Uid in status."""
    try:
        lines = (proc / "status").read_text().splitlines()
    except OSError:
        return None
    uid = next((line.split()[1] for line in lines if line.startswith("Uid:") and len(line.split()) > 1), None)
    if uid is None or not uid.isdigit():
        return None
    try:
        return f"user {pwd.getpwuid(int(uid)).pw_name}"
    except KeyError:
        return f"uid {uid}"


def describe(process: dict[str, Any], root: Path) -> str:
    """'pid 4321 (python3, user alice, 40.0 GiB)': what is visible of it."""
    pid = process.get("pid")
    proc = root / "proc" / str(pid)
    used = process.get("used_memory_bytes")
    memory = f"{used / GIB:.1f} GiB" if isinstance(used, int) else None
    parts = [part for part in (_comm(proc), _user(proc), memory) if part]
    return f"pid {pid}" + (f" ({', '.join(parts)})" if parts else "")


def _unseen_margin(total: int) -> float:
    return max(UNSEEN_MIN_BYTES, UNSEEN_MIN_FRACTION * total)


def unseen_bytes(gpu: GpuInfo, processes: list[dict[str, Any]]) -> int | None:
    """Memory in use on `gpu` that no listed process holds, when it is clearly more than an idle GPU's;
    None otherwise (or when NVML gave no memory figures). A usage NVML did not give counts as 0."""
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    if not isinstance(used, int) or not isinstance(total, int):
        return None
    held = sum(p["used_memory_bytes"] for p in processes if isinstance(p.get("used_memory_bytes"), int))
    unseen = used - held
    return unseen if unseen > _unseen_margin(total) else None


def level(ctx: HealthContext) -> Status:
    """What a foreign process is here: health.foreign_processes, with 'auto' decided by the command."""
    return level_of(ctx.profile.health.foreign_processes, ctx.command)


def level_of(setting: str, command: str) -> Status:
    if setting == "auto":
        setting = "fail" if command == "accept" else "warn"
    return Status.FAIL if setting == "fail" else Status.WARN


def _what_to_do(foreign: list[dict[str, Any]], root: Path) -> str:
    if not foreign:
        return "find them with nvidia-smi on the host (another container or VM), then wait for or stop them"
    it, its = ("it", "its owner") if len(foreign) == 1 else ("them", "their owners")
    owners = sorted({user for p in foreign if (user := _user(root / "proc" / str(p.get("pid"))))})
    if owners:
        return f"wait for {it} to end, stop {it}, or ask {its} ({', '.join(owners)})"
    pids = ",".join(str(p.get("pid")) for p in foreign)
    return (
        f"wait for {it} to end, stop {it}, or find {its} (ps -o user= -p {pids}, on the host in a container)"
    )


def _foreign_check(
    gpu: GpuInfo, scope: str, foreign: list[dict[str, Any]], unseen: int | None, root: Path, status: Status
) -> Check:
    """The FAIL/WARN naming every foreign process on `gpu` (and the memory no process here accounts for)."""
    causes = [", ".join(describe(p, root) for p in foreign)] if foreign else []
    if unseen is not None:
        causes.append(f"{unseen / GIB:.1f} GiB in use by processes this node cannot see")
    opt_out = OPT_OUT if status is Status.FAIL else ""
    if foreign:
        value, unit, bound = float(len(foreign)), "processes", 0.0
    else:
        value, unit, bound = (unseen or 0) / GIB, "GiB", _unseen_margin(gpu.memory_total_bytes) / GIB
    return Check(
        name="processes.foreign",
        status=status,
        value=round(value, 1),
        threshold={"max": round(bound, 1)},
        unit=unit,
        scope=scope,
        detail=f"{' and '.join(causes)} on GPU {gpu.index}: benchmarks on it would be skewed or run out of "
        f"memory; {_what_to_do(foreign, root)}{opt_out}",
    )


def run(ctx: HealthContext) -> list[Check]:
    status = level(ctx)

    def judge(gpu: GpuInfo, scope: str) -> list[Check]:
        processes = gpu.compute_processes
        if not isinstance(processes, list):
            return [unavailable("processes.foreign", scope, processes, "list of compute processes")]
        foreign = [p for p in processes if p.get("pid") not in ctx.own_pids]
        unseen = unseen_bytes(gpu, processes)
        if not foreign and unseen is None:
            return [Check(name="processes.foreign", status=Status.PASS, value=0, scope=scope, detail="none")]
        return [_foreign_check(gpu, scope, foreign, unseen, ctx.root, status)]

    return per_gpu(ctx, ("processes.foreign",), judge)


register(HealthCheck(name="processes", summary="no other program's processes or memory on the GPUs", run=run))

"""GPU memory: ECC on, no uncorrectable errors, row remapping neither pending nor failed, retired pages.

Row remapping (Ampere and later) and page retirement (Volta and earlier) are the two ways a GPU fences
off bad memory; NVML answers NotSupported for the one a GPU does not use, which is a SKIP.
Thresholds for retired pages are DCGM's (dcgm/hardware_limits: DCGM_LIMIT_MAX_RETIRED_PAGES 60 for
replacement, 15 as the soft limit).
"""

from __future__ import annotations

import functools

from gpuval.health._common import per_gpu, plural, unavailable
from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.nvml import GpuInfo, available
from gpuval.results import Check, Status

RETIRED_PAGES_FAIL = 60  # DCGM_LIMIT_MAX_RETIRED_PAGES: the GPU is due for replacement
RETIRED_PAGES_WARN = 15  # DCGM_LIMIT_MAX_RETIRED_PAGES_SOFT_LIMIT

_DIAGNOSE = "drain the node and run field diagnostics (dcgmi diag -r 3); replace the GPU if errors recur"
NAMES = (
    "ecc.enabled",
    "ecc.uncorrected_volatile",
    "ecc.uncorrected_aggregate",
    "ecc.row_remapping",
    "ecc.retired_pages",
)


def _enabled(gpu: GpuInfo, scope: str) -> Check:
    current, pending = gpu.ecc_mode_current, gpu.ecc_mode_pending
    if not available(current):
        return unavailable("ecc.enabled", scope, current, "ECC mode")
    if not current:
        later = " (already set for the next boot: reboot or reset the GPU to apply)" if pending else ""
        return Check(
            name="ecc.enabled",
            status=Status.FAIL,
            scope=scope,
            detail=f"ECC is off{later}: enable it (nvidia-smi -i {gpu.index} -e 1) and reboot; memory errors "
            "would go undetected",
        )
    if available(pending) and not pending:
        return Check(
            name="ecc.enabled",
            status=Status.WARN,
            scope=scope,
            detail="ECC is on but set to turn off at the next reboot: keep it on "
            f"(nvidia-smi -i {gpu.index} -e 1)",
        )
    return Check(name="ecc.enabled", status=Status.PASS, scope=scope, detail="on")


def _uncorrected(gpu: GpuInfo, scope: str, counter: str) -> Check:
    name = f"ecc.uncorrected_{counter}"
    value = getattr(gpu, name.replace("ecc.", "ecc_"))
    if not isinstance(value, int):
        if gpu.ecc_mode_current == 1:
            # ECC is on, so the counter exists: a missing answer leaves the GPU unproven, not skipped.
            return Check(
                name=name,
                status=Status.ERROR,
                threshold={"max": 0},
                scope=scope,
                detail=f"ECC is on but NVML gave no uncorrectable {counter} count ({value!r}); rerun, and "
                "check with nvidia-smi -q -d ECC",
            )
        return unavailable(name, scope, value, f"uncorrectable {counter} ECC count")
    since = "since the driver loaded" if counter == "volatile" else "in the GPU's lifetime"
    ok = value == 0
    return Check(
        name=name,
        status=Status.PASS if ok else Status.FAIL,
        value=value,
        threshold={"max": 0},
        unit="errors",
        scope=scope,
        detail="none" if ok else f"{plural(value, 'uncorrectable ECC error')} {since}: {_DIAGNOSE}",
    )


def _row_remapping(gpu: GpuInfo, scope: str) -> Check:
    pending, failed = gpu.remapping_pending, gpu.remapping_failed
    if not available(pending) or not available(failed):
        return unavailable(
            "ecc.row_remapping", scope, pending if not available(pending) else failed, "row-remapping state"
        )
    rows = (
        f"{gpu.remapped_rows_uncorrectable} rows remapped for uncorrectable, "
        f"{gpu.remapped_rows_correctable} for correctable errors"
    )
    judged = functools.partial(Check, name="ecc.row_remapping", scope=scope)
    if failed:
        return judged(
            status=Status.FAIL,
            detail=f"row remapping failed ({rows}): the GPU has no spare row left for a bad one; drain the "
            "node and replace the GPU (NVIDIA RMA policy)",
        )
    if pending:
        return judged(
            status=Status.FAIL,
            detail=f"row remapping pending ({rows}): reset the GPU (nvidia-smi -r -i {gpu.index}) or reboot "
            "to apply pending row remapping; until then the bad row stays in use",
        )
    return judged(status=Status.PASS, detail=rows)


def _retired_pages(gpu: GpuInfo, scope: str) -> Check:
    sbe, dbe, pending = gpu.retired_pages_sbe, gpu.retired_pages_dbe, gpu.retired_pages_pending
    if not isinstance(sbe, int) or not isinstance(dbe, int):
        missing = sbe if not isinstance(sbe, int) else dbe
        check = unavailable("ecc.retired_pages", scope, missing, "retired-page counts")
        if available(gpu.remapping_pending):
            check.detail += ": this GPU remaps rows instead (see ecc.row_remapping)"
        return check
    total = sbe + dbe
    counts = f"{total} pages retired ({sbe} for single-bit, {dbe} for double-bit errors)"
    if pending is True:
        return Check(
            name="ecc.retired_pages",
            status=Status.FAIL,
            value=total,
            unit="pages",
            scope=scope,
            detail=f"page retirement pending, {counts}: reset the GPU (nvidia-smi -r -i {gpu.index}) or "
            "reboot to retire the pages",
        )
    status = (
        Status.FAIL
        if total >= RETIRED_PAGES_FAIL
        else Status.WARN
        if total >= RETIRED_PAGES_WARN
        else Status.PASS
    )
    hint = {
        Status.FAIL: f": at or over {RETIRED_PAGES_FAIL}, replace the GPU ({_DIAGNOSE})",
        Status.WARN: f": over {RETIRED_PAGES_WARN}, watch it; replace the GPU at {RETIRED_PAGES_FAIL}",
        Status.PASS: "",
    }[status]
    return Check(
        name="ecc.retired_pages",
        status=status,
        value=total,
        threshold={"max": RETIRED_PAGES_FAIL - 1},
        unit="pages",
        scope=scope,
        detail=counts + hint,
    )


def _judge(gpu: GpuInfo, scope: str) -> list[Check]:
    return [
        _enabled(gpu, scope),
        _uncorrected(gpu, scope, "volatile"),
        _uncorrected(gpu, scope, "aggregate"),
        _row_remapping(gpu, scope),
        _retired_pages(gpu, scope),
    ]


def run(ctx: HealthContext) -> list[Check]:
    return per_gpu(ctx, NAMES, _judge)


register(
    HealthCheck(name="ecc", summary="ECC on, uncorrectable errors, row remapping, retired pages", run=run)
)

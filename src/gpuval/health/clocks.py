"""Clock event ("throttle") reasons and temperature against the GPU's own slowdown threshold.

Hardware slowdowns cut clocks by half or more and point at cooling or power delivery: FAIL. A software
thermal slowdown is the driver holding the GPU under its limit: WARN. Idle, the power cap, application
clock settings and sync boost are normal operation.
"""

from __future__ import annotations

import functools

from gpuval.health._common import per_gpu, unavailable
from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.nvml import GpuInfo
from gpuval.results import Check, Status

TEMPERATURE_MARGIN_C = 5  # WARN this close to the slowdown threshold

# reason -> what to do; names are gpuval.nvml.CLOCK_REASONS
_FAIL = {
    "hw_thermal_slowdown": "the GPU is too hot and hardware halved its clocks: check cooling (fans, airflow, "
    "inlet temperature, heatsink contact)",
    "hw_power_brake_slowdown": "an external power brake is asserted: check the PSUs and the chassis power "
    "budget (BMC event log)",
    "hw_slowdown": "hardware slowdown is engaged (heat, power brake or over-current): check cooling and "
    "power delivery (nvidia-smi -q -d PERFORMANCE), drain the node if it persists",
}
_WARN = {
    "sw_thermal_slowdown": "the driver lowers clocks to stay under its temperature limit: check cooling",
}


def _reasons(gpu: GpuInfo, scope: str) -> Check:
    if not isinstance(gpu.clock_event_reasons, int):
        return unavailable("clocks.event_reasons", scope, gpu.clock_event_reasons, "clock event reasons")
    active = gpu.clock_reasons()
    failing = [reason for reason in _FAIL if reason in active]
    warning = [reason for reason in _WARN if reason in active]
    shown = ", ".join(active) or "none"
    judged = functools.partial(Check, name="clocks.event_reasons", scope=scope)
    if failing:
        # hw_slowdown is also raised by the thermal and power-brake causes: name the most specific one's hint
        return judged(
            status=Status.FAIL, detail=f"{', '.join(failing)} active (reasons: {shown}): {_FAIL[failing[0]]}"
        )
    if warning:
        return judged(
            status=Status.WARN, detail=f"{', '.join(warning)} active (reasons: {shown}): {_WARN[warning[0]]}"
        )
    return judged(status=Status.PASS, detail=shown)


def _temperature(gpu: GpuInfo, scope: str) -> Check:
    now, limit = gpu.temperature_c, gpu.temperature_slowdown_c
    if not isinstance(now, (int, float)):
        return unavailable("clocks.temperature", scope, now, "temperature")
    if not isinstance(limit, (int, float)):
        check = unavailable("clocks.temperature", scope, limit, "slowdown temperature")
        check.value, check.unit = now, "C"
        return check
    threshold = {"max": limit - TEMPERATURE_MARGIN_C}
    if now >= limit:
        status, detail = (
            Status.FAIL,
            f"{now} C, at or over the {limit} C slowdown threshold: the GPU is throttling; check cooling "
            "(fans, airflow, inlet temperature) and drain the node until it is fixed",
        )
    elif now >= limit - TEMPERATURE_MARGIN_C:
        status, detail = (
            Status.WARN,
            f"{now} C, within {TEMPERATURE_MARGIN_C} C of the {limit} C slowdown threshold: check cooling "
            "before a load pushes it over",
        )
    else:
        status, detail = Status.PASS, f"{now} C, slowdown at {limit} C"
    return Check(
        name="clocks.temperature",
        status=status,
        value=now,
        threshold=threshold,
        unit="C",
        scope=scope,
        detail=detail,
    )


def run(ctx: HealthContext) -> list[Check]:
    return per_gpu(
        ctx,
        ("clocks.event_reasons", "clocks.temperature"),
        lambda gpu, scope: [_reasons(gpu, scope), _temperature(gpu, scope)],
    )


register(HealthCheck(name="clocks", summary="clock throttle reasons and temperature", run=run))

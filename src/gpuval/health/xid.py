"""XID events: what the NVIDIA driver reported as GPU errors, from two sources.

(a) NVML's event API over a short window (`health.xid_window_s`): critical XIDs raised while health runs.
(b) The kernel log (/dev/kmsg, read without blocking up to its end): every `NVRM: Xid` line, mapped to the
    GPU by PCI bus id (the kernel writes `PCI:DDDD:BB:DD`, NVML `DDDDDDDD:BB:DD.F`), logged since the
    latest of: boot, the node's last passing `gpuval accept` in the history database, `health.xid_since`.
    Each record's time since boot plus the boot's wall time (/proc/stat btime) dates it, as `dmesg -T` does.
    The driver logs no documented line for a GPU reset, so gpuval sees a reset only through the latter two.

A critical XID (gpuval/xids.py, after NVIDIA's Xid catalog, docs.nvidia.com/deploy/xid-errors) is a FAIL
naming its meaning and what to do; any other XID is a WARN (most are raised by applications).
"""

from __future__ import annotations

import errno
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from gpuval.health._common import bus_key, gpu_scope, node_scope, reachable, skip, why_no_gpus
from gpuval.health.registry import HealthCheck, HealthContext, register
from gpuval.history import last_passing_run
from gpuval.nvml import Nvml, available, field_value
from gpuval.results import Check, Status
from gpuval.xids import XIDS, describe  # noqa: F401 - XIDS: read through this module by tests and callers

# Appended to every critical XID's action: how it stops counting. The kernel log keeps it until reboot and
# shows no GPU reset that gpuval could rely on, so after a reset the operator says when it happened.
AFTER_RESET = (
    "then rerun; XIDs logged before the node's last passing `gpuval accept` or before "
    "--set health.xid_since=<time of the reset, ISO 8601> are not counted"
)


# `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`; older drivers omit 'PCI:'.
_XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+(?:\.[0-9a-fA-F]+)?)\): "
    r"(?P<xid>\d+),?\s*(?P<text>.*)"
)
_KMSG_MAX_BYTES = 64 * 2**20  # a kernel ring buffer is a few MiB at most; never read without end
# What precedes `NVRM:` dates the line: a /dev/kmsg record `prio,seq,usec since boot,flags[,...];`
# (Linux Documentation/ABI/testing/dev-kmsg), or dmesg's `[ seconds.micros]`, maybe after a syslog prefix.
_KMSG_STAMP = re.compile(r"\d+,\d+,(?P<us>\d+),[^;]*;")
_DMESG_STAMP = re.compile(r"\[\s*(?P<s>\d+\.\d+)\]\s*$")


@dataclass
class Finding:
    xid: int
    bus_id: str | None  # as the source named it, when the GPU could not be mapped
    gpu_index: int | None
    text: str
    count: int = 1


class LoggedXid(NamedTuple):
    uptime_s: float | None  # when the kernel logged it, seconds since boot; None: no readable stamp
    bus: str
    xid: int
    text: str


def _uptime_s(prefix: str) -> float | None:
    if match := _KMSG_STAMP.fullmatch(prefix):
        return int(match["us"]) / 1e6
    if match := _DMESG_STAMP.search(prefix):
        return float(match["s"])
    return None


def parse_kernel_log(text: str) -> list[LoggedXid]:
    """Every NVRM Xid line, in order, with its time since boot where the line has one."""
    found = []
    for line in text.splitlines():
        match = _XID_LINE.search(line)
        if match:
            stamp = _uptime_s(line[: match.start()])
            found.append(LoggedXid(stamp, match["bus"], int(match["xid"]), match["text"].strip()))
    return found


@dataclass(frozen=True)
class Window:
    """From when kernel-log XIDs count (wall time, seconds since the epoch), and what set that time."""

    start: float
    reason: str  # "boot", "last passing run" or "health.xid_since"

    def phrase(self) -> str:
        if self.reason == "boot":
            return "since boot"
        at = datetime.fromtimestamp(self.start, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"since {at} ({self.reason})"


def boot_time(root: Path) -> float:
    """Wall time of boot: `btime` of /proc/stat under `root` (a fake tree in tests), else the clocks' gap."""
    try:
        for line in (root / "proc" / "stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "btime":
                return float(value)
    except (OSError, ValueError):
        pass
    return time.time() - time.monotonic()


def xid_window(ctx: HealthContext, boot: float) -> Window:
    """The latest of boot, the node's last passing accept run (history) and health.xid_since: an XID
    before a run that passed was already judged, one before health.xid_since was declared handled."""
    windows = [Window(boot, "boot")]
    passed = last_passing_run(ctx.history, ctx.node) if ctx.history is not None else None
    if passed is not None:
        windows.append(Window(passed.timestamp(), "last passing run"))
    if ctx.profile.health.xid_since is not None:
        windows.append(Window(ctx.profile.health.xid_since.timestamp(), "health.xid_since"))
    return max(windows, key=lambda window: window.start)


def read_kmsg(path: Path) -> str:
    """The kernel log up to now: /dev/kmsg gives one record per read and EAGAIN at its end; a plain file
    (tests) ends with EOF. A record overwritten while reading (EPIPE) is skipped."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks, size = [], 0
    try:
        while size < _KMSG_MAX_BYTES:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue
                raise
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _gpu_by_bus(ctx: HealthContext) -> dict[tuple[int, int, int], int]:
    by_bus = {}
    for gpu in ctx.all_gpus:  # node-wide: an XID on a GPU that is not this job's is still the node's
        key = bus_key(gpu.pci_bus_id) if reachable(gpu) else None
        if key is not None:
            by_bus[key] = gpu.index
    return by_bus


def _merge(findings: list[Finding], new: Finding) -> None:
    """One finding per XID and GPU (or unmapped bus id), counting repeats and keeping the latest text."""

    def key(finding: Finding) -> tuple[int, Any]:
        return finding.xid, finding.gpu_index if finding.gpu_index is not None else finding.bus_id

    for old in findings:
        if key(old) == key(new):
            old.count += 1
            old.text = new.text
            return
    findings.append(new)


def _checks(ctx: HealthContext, name: str, source: str, findings: list[Finding]) -> list[Check]:
    checks = []
    for finding in findings:
        info = describe(finding.xid)
        where = (
            f"GPU {finding.gpu_index}"
            if finding.gpu_index is not None
            else f"PCI {finding.bus_id}"
            if finding.bus_id
            else "a GPU NVML could not name"
        )
        times = f" {finding.count} times" if finding.count > 1 else ""
        said = f' ("{finding.text[:120]}")' if finding.text else ""
        action = f"{info.action}; {AFTER_RESET}" if info.critical else info.action
        checks.append(
            Check(
                name=name,
                status=Status.FAIL if info.critical else Status.WARN,
                value=finding.xid,
                unit="xid",
                scope=gpu_scope(ctx.node, finding.gpu_index)
                if finding.gpu_index is not None
                else node_scope(ctx.node),
                detail=f"Xid {finding.xid} ({info.meaning}) on {where}{times} {source}{said}: {action}",
            )
        )
    return checks


def _kernel_log(ctx: HealthContext) -> list[Check]:
    name, scope = "xid.kernel_log", node_scope(ctx.node)
    if ctx.kmsg is None:
        return [skip(name, scope, "the kernel log is not read here")]
    try:
        text = read_kmsg(ctx.kmsg)
    except OSError as exc:
        hint = " (run as root, or sysctl kernel.dmesg_restrict=0)" if isinstance(exc, PermissionError) else ""
        return [skip(name, scope, f"cannot read {ctx.kmsg}: {exc.strerror or exc}{hint}")]
    boot = boot_time(ctx.root)
    window = xid_window(ctx, boot)
    by_bus = _gpu_by_bus(ctx)
    findings: list[Finding] = []
    earlier = 0
    for logged in parse_kernel_log(text):
        # a line with no readable stamp cannot be shown to predate the window: it counts
        if logged.uptime_s is not None and boot + logged.uptime_s < window.start:
            earlier += 1
            continue
        key = bus_key(logged.bus)
        gpu_index = by_bus.get(key) if key else None
        _merge(findings, Finding(xid=logged.xid, bus_id=logged.bus, gpu_index=gpu_index, text=logged.text))
    if not findings:
        not_counted = f"; {earlier} logged before it not counted" if earlier else ""
        detail = f"no NVRM Xid line in {ctx.kmsg} {window.phrase()}{not_counted}"
        return [Check(name=name, status=Status.PASS, scope=scope, detail=detail)]
    return _checks(ctx, name, f"in the kernel log {window.phrase()}", findings)


def _nvml_events(ctx: HealthContext, window_s: float) -> list[Check]:
    """Register every GPU for critical-XID events and wait `window_s`; every call through the NVML layer
    (on ctx.library: pynvml, or a replay in tests), so no NVML error escapes as an exception."""
    name, scope = "xid.events", node_scope(ctx.node)
    nvml = Nvml(ctx.library)

    def failed(step: str, why: str) -> list[Check]:
        return [skip(name, scope, f"NVML event wait not possible here ({step}: {why})")]

    try:
        if nvml.error is not None:
            return failed("nvmlInit", nvml.error)
        event_set = nvml("nvmlEventSetCreate")
        if not available(event_set):  # an NVML without events (or a replay)
            return failed("nvmlEventSetCreate", event_set.reason)
        try:
            registered, refused = [], []
            xid_critical = nvml.constant("nvmlEventTypeXidCriticalError", 0x8)
            for gpu in ctx.all_gpus:
                if not reachable(gpu):
                    continue
                handle = nvml("nvmlDeviceGetHandleByIndex", gpu.index)
                done = (
                    nvml("nvmlDeviceRegisterEvents", handle, xid_critical, event_set)
                    if available(handle)
                    else handle
                )
                if available(done):
                    registered.append(gpu.index)
                else:  # NotSupported on this GPU
                    refused.append(f"GPU {gpu.index}: {done.reason}")
            if not registered:
                return [skip(name, scope, f"no GPU accepts XID event registration ({'; '.join(refused)})")]
            findings: list[Finding] = []
            deadline = time.monotonic() + window_s
            while (remaining_ms := int((deadline - time.monotonic()) * 1000)) > 0:
                data = nvml("nvmlEventSetWait_v2", event_set, remaining_ms)
                if not available(data):
                    if data.error == "NVMLError_Timeout":
                        break  # the window passed without an event
                    return failed("nvmlEventSetWait_v2", data.reason)
                # the GPU that raised it may be the one that is lost: then it has no index
                index = nvml("nvmlDeviceGetIndex", field_value(data, "device"))
                xid = int(field_value(data, "eventData"))
                gpu_index = index if available(index) else None
                _merge(findings, Finding(xid=xid, bus_id=None, gpu_index=gpu_index, text=""))
        finally:
            nvml("nvmlEventSetFree", event_set)  # freeing changes no verdict: its answer is not read
    finally:
        nvml.shutdown()
    if not findings:
        note = f"; not registered: {'; '.join(refused)}" if refused else ""
        return [
            Check(
                name=name,
                status=Status.PASS,
                scope=scope,
                detail=f"no critical XID during a {window_s:g} s wait on {len(registered)} GPUs{note}",
            )
        ]
    return _checks(ctx, name, f"during the {window_s:g} s NVML event wait", findings)


def run(ctx: HealthContext) -> list[Check]:
    scope = node_scope(ctx.node)
    if not ctx.snapshot.gpus:
        return [skip("xid", scope, why_no_gpus(ctx.snapshot))]
    window_s = ctx.profile.health.xid_window_s
    events = (
        _nvml_events(ctx, window_s)
        if window_s > 0
        else [skip("xid.events", scope, "health.xid_window_s is 0: no NVML event wait")]
    )
    return events + _kernel_log(ctx)


register(
    HealthCheck(name="xid", summary="XID events: NVML event wait and the kernel log", run=run, waits=True)
)

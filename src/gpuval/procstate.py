"""What /proc says of a process: its state, its parent, in words. A leaf module: the launcher
(gpuval.launch), the deadline watchdog (gpuval.deadline) and the process group's join (gpuval.runtime)
read it."""

from __future__ import annotations

import os
from pathlib import Path

STATES = {
    "T": "stopped by a signal",
    "t": "stopped by a debugger",
    "D": "in uninterruptible sleep (a driver or device wait)",
    "S": "blocked, waiting",
    "R": "busy",
    "Z": "already dead",
}
STOPPED = ("T",)  # a process stopped by a signal (SIGSTOP, SIGTSTP): it runs again only when continued


def stat(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name: [state, ppid, pgrp, ...]; [] if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return text[text.rfind(")") + 2 :].split()


def alive_child(pid: int) -> bool:
    """PID is still one of this process's children (a reaped child's pid may belong to anyone now)."""
    fields = stat(pid)
    return len(fields) > 1 and int(fields[1]) == os.getpid() and fields[0] != "Z"


def state(pid: int) -> str:
    fields = stat(pid)
    return fields[0] if fields else ""


def describe_state(pid: int) -> str:
    """What /proc says process PID is doing, in words ('stopped by a signal'); '' where it does not say."""
    return STATES.get(state(pid), "")


def is_gpuval(pid: int) -> bool:
    """PID runs gpuval (its command line says so): the one kind of process gpuval ever signals."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"gpuval" in handle.read()
    except OSError:
        return False

"""What each XID means and what to do about it, after NVIDIA's Xid catalog
(docs.nvidia.com/deploy/xid-errors).

One table for every reader: the health check's verdicts (health/xid.py) and the exporter's err_msg label of
DCGM_FI_DEV_XID_ERRORS (monitor/exporter.py). A critical XID points at the hardware or the driver; the others
are mostly raised by applications.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Xid:
    meaning: str
    critical: bool
    action: str


_RESET = "reset the GPU (nvidia-smi -r) or reboot"
_DIAGNOSE = "drain the node and run field diagnostics (dcgmi diag -r 3)"
XIDS: dict[int, Xid] = {
    13: Xid(
        "graphics engine exception",
        False,
        "usually an application fault; if it follows no crash, " + _DIAGNOSE,
    ),
    31: Xid(
        "GPU memory page fault", False, "usually an application's illegal address; check the application"
    ),
    43: Xid("GPU stopped processing", False, "usually an application fault; restart it"),
    45: Xid("preemptive cleanup after an earlier error", False, "look for the XID logged before it"),
    48: Xid("double-bit ECC error", True, f"{_RESET}; if it recurs, {_DIAGNOSE}"),
    61: Xid(
        "internal micro-controller breakpoint/warning", False, "watch for more; reset the GPU if it repeats"
    ),
    62: Xid("internal micro-controller halt", True, f"{_RESET}; update the driver if it recurs"),
    63: Xid(
        "ECC page retirement or row-remapping recording event",
        True,
        "reset the GPU or reboot to apply pending row remapping",
    ),
    64: Xid(
        "ECC page retirement or row-remapping recording failure",
        True,
        f"{_DIAGNOSE}; replace the GPU if a reset does not clear it",
    ),
    68: Xid("video decoder exception", False, "usually an application fault; restart it"),
    69: Xid("graphics engine class error", False, "usually an application fault; restart it"),
    74: Xid(
        "NVLink error",
        True,
        "check nvidia-smi nvlink -s / -e, reset the GPU, and reseat/replace the NVLink/NVSwitch tray "
        "if it recurs",
    ),
    79: Xid(
        "GPU has fallen off the bus",
        True,
        "drain the node and reboot; check the GPU's power, PCIe slot/riser and cooling, and replace it "
        "if it recurs",
    ),
    92: Xid("high single-bit ECC error rate", True, _DIAGNOSE),
    94: Xid(
        "contained ECC error", True, "the affected application was stopped; reset the GPU to remap the row"
    ),
    95: Xid(
        "uncontained ECC error",
        True,
        f"every application on the GPU was affected; {_RESET}, then {_DIAGNOSE}",
    ),
    119: Xid("GSP RPC timeout", True, f"{_RESET}; update the driver if it recurs"),
    120: Xid("GSP error", True, f"{_RESET}; update the driver if it recurs"),
    140: Xid("unrecovered ECC error", True, f"{_RESET}, then {_DIAGNOSE}"),
    154: Xid(
        "GPU recovery action changed", True, "do the recovery action the message names (reset, reboot, drain)"
    ),
}


def describe(xid: int) -> Xid:
    return XIDS.get(xid, Xid("see NVIDIA's Xid catalog", False, "look it up in NVIDIA's Xid catalog"))

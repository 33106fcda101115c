"""Verdicts for Prometheus: a run's result.json, or a fleet's fleet.json, as a file for node_exporter's
textfile collector, named by Prometheus's conventions and replaced atomically (docs/monitoring.md).

Every name starts `gpuval_`, carries its base unit (seconds, bytes, ratio) and is a gauge: nothing here
counts up, so nothing ends `_total`. Labels hold only names of bounded number (commands, profiles, checks,
scopes, GPU UUIDs, nodes), never a check's free-text detail or a time. A sample carries no timestamp:
the textfile collector refuses them, and the file's mtime (`node_textfile_mtime_seconds`) tells its age.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuval.atomic import write_text_atomic
from gpuval.scope import read as read_scope

# One file per command that writes one: a health run every few minutes must not replace the last accept's
# FAIL with its own PASS. The collector reads every *.prom of its folder; the temp file ends .tmp.
FILE_NAMES = {"accept": "gpuval.prom", "health": "gpuval-health.prom", "fleet": "gpuval-fleet.prom"}

VERDICTS = ("PASS", "FAIL", "ERROR")  # a run's verdict: a state set, 1 on the run's, 0 on the others
# A node's verdict in a fleet: its run's, WARN for a fleet outlier, MISSING for a node expected that left
# no result (gpuval.fleet.document).
FLEET_VERDICTS = ("PASS", "WARN", "FAIL", "ERROR", "MISSING")

# result.json's unit of a check -> (the unit's name at the end of the metric's name, factor to that base
# unit), after https://prometheus.io/docs/practices/naming/#base-units. Counts (errors, lanes, links,
# GPUs, ...) have no unit: their values go to gpuval_check_value. A unit not listed here is not written
# as a value (its status still is): a number in an unknown unit would read as one in another.
BASE_UNITS: dict[str, tuple[str, float]] = {
    "GB/s": ("bytes_per_second", 1e9),
    "TB/s": ("bytes_per_second", 1e12),
    "Gb/s": ("bytes_per_second", 1e9 / 8),
    "GiB": ("bytes", 2**30),
    "TFLOP/s": ("flops", 1e12),
    "tokens/s": ("tokens_per_second", 1.0),
    "%": ("ratio", 0.01),
    "ms": ("seconds", 1e-3),
    "us": ("seconds", 1e-6),
    "C": ("celsius", 1.0),
    "celsius": ("celsius", 1.0),
}
COUNT_UNITS = frozenset(
    {"", "elements", "errors", "pages", "replays", "processes", "ports", "links", "links up", "lanes",
     "iterations", "XIDs", "xid", "GPUs"}
)  # fmt: skip
_UNIT_WORDS = {
    "bytes_per_second": "bytes per second",
    "bytes": "bytes",
    "flops": "floating-point operations per second",
    "tokens_per_second": "tokens per second",
    "ratio": "a ratio (1 = 100 %)",
    "seconds": "seconds",
    "celsius": "degrees Celsius",
}


def escape_label(value: str) -> str:
    r"""A label value as the text exposition format writes it: \ " and newline escaped
    (https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))  # 1, not 1.0
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class _Families:
    """Metric families in the order first named, each with its HELP, TYPE gauge and samples."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]] = {}

    def add(self, name: str, help_text: str, labels: dict[str, str], value: float) -> None:
        _, samples = self._families.setdefault(name, (help_text, {}))
        key = tuple((k, v) for k, v in labels.items() if v != "")  # an empty label is no label
        samples.setdefault(key, value)  # the same series twice (a check listed twice): the first stands

    def text(self) -> str:
        lines = []
        for name, (help_text, samples) in self._families.items():
            lines += [f"# HELP {name} {_escape_help(help_text)}", f"# TYPE {name} gauge"]
            for labels, value in samples.items():
                inside = ",".join(f'{key}="{escape_label(str(val))}"' for key, val in labels)
                lines.append(f"{name}{{{inside}}} {_number(value)}" if inside else f"{name} {_number(value)}")
        return "\n".join(lines) + "\n"


def _epoch_s(iso: str | None) -> float | None:
    try:
        moment = datetime.fromisoformat(str(iso))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def _gpu_uuids(inventory: dict[str, Any]) -> dict[tuple[str, int], str]:
    """(node, GPU index) -> the GPU's UUID, from the inventory of every node in a result."""
    found = {}
    for node in inventory.get("nodes") or []:
        if not isinstance(node, dict):
            continue
        for gpu in node.get("gpus") or []:
            if isinstance(gpu, dict) and gpu.get("uuid") and isinstance(gpu.get("index"), int):
                found[(str(node.get("node", "")), gpu["index"])] = str(gpu["uuid"])
    return found


def result_text(result: dict[str, Any], command: str) -> str:
    """The textfile of one run: `result` is result.json's document (a dict, as read back), `command` what
    wrote it (accept or health: a label, so that both commands' files can sit in one folder)."""
    families = _Families()
    run = {"command": command, "profile": str(result.get("profile") or "")}
    verdict = str(result.get("verdict") or "ERROR")
    for state in VERDICTS:
        families.add(
            "gpuval_run_verdict",
            "Verdict of this node's latest gpuval run: 1 on its verdict (PASS, FAIL or ERROR), 0 on the "
            "others.",
            {**run, "verdict": state},
            float(state == verdict),
        )
    started = _epoch_s(result.get("started_at"))
    if started is not None:
        families.add("gpuval_run_timestamp_seconds", "Unix time the latest gpuval run started.", run, started)
    if isinstance(result.get("duration_s"), int | float):
        families.add(
            "gpuval_run_duration_seconds", "Seconds the latest gpuval run took.", run, result["duration_s"]
        )
    uuids = _gpu_uuids(result.get("inventory") or {})
    checks = [c for c in result.get("checks") or [] if isinstance(c, dict) and c.get("name")]
    for state in ("PASS", "FAIL", "WARN", "SKIP", "ERROR"):
        families.add(
            "gpuval_run_checks",
            "Checks of the latest gpuval run by status.",
            {**run, "status": state},
            float(sum(c.get("status") == state for c in checks)),
        )
    for check in checks:
        scope_text = str(check.get("scope") or "cluster")
        scope = read_scope(scope_text)
        on_gpu = scope is not None and scope.kind == "gpu"
        uuid = uuids.get((scope.node or "", scope.index or 0), "") if scope is not None and on_gpu else ""
        labels = {**run, "check": str(check["name"]), "scope": scope_text, "gpu_uuid": uuid}
        families.add(
            "gpuval_check_status",
            "Status of each check of the latest gpuval run, in the status label (PASS, FAIL, WARN, SKIP or "
            "ERROR); always 1.",
            {**labels, "status": str(check.get("status") or "ERROR")},
            1.0,
        )
        value = check.get("value")
        unit = str(check.get("unit") or "")
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if unit in COUNT_UNITS:
            families.add(
                "gpuval_check_value",
                "Value of each check of the latest gpuval run that counts things (errors, links, lanes, "
                "GPUs).",
                labels,
                float(value),
            )
        elif unit in BASE_UNITS:
            suffix, factor = BASE_UNITS[unit]
            families.add(
                f"gpuval_check_value_{suffix}",
                f"Value of each check of the latest gpuval run measured in {_UNIT_WORDS[suffix]}.",
                labels,
                float(value) * factor,
            )
    return families.text()


def fleet_text(fleet: dict[str, Any]) -> str:
    """The textfile of `gpuval fleet`, for the head node's exporter: `fleet` is fleet.json's document
    (schema gpuval.fleet/v1). Per node its verdict (a state set, MISSING included); per fleet outlier
    its robust z-score and its value over the fleet median as a ratio (0.92: 8 % below); the nodes by
    verdict; when it was made. Keys missing from the document leave their series out."""
    families = _Families()
    created = _epoch_s(fleet.get("created_at"))
    if created is not None:
        families.add(
            "gpuval_fleet_timestamp_seconds",
            "Unix time the latest gpuval fleet summary was made.",
            {},
            created,
        )
    nodes = [node for node in fleet.get("nodes") or [] if isinstance(node, dict) and node.get("name")]
    seen = [str(node.get("verdict") or "") for node in nodes]
    states = [*FLEET_VERDICTS, *sorted({v for v in seen if v and v not in FLEET_VERDICTS})]
    for state in states:
        families.add(
            "gpuval_fleet_nodes",
            "Nodes of the latest gpuval fleet summary by verdict.",
            {"verdict": state},
            float(seen.count(state)),
        )
    for node in nodes:
        name, verdict = str(node["name"]), str(node.get("verdict") or "")
        for state in states:
            families.add(
                "gpuval_fleet_node_verdict",
                "Verdict of each node in the latest gpuval fleet summary: 1 on its verdict, 0 on the others.",
                {"node": name, "verdict": state},
                float(state == verdict),
            )
    for node in nodes:
        for outlier in _outliers_of(node):
            if not isinstance(outlier, dict) or not outlier.get("check"):
                continue
            labels = {
                "node": str(node["name"]),
                "check": str(outlier["check"]),
                "scope": str(outlier.get("scope") or "cluster"),
            }
            ratio = _median_ratio(outlier)
            if ratio is not None:
                families.add(
                    "gpuval_fleet_outlier_median_ratio",
                    "Each fleet outlier's value over the fleet median of its check (0.92: 8 % below); only "
                    "checks gpuval fleet flagged as outliers are listed.",
                    labels,
                    ratio,
                )
            z = outlier.get("robust_z")
            if isinstance(z, int | float) and not isinstance(z, bool):
                families.add(
                    "gpuval_fleet_outlier_robust_z",
                    "Each fleet outlier's modified z-score, 0.6745 (value - median) / MAD of the fleet.",
                    labels,
                    float(z),
                )
    return families.text()


def _outliers_of(node: dict[str, Any]) -> list[Any]:
    """A fleet.json node's outliers, named as the fleet's model names them (gpuval.fleet.document) and
    read without validating it: a document missing keys still gives what it has."""
    from gpuval.fleet.document import FleetNodeEntry

    return list(FleetNodeEntry.model_construct(**node).outliers or [])


def _median_ratio(outlier: dict[str, Any]) -> float | None:
    value, median, pct = outlier.get("value"), outlier.get("fleet_median"), outlier.get("deviation_pct")
    numbers = (int, float)
    if isinstance(value, numbers) and isinstance(median, numbers) and median:
        return float(value) / float(median)
    if isinstance(pct, numbers):
        return 1.0 + float(pct) / 100.0
    return None


def write_textfile(directory: str | Path, name: str, text: str) -> Path:
    """`directory/name` replaced atomically (temp file in the folder, then rename), as the textfile
    collector needs: it never reads half a file, and a write that fails leaves the old file whole."""
    return write_text_atomic(Path(directory) / name, text)


def fleet_textfile(directory: str | Path, fleet: dict[str, Any]) -> Path:
    """`gpuval fleet --textfile DIR`: DIR/gpuval-fleet.prom from fleet.json's document."""
    return write_textfile(directory, FILE_NAMES["fleet"], fleet_text(fleet))


def unfinished(command: str, profile: str, began_at: datetime, checks: Iterable[str] = ()) -> dict[str, Any]:
    """What is known of a run that left no result.json (its ranks killed, say): verdict ERROR."""
    return {
        "verdict": "ERROR",
        "profile": profile,
        "started_at": began_at.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(timezone.utc) - began_at).total_seconds(), 3),
        "checks": [{"name": name, "status": "ERROR", "scope": "cluster"} for name in checks],
    }


def this_runs_result(output: Path, began_at: datetime) -> dict[str, Any] | None:
    """output/result.json when this run (begun at `began_at`) wrote it; None where there is none, it
    cannot be read, or an earlier run wrote it (its start is older than this run's)."""
    import json

    try:
        document = json.loads((output / "result.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    started = _epoch_s(document.get("started_at"))
    if started is None or started < began_at.replace(microsecond=0).timestamp():
        return None
    return document


@contextmanager
def published(
    directory: Path | None, command: str, output: Path, profile: str, began_at: datetime
) -> Iterator[None]:
    """Around a run of accept or health: once it ends, however it ends, DIR/<command's file> says its
    verdict, from the result.json it wrote in `output`, or ERROR where it wrote none. Bad input (exit 2)
    writes nothing. A textfile that cannot be written after a finished run is a RunError (exit 3): the
    fleet's monitoring would otherwise keep an older verdict without a word."""
    from gpuval.errors import RunError, UsageError

    if directory is None:
        yield
        return

    def write() -> None:
        document = this_runs_result(output, began_at) or unfinished(
            command, profile, began_at, checks=["run.result"]
        )
        write_textfile(directory, FILE_NAMES[command], result_text(document, command))

    try:
        yield
    except UsageError:
        raise
    except BaseException:
        with suppress(Exception):  # the run's own error is the one to say
            write()
        raise
    try:
        write()
    except OSError as exc:
        raise RunError(
            f"--textfile {directory}: {FILE_NAMES[command]} could not be written ({exc.strerror or exc}); "
            "the run's verdict is in its result.json"
        ) from None

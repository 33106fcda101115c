"""The fleet's verdict: each node as its own run judged it, the nodes against each other, what to drain and
what to run again.

Each node counts once, by its newest run (the result's start time). A node that PASSed but lies far on the
bad side of its peers is a fleet outlier: WARN, or FAIL with `fail_outliers`. The rule (docs/fleet.md):
values of one check are compared within their group (gpuval.fleet.read: check, GPU model, what the value
is of), by the median and the MAD of the group (gpuval.robust): a value is an outlier when its modified
z-score passes Z_LIMIT on the bad side AND it lies at least LEAST_GAP from the median. A group of fewer than
LEAST_NODES nodes is not judged.

Only a FAIL drains a node. An ERROR says the run did not complete and a MISSING node never reported: both
are listed to run again, never drained (an error of the tool is no fault of the node).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from gpuval import robust
from gpuval.errors import EXIT_ERROR, EXIT_FAIL, EXIT_PASS
from gpuval.fleet.hostlist import compress
from gpuval.fleet.read import NodeRun, Reading
from gpuval.results import Status

Z_LIMIT = robust.Z_LIMIT  # Iglewicz and Hoaglin's cut for the modified z-score (gpuval.robust)
# Azure's fleet-outlier playbook warns a node 3.5 % from its SKU's expected value; here the expected value is
# the fleet's median, and a value must be this far from it as well: in a tight fleet the MAD is a fraction
# of a percent, and noise alone would score past Z_LIMIT.
LEAST_GAP = 0.035
# Azure's playbook asks for at least 10 nodes before comparing them; a median of fewer says little.
LEAST_NODES = 10
MISSING = "MISSING"  # a node named by --expect that left no result
# the order the nodes are listed in: what needs a person first
ORDER = (MISSING, "FAIL", "ERROR", "WARN", "PASS")
_COUNTED = {"gpu": "GPUs", "cpu": "CPU ranks", "link": "links"}  # what a group's values are of, by scope kind


@dataclass(frozen=True)
class Rule:
    z_limit: float = Z_LIMIT
    least_gap: float = LEAST_GAP
    least_nodes: int = LEAST_NODES
    fail: bool = False  # an outlier FAILs its node (and drains it) instead of a WARN


@dataclass(frozen=True)
class Outlying:
    """One value far from its fleet's median on the bad side."""

    reading: Reading
    median: float
    deviation_pct: float  # (value - median) / |median|, in %
    robust_z: float | None  # the modified z-score, None where the MAD is 0
    peers: str  # what the median is of: '200 nodes', '1600 GPUs of 200 nodes'
    status: Status  # WARN, or FAIL under Rule.fail

    @property
    def detail(self) -> str:
        side = "below" if self.deviation_pct < 0 else "above"
        return f"fleet outlier: {abs(self.deviation_pct):.1f} % {side} the median of {self.peers}"


@dataclass(frozen=True)
class Group:
    """The values of one check compared with each other, for the HTML's distributions and heat map."""

    key: tuple[Any, ...]
    label: str
    unit: str
    direction: int
    values: list[float]
    nodes: int
    median: float
    bound: float | None
    judged: bool


@dataclass
class FleetNode:
    name: str
    verdict: str  # one of ORDER
    run: NodeRun | None  # None: MISSING
    outliers: list[Outlying] = field(default_factory=list)
    older: list[str] = field(default_factory=list)  # the files of its older runs, not counted

    def reasons(self) -> list[str]:
        """One line per reason the node needs attention: its checks that did not pass, its outliers."""
        from gpuval.report.console import format_bound
        from gpuval.units import format_number

        if self.run is None:
            return ["no result: named by --expect, but no result.json of it was found"]
        lines = []
        for check in self.run.checks:
            value = "" if check.value is None else f" {format_number(check.value)} {check.unit}".rstrip()
            bound = format_bound(check.threshold)
            lines.append(
                f"{check.status.value} {check.name} on {check.scope}:{value}"
                + (f" (bound {bound})" if bound else "")
                + (f" — {check.detail}" if check.detail else "")
            )
        for outlier in self.outliers:
            reading = outlier.reading
            lines.append(
                f"{outlier.status.value} {reading.check} on {reading.scope}: {format_number(reading.value)} "
                f"{reading.unit}, {outlier.detail}"
            )
        return lines


@dataclass
class Summary:
    nodes: list[FleetNode]  # in ORDER, then by name
    groups: list[Group]
    rule: Rule
    rule_note: str  # whether outliers were judged, and over what
    notes: list[str]  # one line each: nodes reported twice, nodes reported but not expected
    files: int

    def names(self, verdict: str) -> list[str]:
        return [node.name for node in self.nodes if node.verdict == verdict]

    @property
    def drain(self) -> str:
        return compress(self.names("FAIL"))

    @property
    def counts(self) -> dict[str, int]:
        counted = {verdict: len(self.names(verdict)) for verdict in ORDER}
        return {"nodes": len(self.nodes), **counted}

    @property
    def verdict(self) -> str:
        """The fleet's, as its exit code says it: FAIL, ERROR (a node ERROR or MISSING), WARN or PASS."""
        counts = self.counts
        if counts["FAIL"]:
            return "FAIL"
        if counts["ERROR"] or counts[MISSING] or not counts["nodes"]:
            return "ERROR"
        return "WARN" if counts["WARN"] else "PASS"

    @property
    def exit_code(self) -> int:
        """1 when a node FAILed; else 3 when a node is ERROR or MISSING (or none reported); else 0."""
        return {"FAIL": EXIT_FAIL, "ERROR": EXIT_ERROR}.get(self.verdict, EXIT_PASS)


def natural_key(name: str) -> tuple[Any, ...]:
    """node9 before node10: digit runs compare as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def summarize(
    runs: list[NodeRun], files: int, expected: list[str] | None = None, rule: Rule | None = None
) -> Summary:
    """The fleet from every node's runs (the newest counts) and the nodes expected to report."""
    rule = rule or Rule()
    notes: list[str] = []
    by_name: dict[str, list[tuple[int, NodeRun]]] = defaultdict(list)
    for index, run in enumerate(runs):
        by_name[run.name].append((index, run))
    nodes: dict[str, FleetNode] = {}
    for name, found in by_name.items():
        found.sort(key=lambda item: (item[1].started_at, item[0]), reverse=True)
        newest = found[0][1]
        older = [run.source for _, run in found[1:]]
        nodes[name] = FleetNode(name, newest.verdict.value, newest, older=older)
        if older:
            notes.append(
                f"node {name}: {len(found)} results; the newest (started {newest.started_text}) counts: "
                f"{newest.source}; not counted: {', '.join(older)}"
            )
    if expected is not None:
        missing = [name for name in expected if name not in nodes]
        for name in missing:
            nodes[name] = FleetNode(name, MISSING, None)
        unexpected = sorted(set(by_name) - set(expected), key=natural_key)
        if unexpected:
            notes.append(
                f"{len(unexpected)} node(s) reported but not in --expect: {compress(unexpected)}; "
                "judged all the same"
            )
    groups, rule_note = _judge_outliers(nodes, rule)
    for node in nodes.values():
        if node.run is None:
            continue
        if node.outliers and rule.fail:
            node.verdict = "FAIL"
        elif node.verdict == "PASS" and (
            node.outliers or any(c.status is Status.WARN for c in node.run.checks)
        ):
            node.verdict = "WARN"
    ordered = sorted(nodes.values(), key=lambda node: (ORDER.index(node.verdict), natural_key(node.name)))
    return Summary(ordered, groups, rule, rule_note, notes, files)


def _judge_outliers(nodes: dict[str, FleetNode], rule: Rule) -> tuple[list[Group], str]:
    """Each group's outliers attached to the nodes they bear on; the groups; a line saying what was judged."""
    counted = {node.name: node.run.source for node in nodes.values() if node.run is not None}
    readings: dict[tuple[Any, ...], Reading] = {}
    for node in nodes.values():
        for reading in node.run.readings if node.run is not None else ():
            readings.setdefault((reading.source, reading.check, reading.scope, reading.group), reading)
    by_group: dict[tuple[Any, ...], list[Reading]] = defaultdict(list)
    for reading in readings.values():
        by_group[reading.group].append(reading)
    groups, judged, too_small = [], 0, 0
    for key, members in by_group.items():
        owners = {name for r in members for name in r.owners if counted.get(name) == r.source}
        values = [r.value for r in members]
        median = statistics.median(values)
        bounds = [r.bound for r in members if r.bound is not None]
        first = members[0]
        is_judged = len(owners) >= rule.least_nodes
        bound = statistics.median(bounds) if bounds else None
        groups.append(
            Group(
                key, _label(key), first.unit, first.direction, values, len(owners), median, bound, is_judged
            )
        )
        if not is_judged:
            too_small += 1
            continue
        judged += 1
        judgement = robust.judge(values, first.direction, rule.z_limit, rule.least_gap, least_values=1)
        peers = f"{len(owners)} nodes"
        if len(values) != len(owners):
            peers = f"{len(values)} {_COUNTED.get(key[3], 'values')} of {peers}"
        status = Status.FAIL if rule.fail else Status.WARN
        for found in judgement.outliers:
            reading = members[found.index]
            if reading.status is Status.FAIL:  # past its own bound already: the check says so
                continue
            deviation = (reading.value - median) / abs(median) * 100 if median else -math.inf
            z = robust.modified_z(reading.value, median, judgement.mad) if judgement.mad else None
            outlier = Outlying(reading, median, deviation, z, peers, status)
            for name in reading.owners:
                if counted.get(name) == reading.source:
                    nodes[name].outliers.append(outlier)
    groups.sort(key=lambda group: group.label)
    return groups, _rule_note(rule, len(counted), judged, too_small)


def _rule_note(rule: Rule, reported: int, judged: int, too_small: int) -> str:
    how = (
        f"a value on the bad side with modified z-score past {rule.z_limit:g} and at least "
        f"{rule.least_gap:.1%} from its group's median is an outlier ({'FAIL' if rule.fail else 'WARN'})"
    )
    if not judged:
        return (
            f"no fleet outlier judged: {reported} node(s) reported, and a check's values are compared only "
            f"across {rule.least_nodes} nodes or more; {how}"
        )
    small = f"; {too_small} group(s) of fewer than {rule.least_nodes} nodes not judged" if too_small else ""
    return f"fleet outliers judged in {judged} group(s) of {rule.least_nodes} nodes or more{small}: {how}"


def _label(key: tuple[Any, ...]) -> str:
    """A group as a person reads it: 'matmul.bf16_tflops · NVIDIA H100 80GB HBM3 · per GPU'."""
    from gpuval.units import format_bytes

    check, size, model, kind, *counts = key
    name = f"{check} @ {format_bytes(size)}" if isinstance(size, int) and size > 0 else check
    if kind in ("gpu", "cpu"):
        what = f"per {kind.upper()}"
    elif kind == "cluster":
        gpus, node_count = counts
        what = f"{gpus} GPUs" + (f" on {node_count} nodes" if node_count > 1 else "")
    else:
        what = f"per {kind}, {counts[0]} GPUs a node"
    return f"{name} · {model} · {what}"

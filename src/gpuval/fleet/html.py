"""fleet.html: the fleet on one page that opens from disk (no script, no network), as report.html does.

Verdict counts; the nodes that need a person first (MISSING, FAIL, ERROR, WARN) with why; a heat map of
nodes × checks, each cell the node's worst value against its group's fleet median; each check's
distribution across the fleet as a small SVG histogram with its median and its floor; every node last.

The heat map shows every node that needs attention and then the nodes farthest from the median, up to
HEAT_ROWS rows in all (a 1,000-node table helps nobody); the page says how many it left out.
"""

from __future__ import annotations

import html
from collections import defaultdict

from gpuval.fleet.judge import MISSING, ORDER, FleetNode, Group, Summary
from gpuval.report.html import _COLOURS, CSS
from gpuval.units import format_number

HEAT_ROWS = 60  # heat-map rows: the nodes that need attention, then the farthest from the median
HEAT_FULL_PCT = 10.0  # a cell this far on the bad side of the median is fully coloured
BINS = 40  # bars of a distribution
COLOURS = {status.value: colour for status, colour in _COLOURS.items()} | {MISSING: "#bc4c00"}
FLEET_CSS = """
td.heat { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; font-size: 12px; }
th.rot { font-size: 11px; font-weight: 600; max-width: 9em; overflow-wrap: anywhere; }
.counts span { display: inline-block; margin-right: 18px; }
.dist { display: inline-block; margin: 6px 18px 12px 0; vertical-align: top; }
.dist p { margin: 0; font-size: 12px; color: #57606a; max-width: 340px; }
"""


def render_html(summary: Summary) -> str:
    counts = summary.counts
    worst = summary.verdict
    shown = " · ".join(f"{counts[verdict]} {verdict}" for verdict in ORDER if counts[verdict])
    banner = (
        f'<header class="verdict" style="background:{COLOURS[worst]}"><h1>gpuval fleet: {worst}</h1>'
        f"<p>{counts['nodes']} nodes from {summary.files} result files · {html.escape(shown)}</p>"
        f"<p>drain: <code>{html.escape(summary.drain or 'none')}</code></p></header>"
    )
    parts = [
        banner,
        "<main>",
        _attention(summary),
        _heat_map(summary),
        _distributions(summary),
        _notes(summary),
        _every_node(summary),
        "</main>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>gpuval fleet {worst} · {counts['nodes']} nodes</title>"
        f"<style>{CSS}{FLEET_CSS}</style></head><body>{''.join(parts)}</body></html>\n"
    )


def _verdict_cell(verdict: str) -> str:
    return f'<td class="status" style="color:{COLOURS[verdict]}">{verdict}</td>'


def _attention(summary: Summary) -> str:
    needing = [node for node in summary.nodes if node.verdict != "PASS"]
    if not needing:
        return '<h2 id="attention">Needs attention</h2><p>None: every node PASSed.</p>'
    rows = []
    for node in needing:
        why = "<br>".join(html.escape(line) for line in node.reasons())
        source = html.escape(node.run.source) if node.run is not None else ""
        rows.append(
            f"<tr>{_verdict_cell(node.verdict)}<td>{html.escape(node.name)}</td><td>{why}</td>"
            f"<td><code>{source}</code></td></tr>"
        )
    return (
        f'<h2 id="attention">Needs attention ({len(needing)})</h2><p>{html.escape(summary.rule_note)}</p>'
        "<table><thead><tr><th>verdict</th><th>node</th><th>why</th><th>result</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _worst_by_group(node: FleetNode, groups: dict[tuple, Group]) -> dict[tuple, float]:
    """The node's worst value of each group, in % from the group's median (negative: on the bad side)."""
    worst: dict[tuple, float] = {}
    for reading in node.run.readings if node.run is not None else ():
        group = groups.get(reading.group)
        if group is None or not group.median:
            continue
        relative = (reading.value - group.median) / abs(group.median) * 100 * group.direction
        worst[reading.group] = min(relative, worst.get(reading.group, relative))
    return worst


def _heat_colour(relative: float) -> str:
    """Red on the bad side, fully at HEAT_FULL_PCT; a pale blue on the good side."""
    share = min(1.0, abs(relative) / HEAT_FULL_PCT)
    if relative < 0:
        return f"rgba(207, 34, 46, {0.08 + 0.8 * share:.2f})"
    return f"rgba(9, 105, 218, {0.04 + 0.25 * share:.2f})"


def _heat_map(summary: Summary) -> str:
    groups = {group.key: group for group in summary.groups}
    if not groups:
        return '<h2 id="heat">Against the fleet median</h2><p>No compared value in these results.</p>'
    worst = {node.name: _worst_by_group(node, groups) for node in summary.nodes}
    attention = [node for node in summary.nodes if node.verdict != "PASS"]
    rest = sorted(
        (node for node in summary.nodes if node.verdict == "PASS"),
        key=lambda node: min(worst[node.name].values(), default=0.0),
    )
    rows_shown = (attention + rest)[:HEAT_ROWS]
    columns = [group for group in summary.groups if any(group.key in worst[n.name] for n in rows_shown)]
    head = "".join(f'<th class="rot">{html.escape(group.label)}</th>' for group in columns)
    body = []
    for node in rows_shown:
        cells = []
        for group in columns:
            relative = worst[node.name].get(group.key)
            if relative is None:
                cells.append('<td class="heat"></td>')
            else:
                cells.append(
                    f'<td class="heat" style="background:{_heat_colour(relative)}">{relative:+.1f}</td>'
                )
        body.append(
            f"<tr>{_verdict_cell(node.verdict)}<td>{html.escape(node.name)}</td>{''.join(cells)}</tr>"
        )
    left = len(summary.nodes) - len(rows_shown)
    note = (
        f"<p>{left} more node(s) not shown: the map holds {len(rows_shown)} rows, those that need attention "
        "first, then those farthest from the median.</p>"
        if left > 0
        else ""
    )
    return (
        '<h2 id="heat">Against the fleet median</h2><p>Each cell: the node\'s worst value of the check, in % '
        "from the check's fleet median, negative on the bad side (slower, or higher where lower is better). "
        f"The nodes that need attention first, then the farthest from the median.</p>"
        f"<table><thead><tr><th>verdict</th><th>node</th>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
        f"</table>{note}"
    )


def _histogram(group: Group) -> str:
    """The group's values as an inline SVG histogram, its median (black) and its floor (red, dashed)."""
    width, height, pad = 320, 90, 14
    low = min(group.values + ([group.bound] if group.bound is not None else []))
    high = max(group.values + ([group.bound] if group.bound is not None else []))
    span = (high - low) or abs(high) or 1.0
    low, high = low - span * 0.02, high + span * 0.02
    counts = [0] * BINS
    for value in group.values:
        counts[min(BINS - 1, int((value - low) / (high - low) * BINS))] += 1
    tallest = max(counts)

    def x(value: float) -> float:
        return (value - low) / (high - low) * width

    bar = width / BINS
    tall = [max(2.0, count / tallest * (height - 2 * pad)) for count in counts]  # a lone value stays visible
    bars = "".join(
        f'<rect x="{i * bar:.1f}" y="{height - pad - tall[i]:.1f}" width="{bar - 1:.1f}" '
        f'height="{tall[i]:.1f}" fill="#0969da"/>'
        for i, count in enumerate(counts)
        if count
    )
    middle = x(group.median)
    lines = f'<line x1="{middle:.1f}" x2="{middle:.1f}" y1="0" y2="{height - pad}" stroke="#000"/>'
    if group.bound is not None:
        lines += (
            f'<line x1="{x(group.bound):.1f}" x2="{x(group.bound):.1f}" y1="0" y2="{height - pad}" '
            'stroke="#cf222e" stroke-dasharray="4 3"/>'
        )
    labels = (
        f'<text x="0" y="{height - 2}" font-size="10">{html.escape(format_number(low))}</text>'
        f'<text x="{width}" y="{height - 2}" font-size="10" text-anchor="end">'
        f"{html.escape(format_number(high))}</text>"
    )
    return (
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">{bars}{lines}'
        f"{labels}</svg>"
    )


def _distributions(summary: Summary) -> str:
    if not summary.groups:
        return ""
    figures = []
    for group in summary.groups:
        floor = (
            f"{'floor' if group.direction > 0 else 'ceiling'} {format_number(group.bound)}"
            if group.bound is not None
            else "no bound"
        )
        judged = "" if group.judged else " · too few nodes to judge outliers"
        figures.append(
            f'<div class="dist">{_histogram(group)}<p><b>{html.escape(group.label)}</b><br>'
            f"{len(group.values)} values of {group.nodes} nodes · median {format_number(group.median)} "
            f"{html.escape(group.unit)} · {floor}{judged}</p></div>"
        )
    return (
        '<h2 id="distributions">Distributions</h2><p>Each check across the fleet: black, the median; red '
        f"dashed, the floor its profile sets (the ceiling where lower is better).</p>{''.join(figures)}"
    )


def _notes(summary: Summary) -> str:
    if not summary.notes:
        return ""
    items = "".join(f"<li>{html.escape(note)}</li>" for note in summary.notes)
    return f'<h2 id="notes">Notes</h2><ul>{items}</ul>'


def _every_node(summary: Summary) -> str:
    by_verdict: dict[str, list[str]] = defaultdict(list)
    for node in summary.nodes:
        by_verdict[node.verdict].append(node.name)
    rows = "".join(
        f"<tr>{_verdict_cell(verdict)}<td>{len(by_verdict[verdict])}</td>"
        f"<td>{html.escape(', '.join(by_verdict[verdict]))}</td></tr>"
        for verdict in ORDER
        if by_verdict[verdict]
    )
    return (
        f'<h2 id="nodes">Every node ({len(summary.nodes)})</h2><details><summary>show</summary><table>'
        f"<thead><tr><th>verdict</th><th>nodes</th><th>names</th></tr></thead><tbody>{rows}</tbody>"
        "</table></details>"
    )

"""The soak section of report.html, drawn only for a result that holds iterations (`inventory.soak`, written
by gpuval.soak): which iteration failed first and why, every iteration's verdict, and every judged series
over the iterations (benchmark values against iteration 1's tolerance edge, error counters per GPU) with
the first failing iteration marked.

html.py hands in its figure and SVG helpers, so this module needs nothing from it (no import cycle).
A soak of many GPUs judges thousands of series: the panels and lines drawn are capped, the failing ones
first, and a line under the figure counts the rest (gpuval.report.limits).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from itertools import islice
from typing import Any

from gpuval.checkref import SOAK, in_family
from gpuval.report.limits import MAX_DETAIL, MAX_LINES, MAX_PANELS, MAX_ROWS, capped, cut, more
from gpuval.results import Result
from gpuval.scope import place_of

_VERDICT_COLOURS = {"PASS": "#1a7f37", "FAIL": "#cf222e", "ERROR": "#8250df", "WARN": "#9a6700"}
_COLUMNS = 3


def soak_section(result: Result, figure: Callable[[float, float], Any], svg: Callable[[Any], str]) -> str:
    """The section's HTML; '' when `result` is not a soak summary."""
    soak = result.inventory.get("soak")
    if not isinstance(soak, dict):
        return ""
    try:
        parts = [_summary(result, soak), _iterations(soak)]
        series = [s for s in soak.get("series") or [] if isinstance(s, dict)]
        for kind, caption in (
            (
                "metric",
                "Benchmark values over the iterations (dotted: iteration 1's value less the tolerance)",
            ),
            ("counter", "Error counters over the iterations (they must not grow)"),
        ):
            drawn = _plot([s for s in series if s.get("kind") == kind], figure, svg)
            if drawn:
                parts.append(f'<figure id="soak-{kind}"><figcaption>{caption}</figcaption>{drawn}</figure>')
        if not series:
            parts.append("<p>Nothing to plot: judging needs two iterations or more.</p>")
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
        why = html.escape(str(exc)[:200])
        return (
            f'<h2 id="soak">Soak</h2><p>Not drawn: this result holds values gpuval does not write ({why})</p>'
        )
    return "".join(parts)


def _summary(result: Result, soak: dict[str, Any]) -> str:
    completed = soak.get("completed", 0)
    first = soak.get("first_failing_iteration")
    headline = next((c for c in result.checks if c.name == in_family(SOAK, "iterations")), None)
    lines = [f"{completed} iteration{'s' if completed != 1 else ''} completed"]
    asked = soak.get("asked") if isinstance(soak.get("asked"), dict) else {}
    wanted = [f"{asked['iterations']} iterations"] if asked.get("iterations") else []
    if asked.get("duration_s"):
        wanted.append(f"{asked['duration_s']:g} s")
    if wanted:
        lines.append(f"asked: {' or '.join(wanted)}")
    if soak.get("stopped"):
        lines.append(cut(soak["stopped"], MAX_DETAIL))
    lines.append(f"drift tolerance {soak.get('tolerance_pct', 0):g}% from iteration 1")
    red = _VERDICT_COLOURS["FAIL"]
    first_line = (
        f'<p><strong style="color:{red}">First failing iteration: {first}</strong></p>'
        if isinstance(first, int)
        else "<p><strong>No iteration failed.</strong></p>"
    )
    detail = f"<p>{html.escape(cut(headline.detail, MAX_DETAIL))}</p>" if headline is not None else ""
    return (
        f'<h2 id="soak">Soak: {completed} iteration{"s" if completed != 1 else ""}</h2>'
        f"<p>{html.escape(' · '.join(lines))}</p>{first_line}{detail}"
    )


def _iterations(soak: dict[str, Any]) -> str:
    rows = []
    listed = [row for row in soak.get("iterations") or [] if isinstance(row, dict)]
    shown, left_out = capped(listed, MAX_ROWS)
    for row in shown:
        verdict = cut(row.get("verdict", "?"))
        colour = _VERDICT_COLOURS.get(verdict, "#6e7781")
        listed_problems = islice(row.get("problems") or [], 100)  # more would be cut below anyway
        problems = cut(", ".join(cut(p) for p in listed_problems) or "none", MAX_DETAIL)
        duration = row.get("duration_s")
        took = f"{duration:.1f} s" if isinstance(duration, (int, float)) else ""
        rows.append(
            f'<tr><td class="num">{html.escape(cut(row.get("iteration", "?")))}</td>'
            f'<td>{html.escape(cut(row.get("started_at", "")))}</td><td class="num">{took}</td>'
            f'<td class="status" style="color:{colour}">{html.escape(verdict)}</td>'
            f"<td>{html.escape(problems)}</td></tr>"
        )
    head = "".join(f"<th>{h}</th>" for h in ("iteration", "started", "took", "verdict", "its FAIL and ERROR"))
    note = f"<p>{more(left_out, 'iterations', 'result.json lists every one')}</p>" if left_out else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{note}"


def _values(series: dict[str, Any]) -> list[float | None]:
    return [
        float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None
        for v in series.get("values") or []
    ]


def _plot(
    series: list[dict[str, Any]], figure: Callable[[float, float], Any], svg: Callable[[Any], str]
) -> str:
    """One panel per judged name (a line per scope), the first failing iteration as a red dashed line; at
    most MAX_PANELS panels of MAX_LINES lines, the failing names and series first, the rest counted."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for entry in series:
        if any(v is not None for v in _values(entry)):
            by_name.setdefault(str(entry.get("name")), []).append(entry)
    if not by_name:
        return ""
    # sorted() keeps the judged order within the failing and within the passing
    panels = sorted(by_name.items(), key=lambda item: not any(map(_bad, item[1])))
    drawn = panels[:MAX_PANELS]
    left_out = sum(len(entries) for _, entries in panels[MAX_PANELS:])
    rows = math.ceil(len(drawn) / _COLUMNS)
    columns = min(_COLUMNS, len(drawn))
    fig = figure(3.8 * columns, 2.6 * rows)
    axes_grid = fig.subplots(rows, columns, squeeze=False)
    for index, (name, every) in enumerate(drawn):
        axes = axes_grid[index // columns][index % columns]
        firsts = [e["first_bad"] for e in every if isinstance(e.get("first_bad"), int)]
        failed = any(e.get("status") == "FAIL" for e in every)
        entries, hidden = capped(sorted(every, key=lambda e: not _bad(e)), MAX_LINES)
        left_out += hidden
        for number, entry in enumerate(entries):
            values = _values(entry)
            xs = [k for k, v in enumerate(values, 1) if v is not None]
            label = cut(place_of(str(entry.get("scope", ""))), 40)
            colour = f"C{number % 10}"
            marker = "o" if len(xs) <= 200 else None  # thousands of markers draw slowly and hide the line
            axes.plot(xs, [values[k - 1] for k in xs], marker=marker, markersize=3, color=colour, label=label)
            edge = entry.get("edge")
            if isinstance(edge, (int, float)) and math.isfinite(edge):
                axes.axhline(edge, color=colour, linestyle=":", linewidth=1)
        count = max(len(_values(entry)) for entry in entries)
        axes.set_xlim(0.7, count + 0.3)
        if all(entry.get("kind") == "counter" for entry in entries):
            top = max((v for entry in entries for v in _values(entry) if v is not None), default=0.0)
            span = top if top > 0 else 1.0
            axes.set_ylim(-0.05 * span, span * 1.1)  # a count that stayed at 0 shows as a line above the axis
            axes.yaxis.get_major_locator().set_params(integer=True)
        if firsts:
            first = min(firsts)
            colour = _VERDICT_COLOURS["FAIL" if failed else "WARN"]
            axes.axvline(first, color=colour, linestyle="--", linewidth=1.2)
            axes.annotate(
                f" {'first failing' if failed else 'first warning'}: {first} ",
                (first, 0.02),
                xycoords=("data", "axes fraction"),
                color=colour,
                fontsize=8,
                ha="right" if first > count / 2 else "left",
                va="bottom",
            )
        unit = cut(entries[0].get("unit") or "", 20)
        axes.set_title(cut(name, 40) + (f" ({unit})" if unit else ""), fontsize=9)
        axes.set_xlabel("iteration", fontsize=8)
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.tick_params(labelsize=7)
        if len(entries) > 1:
            axes.legend(fontsize=6, loc="best")
    for index in range(len(drawn), rows * columns):
        axes_grid[index // columns][index % columns].set_visible(False)
    note = f"<p>{more(left_out, 'series', 'result.json has every one (inventory.soak.series)')}</p>"
    return svg(fig) + (note if left_out else "")


def _bad(entry: dict[str, Any]) -> bool:
    """A series that failed or warned, or has an iteration where it turned bad."""
    return entry.get("status") in ("FAIL", "WARN") or isinstance(entry.get("first_bad"), int)

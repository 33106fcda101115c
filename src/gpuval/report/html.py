"""report.html: one self-contained page per result (no script, no network: it opens from disk).

Verdict banner, the checks that did not pass first with their hints, what each node is, then plots drawn
by matplotlib as inline SVG (text stays text, drawn in the browser's sans-serif, and searchable): busbw
against message size per collective with the profile's threshold, per-GPU matmul and HBM bars against
their median, the P2P bandwidth matrix, and training throughput with MFU.

Which plot a measurement goes to is the view its declaration names, and what is drawn are its metrics
declared `plot=True`, labelled with their declared description and unit (gpuval.metrics).

A 1,000-node result renders in seconds: tables and plots are capped, long text is cut, and each cap says
what it left out (gpuval.report.limits); result.json keeps every value.
"""

from __future__ import annotations

import html
import io
import math
import re
import statistics
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

from gpuval import metrics
from gpuval.atomic import write_text_atomic
from gpuval.forked import Later, waiting_child
from gpuval.metrics import MeasurementDecl, Metric
from gpuval.report.console import format_bound
from gpuval.report.limits import (
    MAX_BARS,
    MAX_CELL_TEXT_GPUS,
    MAX_DETAIL,
    MAX_MATRICES,
    MAX_ROWS,
    capped,
    cut,
    more,
)
from gpuval.report.soak import soak_section
from gpuval.results import Check, Measurement, Result, Status
from gpuval.scope import node_of, place_of
from gpuval.units import format_bytes, format_number

_ORDER = {Status.FAIL: 0, Status.ERROR: 1, Status.WARN: 2, Status.SKIP: 3, Status.PASS: 4}
_COLOURS = {
    Status.PASS: "#1a7f37",
    Status.FAIL: "#cf222e",
    Status.ERROR: "#8250df",
    Status.WARN: "#9a6700",
    Status.SKIP: "#6e7781",
}

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1f2328; }
main { max-width: 1180px; margin: 0 auto; padding: 0 24px 48px; }
header.verdict { color: #fff; padding: 20px 24px; }
header.verdict h1 { margin: 0 0 4px; font-size: 28px; }
header.verdict p { margin: 0; opacity: .92; }
header.verdict code { background: rgba(0, 0, 0, .25); color: #fff; }
h2 { border-bottom: 1px solid #d0d7de; padding-bottom: 4px; margin-top: 32px; }
table { border-collapse: collapse; width: 100%; margin: 8px 0; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eaeef2; vertical-align: top; }
th { background: #f6f8fa; }
td.status { font-weight: 700; white-space: nowrap; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
figure { margin: 16px 0; }
figure svg { max-width: 100%; height: auto; }
figcaption { color: #57606a; }
span.evidence { color: #57606a; font-size: 12px; }
code { background: #f6f8fa; padding: 1px 4px; border-radius: 4px; }
"""


def drawing_child() -> Later[tuple[str | None, str | None]]:
    """A child for render_html, forked now (before a large result is read: gpuval.forked says why), that
    imports matplotlib at once and draws the per-GPU and P2P plots when render_html sends it what they are
    drawn from."""
    return waiting_child(_draw_apart, warm=_import_matplotlib)


def render_html(result: Result, drawing: Later[tuple[str | None, str | None]] | None = None) -> str:
    """The whole page for `result`. With `drawing` (drawing_child), the per-GPU and P2P plots, the slowest
    part of a large result's page (8,000 GPUs and 56,000 pairs of 1,000 nodes), are drawn there from what
    is read of `result` here, while this process makes the rest; without, all here."""
    apart = (_guarded(_per_gpu_panels, result), _guarded(_p2p_pairs, result))
    if drawing is not None:
        drawing.send(*apart)
    collectives = _guarded(_collectives_plot, result)
    train = _guarded(_train_plot, result)
    before = [
        _banner(result),
        "<main>",
        _problems(result.checks),
        soak_section(result, _figure, _svg),  # '' unless the result holds a soak's iterations
        _inventory(result),
    ]
    after = [_all_checks(result.checks), "</main>"]
    per_gpu, p2p = drawing.result() if drawing is not None else _draw_apart(*apart)
    plots = [
        ("collectives", "Collectives: bus bandwidth by message size", collectives),
        ("per-gpu", "Per GPU: matmul and HBM against the median", per_gpu),
        ("p2p", "GPU-to-GPU copy bandwidth", p2p),
        ("train", "Training throughput", train),
    ]
    drawn = [
        f'<figure id="plot-{key}"><figcaption>{html.escape(caption)}</figcaption>{svg}</figure>'
        for key, caption, svg in plots
        if svg is not None
    ]
    parts = [
        *before,
        "<h2>Plots</h2>" + ("".join(drawn) or "<p>No measurement to plot in this result.</p>"),
        *after,
    ]
    title = cut(f"gpuval {result.verdict.value} · {result.profile} · {result.started_at}")
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>\n"
    )


def _draw_apart(panels: Any, pairs: Any) -> tuple[str | None, str | None]:
    """The per-GPU and P2P plots from what render_html read for them (in a child where there can be one)."""
    return _guarded(_per_gpu_draw, panels), _guarded(_p2p_draw, pairs)


def _guarded(plot: Any, result: Any) -> Any:
    """A plot (or what it is drawn from), or a line saying why it is not drawn: a result file may hold
    values gpuval never writes (the schema leaves params and settings open), and the rest of the page is
    still worth having. A line given instead of what to draw from is handed on as it is."""
    if isinstance(result, str):
        return result
    try:
        return plot(result)
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
        why = html.escape(str(exc)[:200])
        return f"<p>Not drawn: this result holds values gpuval does not write ({why}).</p>"


def _number(value: Any) -> float | None:
    """A finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _thresholds(result: Result) -> dict[str, Any]:
    return _dict(_dict(result.settings.get("profile")).get("checks"))


def write_html(
    result: Result, path: Path, drawing: Later[tuple[str | None, str | None]] | None = None
) -> Path:
    write_text_atomic(path, render_html(result, drawing))
    return path


# --- text sections ------------------------------------------------------------------------------------


def _banner(result: Result) -> str:
    counts: dict[Status, int] = defaultdict(int)
    for check in result.checks:
        counts[check.status] += 1
    summary = " · ".join(f"{counts[s]} {s.value}" for s in Status if counts[s])
    world = result.world
    line = (
        f"profile {cut(result.profile)} · {world.size} ranks on {world.nodes} node(s) · "
        f"{cut(world.backend)} · {cut(result.started_at)} · {result.duration_s:.1f} s · "
        f"gpuval {cut(result.gpuval_version)}"
    )
    command = cut(" ".join(cut(word, MAX_DETAIL) for word in result.command[:100]), MAX_DETAIL)
    return (
        f'<header class="verdict" style="background:{_COLOURS[result.verdict]}">'
        f"<h1>{result.verdict.value}</h1><p>{html.escape(summary)}</p><p>{html.escape(line)}</p>"
        f"<p><code>{html.escape(command)}</code></p></header>"
    )


def _bound_cell(threshold: dict[str, Any]) -> str:
    """The bound and, below it, what stands behind it (its evidence; the profile's whole source on hover)."""
    cell = html.escape(cut(format_bound(threshold)))
    said = threshold.get("evidence")
    if said:
        source = html.escape(cut(threshold.get("source") or said, MAX_DETAIL), quote=True)
        cell += f'<br><span class="evidence" title="{source}">{html.escape(cut(said))}</span>'
    return cell


def _check_rows(checks: list[Check], with_detail: bool) -> str:
    """A row per check, worst first: past MAX_ROWS the rest (none worse than the last shown) are counted."""
    shown, left_out = capped(sorted(checks, key=lambda c: (_ORDER[c.status], c.name, c.scope)), MAX_ROWS)
    rows = []
    for check in shown:
        value = "" if check.value is None else f"{format_number(check.value)} {cut(check.unit)}".strip()
        rows.append(
            f'<tr><td class="status" style="color:{_COLOURS[check.status]}">{check.status.value}</td>'
            f"<td>{html.escape(cut(check.name))}</td><td>{html.escape(cut(check.scope))}</td>"
            f'<td class="num">{html.escape(value)}</td><td>{_bound_cell(check.threshold)}</td>'
            + (f"<td>{html.escape(cut(check.detail, MAX_DETAIL))}</td>" if with_detail else "")
            + "</tr>"
        )
    head = "<th>status</th><th>check</th><th>scope</th><th>value</th><th>bound</th>"
    head += "<th>why / what to do</th>" if with_detail else ""
    note = f"<p>{more(left_out, 'checks', 'result.json lists every one')}</p>" if left_out else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{note}"


def _problems(checks: list[Check]) -> str:
    bad = [c for c in checks if c.status in (Status.FAIL, Status.ERROR, Status.WARN)]
    if not bad:
        return '<h2 id="problems">Problems</h2><p>None: every check passed or was skipped.</p>'
    return f'<h2 id="problems">Problems ({len(bad)})</h2>' + _check_rows(bad, with_detail=True)


def _all_checks(checks: list[Check]) -> str:
    return (
        f'<h2 id="checks">All checks ({len(checks)})</h2><details><summary>show</summary>'
        f"{_check_rows(checks, with_detail=True)}</details>"
    )


def _inventory(result: Result) -> str:
    nodes = [node for node in result.inventory.get("nodes") or [] if isinstance(node, dict)]
    if not isinstance(result.inventory.get("nodes"), list) or not nodes:
        return '<h2 id="inventory">Nodes</h2><p>No inventory in this result.</p>'
    shown, left_out = capped(nodes, MAX_ROWS)
    rows = []
    for node in shown:
        software = _dict(node.get("software"))
        gpus = node.get("gpus") if isinstance(node.get("gpus"), list) else []
        names: dict[str, int] = defaultdict(int)
        for gpu in gpus:
            names[str(_dict(gpu).get("name"))] += 1
        models = ", ".join(f"{n}× {name}" for name, n in names.items()) or "no GPU"
        comm = _dict(node.get("communication"))
        cells = [
            node.get("node", "?"),
            models,
            software.get("driver_version") or "n/a",
            software.get("cuda_runtime") or "n/a",
            software.get("nccl") or "n/a",
            software.get("torch") or "n/a",
            comm.get("profile") or "none",
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(cut(c))}</td>" for c in cells) + "</tr>")
    head = "".join(
        f"<th>{h}</th>" for h in ("node", "GPUs", "driver", "CUDA", "NCCL", "torch", "NCCL env profile")
    )
    body = "".join(rows)
    note = f"<p>{more(left_out, 'nodes', 'result.json lists every one')}</p>" if left_out else ""
    return (
        f'<h2 id="inventory">Nodes ({len(nodes):,})</h2>'
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"
    )


# --- plots ---------------------------------------------------------------------------------------------


def _import_matplotlib() -> None:  # what _figure needs: the drawing child's head start
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.figure  # noqa: F401


def _figure(width: float, height: float) -> Any:
    _import_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _svg(figure: Any) -> str:
    """The figure as an inline <svg> element (no XML prolog, ids stable from run to run)."""
    import matplotlib

    buffer = io.StringIO()
    # matplotlib warns when a layout cannot fit (a long label): the plot is drawn as it can be, and the
    # command's stderr stays for gpuval's own one line
    with matplotlib.rc_context({"svg.hashsalt": "gpuval", "svg.fonttype": "none"}), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)  # RDF naming the tool: not needed
    return text[text.index("<svg") :]


def _gpu_label(scope: str) -> str:
    """'gpu:node1/3' -> 'node1/3', cut to a label's length."""
    return cut(place_of(scope), 40)


def _shown(view: str) -> list[tuple[MeasurementDecl, Metric]]:
    """(declaration, metric) for every plotted metric of the measurements declared with `view`."""
    return [(d, m) for d in metrics.declared().values() if d.view == view for m in d.plotted()]


def _collectives_plot(result: Result) -> str | None:
    plotted = {decl.name: metric for decl, metric in _shown("size_sweep")}
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for m in result.measurements:
        metric = plotted.get(m.name)
        value = m.metrics.get(metric.key) if metric else None
        size = _number(m.params.get("bytes"))
        if value is not None and size is not None and size >= 1:
            series[m.name].append((int(size), float(value)))
    if not series:
        return None
    thresholds = _thresholds(result)
    figure = _figure(9, 4.8)
    axes = figure.subplots()
    for index, (op, points) in enumerate(sorted(series.items())):
        points.sort()
        colour = f"C{index}"
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", ms=3, color=colour, label=op)
        bound = _dict(thresholds.get(f"{op}.{plotted[op].key}"))
        if _number(bound.get("min")) is not None:
            axes.axhline(bound["min"], color=colour, ls="--", lw=0.8)
            if (_number(bound.get("bytes")) or 0) >= 1:
                axes.plot([bound["bytes"]], [bound["min"]], marker="v", color=colour, ms=8)
    axes.set_xscale("log", base=2)
    ticks = sorted({p[0] for points in series.values() for p in points})
    shown = ticks[:: max(1, len(ticks) // 10)]
    axes.set_xticks(shown, [format_bytes(t) for t in shown], rotation=30)
    axes.set_xlabel("message size (per rank)")
    axes.set_ylabel(" / ".join(sorted({f"{plotted[op].description} ({plotted[op].unit})" for op in series})))
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(title="dashed: profile minimum ▼ at its size", fontsize=8, title_fontsize=8)
    return _svg(figure)


_Panels = tuple[list[tuple[str, str, str, list[tuple[str, float]]]], dict[str, Any]]


def _per_gpu_panels(result: Result) -> _Panels:
    """(name, metric, label, [(GPU, value)]) for every per-GPU metric measured, and the profile's bounds."""
    panels: list[tuple[str, str, str, list[tuple[str, float]]]] = []
    for decl, declared in _shown("per_gpu"):
        metric = declared.key
        values = [
            (_gpu_label(m.scope), float(m.metrics[metric]))
            for m in result.measurements
            if m.name == decl.name and m.metrics.get(metric) is not None
        ]
        if values:
            panels.append((decl.name, metric, f"{declared.description} ({declared.unit})", values))
    return panels, _thresholds(result)


def _per_gpu_draw(prepared: _Panels) -> str | None:
    panels, thresholds = prepared
    if not panels:
        return None
    figure = _figure(9, 2.6 * len(panels))
    axes_list = figure.subplots(len(panels), 1, squeeze=False)[:, 0]
    for axes, (name, metric, label, values) in zip(axes_list, panels, strict=True):
        numbers = [v[1] for v in values]
        median = statistics.median(numbers)
        if len(values) > MAX_BARS:
            _sorted_line(axes, values, metrics.direction(name, metric))
        else:
            axes.bar([v[0] for v in values], numbers, color="C0")
        axes.axhline(median, color="k", lw=1, label=f"median {median:.4g}")
        bound = _dict(thresholds.get(f"{name}.{metric}"))
        minimum = _number(bound.get("min"))
        if minimum is not None:
            axes.axhline(minimum, color="C3", ls="--", lw=1, label=f"profile minimum {minimum:g}")
        low, high = min(numbers + [minimum or min(numbers)]), max(numbers)
        if low > 0:
            axes.set_ylim(low * 0.9, high * 1.04)
        else:  # zero or negative values (not a measurement gpuval writes): a margin around them
            span = (max(high, minimum or high) - low) or 1.0
            axes.set_ylim(low - 0.1 * span, max(high, minimum or high) + 0.05 * span)
        axes.set_ylabel(label, fontsize=8)
        axes.legend(fontsize=8, loc="lower right")
        axes.tick_params(axis="x", labelsize=8)
    return _svg(figure)


def _sorted_line(axes: Any, values: list[tuple[str, float]], direction: int) -> None:
    """Many GPUs' values as one line, sorted from the worst (`direction` +1: higher is better), the three
    worst named: thousands of labelled bars would take minutes to lay out and could not be read."""
    ordered = sorted(values, key=lambda v: v[1] * (direction or 1))
    axes.plot(
        range(1, len(ordered) + 1), [v[1] for v in ordered], lw=1, color="C0"
    )  # no markers: thousands take seconds
    for rank, (label, number) in enumerate(ordered[:3], 1):
        axes.annotate(label, (rank, number), fontsize=7, xytext=(4, 4 * rank), textcoords="offset points")
    axes.set_xlabel(f"{len(values):,} GPUs, worst first", fontsize=8)


_Pairs = tuple[dict[str, dict[tuple[int, int], float]], set[str]]


def _p2p_pairs(result: Result) -> _Pairs:
    """Every node's measured copies, {node: {(src, dst): value}}, and their units."""
    plotted = {decl.name: metric for decl, metric in _shown("pair_matrix")}
    by_node: dict[str, dict[tuple[int, int], float]] = defaultdict(dict)
    units = set()
    for m in result.measurements:
        metric = plotted.get(m.name)
        copy = m.metrics.get(metric.key) if metric else None
        src, dst = m.params.get("src"), m.params.get("dst")
        if metric and copy is not None and _is_index(src) and _is_index(dst):
            units.add(metric.unit)
            node = node_of(m.scope) or m.scope
            by_node[node][(int(src), int(dst))] = float(copy)
    return by_node, units


def _p2p_draw(pairs: _Pairs) -> str | None:
    """The matrices of the nodes with the weakest link (all of them up to MAX_MATRICES)."""
    by_node, units = pairs
    if not by_node:
        return None
    import numpy as np

    # the nodes with the weakest link, worst first; by name where every node is drawn
    drawn = sorted(by_node.items(), key=lambda item: (min(item[1].values()), item[0]))[:MAX_MATRICES]
    if len(by_node) <= MAX_MATRICES:
        drawn.sort()
    figure = _figure(4.2 * len(drawn) + 1, 4)
    axes_list = figure.subplots(1, len(drawn), squeeze=False)[0]
    for axes, (node, pairs) in zip(axes_list, drawn, strict=True):
        gpus = sorted({g for pair in pairs for g in pair})
        where = {gpu: position for position, gpu in enumerate(gpus)}
        matrix = np.full((len(gpus), len(gpus)), np.nan)
        for (src, dst), value in pairs.items():
            matrix[where[src], where[dst]] = value
        # from 0: a weak link stands out by how much it lacks, equal links look equal
        image = axes.imshow(matrix, cmap="viridis", vmin=0, vmax=np.nanmax(matrix))
        if len(gpus) <= MAX_CELL_TEXT_GPUS:  # more cells than that are too small to write in
            for i in range(len(gpus)):
                for j in range(len(gpus)):
                    if not np.isnan(matrix[i, j]):
                        light = matrix[i, j] > 0.6 * np.nanmax(matrix)  # viridis turns yellow up there
                        colour = "k" if light else "w"
                        axes.text(
                            j, i, f"{matrix[i, j]:.0f}", ha="center", va="center", color=colour, fontsize=8
                        )
            axes.set_xticks(range(len(gpus)), [f"GPU{g}" for g in gpus])
            axes.set_yticks(range(len(gpus)), [f"GPU{g}" for g in gpus])
        axes.set_xlabel("destination")
        axes.set_ylabel("source")
        axes.set_title(cut(node, 40), fontsize=9)
        figure.colorbar(image, ax=axes, label=cut(" / ".join(sorted(units))))
    note = (
        f"<p>The {len(drawn)} nodes with the weakest link, of {len(by_node):,}; "
        f"{more(len(by_node) - len(drawn), 'nodes', 'result.json has every pair')}.</p>"
        if len(by_node) > len(drawn)
        else ""
    )
    return note + _svg(figure)


def _is_index(value: Any) -> bool:
    """A GPU index as gpuval writes it (a small int ≥ 0)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 4096


def _train_plot(result: Result) -> str | None:
    plotted = {decl.name: metric for decl, metric in _shown("throughput")}
    measured: list[tuple[Measurement, str]] = [
        (m, plotted[m.name].key)
        for m in result.measurements
        if m.name in plotted and m.metrics.get(plotted[m.name].key)
    ]
    if not measured:
        return None
    runs, left_out = capped(measured, MAX_BARS)
    figure = _figure(7, 3.2)
    axes = figure.subplots()
    labels, values, low, high, mfu = [], [], [], [], []
    for m, key in runs:
        p = m.params
        labels.append(cut(f"{p.get('model', '?')} {p.get('mode', '')} ×{p.get('world_size', 1)}".strip(), 40))
        value = float(m.metrics[key])
        values.append(value)
        low.append(max(0.0, value - float(m.metrics.get(f"{key}_min") or value)))
        high.append(max(0.0, float(m.metrics.get(f"{key}_max") or value) - value))
        mfu.append(m.metrics.get("mfu_pct"))
    bars = axes.bar(labels, values, yerr=[low, high], capsize=4, color="C2")
    for bar, share in zip(bars, mfu, strict=True):
        text = f"MFU {share:.1f}%" if share is not None else "MFU n/a (CPU)"
        axes.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
    axes.set_ylabel(" / ".join(sorted({f"{plotted[m.name].description} (median, min-max)" for m, _ in runs})))
    note = f"<p>{more(left_out, 'training runs', 'result.json has every one')}</p>" if left_out else ""
    return note + _svg(figure)

"""Rich tables for people: checks with the verdict, and each benchmark's measurements."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement as Span  # gpuval.results has a Measurement of its own
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from gpuval import metrics
from gpuval.checks import gap_to_median_pct
from gpuval.results import Check, Measurement, Result, Status
from gpuval.scope import Scope
from gpuval.units import format_bytes, format_number

STYLE = {
    Status.PASS: "green",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
    Status.WARN: "yellow",
    Status.SKIP: "dim",
}
_ORDER = {Status.FAIL: 0, Status.ERROR: 1, Status.WARN: 2, Status.SKIP: 3, Status.PASS: 4}


class WholeLineProgress(Progress):
    """rich's Progress, whose last frame ends its line in the same write.

    Into a pipe or a file, rich writes the final frame and then, in a second write, the newline that ends
    it. A rank stopped between the two (the launcher stops the others when one dies) left the line open,
    and the launcher's one `gpuval:` line was glued to the end of a progress bar. Inside the console's
    buffer both go out in one write.
    """

    def stop(self) -> None:
        with self.console:
            super().stop()


# A hint column narrower than this wraps a word or two a line (7 characters at 80 columns): the hints go
# below the table instead, numbered from the status cell, each a paragraph the console's width.
HINT_COLUMN_MIN_WIDTH = 40


def print_result(result: Result, console: Console, title: str | None = None) -> None:
    """The checks, worst first, and the verdict; `title` defaults to the accept run's world. Each check
    not PASS says why and what to do: in a column where the console is wide enough, else below the table."""
    heading = escape(  # names and details come from profiles, nodes and files: never rich markup
        title
        or f"gpuval accept · profile {result.profile} · {result.world.size} ranks on "
        f"{result.world.nodes} node(s) · {result.world.backend}"
    )
    checks = sorted(result.checks, key=lambda c: (_ORDER[c.status], c.name, c.scope))
    hints = ["" if check.status is Status.PASS else _hint(check) for check in checks]  # a PASS needs none
    bare = _check_table(heading, checks, hints=None)
    room = console.width - Span.get(console, console.options, bare).maximum - 3  # "│" and padding
    if room >= HINT_COLUMN_MIN_WIDTH or not any(hints):
        console.print(_check_table(heading, checks, hints))
    else:
        numbers = _numbered(hints)
        console.print(_check_table(heading, checks, hints=None, numbers=numbers))
        console.print(_hint_list(hints, numbers))
    counts = defaultdict(int)
    for check in result.checks:
        counts[check.status] += 1
    summary = " · ".join(f"{counts[s]} {s.value}" for s in Status if counts[s])
    console.print(
        f"[{STYLE[result.verdict]}]{result.verdict.value}[/] ({summary}) in {result.duration_s:.1f} s"
    )


def _hint(check: Check) -> str:
    """Why a check did not pass, and, where it crossed its bound, what stands behind that bound (the
    profile's evidence: how many clean runs on how many nodes, or set by hand)."""
    said = check.threshold.get("evidence")
    if check.status in (Status.FAIL, Status.WARN) and check.value is not None and said:
        return f"{check.detail} [bound: {said}]"
    return check.detail


def _check_table(
    heading: str, checks: list[Check], hints: list[str] | None, numbers: list[int | None] | None = None
) -> Table:
    """A row per check; the hints as the last column when given; `numbers` after the status, where each
    row's hint stands below the table."""
    table = Table(title=heading, title_justify="left")
    for column in ("status", "check", "scope"):
        table.add_column(column, no_wrap=True)
    for column in ("value", "bound", *(("why / what to do",) if hints is not None else ())):
        table.add_column(column, overflow="fold")
    for row, check in enumerate(checks):
        value = "" if check.value is None else f"{format_number(check.value)} {check.unit}".strip()
        number = numbers[row] if numbers else None
        table.add_row(
            f"[{STYLE[check.status]}]{check.status.value}[/]" + (f" {number}" if number else ""),
            escape(check.name),
            escape(check.scope),
            escape(value),
            escape(format_bound(check.threshold)),
            *((escape(hints[row]),) if hints is not None else ()),
        )
    return table


def _numbered(hints: list[str]) -> list[int | None]:
    """1, 2, … for the rows that have a hint, in the table's order, one number per distinct hint (ten
    checks skipped for want of a driver share one line below the table); None for the rows without."""
    first: dict[str, int] = {}
    for hint in hints:
        if hint and hint not in first:
            first[hint] = len(first) + 1
    return [first.get(hint) if hint else None for hint in hints]


def _hint_list(hints: list[str], numbers: list[int | None]) -> Table:
    """'1  <hint>' a paragraph each, wrapped at the console's width under its own first word."""
    listing = Table.grid(padding=(0, 1))
    listing.add_column(justify="right", no_wrap=True)
    listing.add_column(overflow="fold")
    for number, hint in sorted({n: h for h, n in zip(hints, numbers, strict=True) if n is not None}.items()):
        listing.add_row(str(number), Text(hint))
    return listing


def format_bound(threshold: dict) -> str:
    """{'min': 340, 'bytes': 1073741824} -> '>= 340 @ 1 GiB'."""
    parts = [
        f"{symbol} {format_number(threshold[key])}"
        for key, symbol in (("min", ">="), ("max", "<="), ("equal", "="))
        if isinstance(threshold.get(key), (int, float))
    ]
    if "match" in threshold:
        parts.append(f"~ {threshold['match']}")
    size = threshold.get("bytes")
    if isinstance(size, int) and not isinstance(size, bool):
        parts.append(f"@ {format_bytes(size)}")
    elif size is not None:  # not what gpuval writes: shown as it is
        parts.append(f"@ {size}")
    return " ".join(parts)


def print_measurements(bench: str, measurements: list[Measurement], console: Console) -> None:
    """`bench`'s measurements, each by the renderer of the view its declaration names (gpuval.metrics)."""
    by_view: dict[str, list[Measurement]] = defaultdict(list)
    for m in measurements:
        by_view[metrics.view(m.name)].append(m)
    for view, items in by_view.items():
        _RENDERERS.get(view, _generic)(items, console)


def _collectives(measurements: list[Measurement], console: Console) -> None:
    """nccl-tests' table: size, count, type, redop, root, then time, algbw, busbw and #wrong under the
    placement measured (out-of-place or in-place), and its `# Avg bus bandwidth` line under each op."""
    by_op: dict[tuple[str, str], list[Measurement]] = defaultdict(list)
    for m in measurements:
        by_op[(m.name, m.scope)].append(m)
    for (op, scope), items in by_op.items():
        first = items[0].params
        placement = "in-place" if first.get("in_place") else "out-of-place"
        title = f"{op} · {scope} · {first.get('ranks')} ranks · {placement}"
        table = Table(title=title, title_justify="left")
        for column in ("size", "count", "type", "redop", "root"):
            table.add_column(column, justify="right")
        for column in ("time (us)", "spread (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"):
            table.add_column(column, justify="right", header_style="bold")
        rows = sorted(items, key=lambda m: m.params["bytes"])
        for m in rows:
            x, p = m.metrics, m.params
            wrong = int(x.get("wrong_elements") or 0)
            table.add_row(
                format_bytes(p["bytes"]),
                str(p.get("count", "")),
                _NCCL_TYPES.get(str(p.get("dtype")), str(p.get("dtype"))),
                str(p.get("redop", "")),
                str(p.get("root", "")),
                f"{x['time_us']:.1f}",
                f"{x['time_us_min']:.1f}–{x['time_us_max']:.1f}",
                f"{x['algbw_gbps']:.2f}",
                f"{x['busbw_gbps']:.2f}",
                f"[bold red]{wrong}[/]" if wrong else "0",
            )
        console.print(table)
        # nccl-tests' summary: the plain mean of busbw over every size of the sweep
        average = sum(m.metrics["busbw_gbps"] for m in rows) / len(rows)
        wrong = sum(int(m.metrics.get("wrong_elements") or 0) for m in rows)
        console.print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}", highlight=False)
        console.print(f"# Avg bus bandwidth    : {average:.2f} GB/s", highlight=False)


# torch dtype -> the type name nccl-tests prints
_NCCL_TYPES = {"float32": "float", "bfloat16": "bfloat16", "float16": "half"}


def _per_gpu(measurements: list[Measurement], console: Console) -> None:
    """A row per GPU and a column per declared metric measured; the first plotted metric's slowest GPU."""
    for title in dict.fromkeys(m.name for m in measurements):
        decl = metrics.measurement(title)
        declared = [metric.key for metric in decl.metrics] if decl else []
        rows = [m for m in measurements if m.name == title]
        shown = [name for name in declared if any(name in m.metrics for m in rows)]
        table = Table(title=title, title_justify="left")
        table.add_column("scope")
        for name in shown:
            table.add_column(name, justify="right")
        for m in rows:
            table.add_row(
                m.scope, *(f"{m.metrics[n]:.4g}" if m.metrics.get(n) is not None else "–" for n in shown)
            )
        console.print(table)
        plotted = decl.plotted() if decl else []
        outlier_metric = plotted[0].key if plotted else ""
        values = [m.metrics[outlier_metric] for m in rows if m.metrics.get(outlier_metric) is not None]
        if len(values) > 1:
            console.print(f"slowest {outlier_metric} is {gap_to_median_pct(values):.1f}% below the median")
        best = [m for m in rows if m.params.get("best_shape")]
        if best:
            console.print(
                f"best shapes ({best[0].scope}): "
                + ", ".join(f"{d} {'x'.join(map(str, s))}" for d, s in best[0].params["best_shape"].items())
            )


def _p2p(measurements: list[Measurement], console: Console) -> None:
    by_node: dict[str, dict[tuple[int, int], float]] = defaultdict(dict)
    for m in measurements:
        node = Scope.parse(m.scope).node
        by_node[node][(m.params["src"], m.params["dst"])] = m.metrics["copy_gbps"]
    for node, pairs in by_node.items():
        gpus = sorted({i for pair in pairs for i in pair})
        table = Table(
            title=f"p2p copy GB/s · {node} · rows = source, columns = destination", title_justify="left"
        )
        table.add_column("")
        for gpu in gpus:
            table.add_column(f"gpu{gpu}", justify="right")
        for src in gpus:
            table.add_row(
                f"gpu{src}",
                *("–" if src == dst else f"{pairs.get((src, dst), float('nan')):.1f}" for dst in gpus),
            )
        console.print(table)


def _generic(measurements: list[Measurement], console: Console) -> None:
    table = Table()
    for column in ("name", "scope", "params", "metrics"):
        table.add_column(column, overflow="fold")
    for m in measurements:
        table.add_row(
            m.name,
            m.scope,
            str(m.params),
            ", ".join(
                f"{k}={v:.4g} {metrics.unit(m.name, k)}".rstrip()
                for k, v in m.metrics.items()
                if v is not None
            ),
        )
    console.print(table)


# by the view a measurement's declaration names (gpuval.metrics.VIEWS); any other view: _generic
_RENDERERS = {
    "size_sweep": _collectives,
    "per_gpu": _per_gpu,
    "pair_matrix": _p2p,
    "none": lambda measurements, console: None,  # kept in the JSON only (matmul's whole sweep)
}


if TYPE_CHECKING:  # the compare table only names the type: report.compare stays unimported until used
    from gpuval.report.compare import Row, Summary


def print_comparison(
    rows: list[Row],
    unmatched: dict[str, int],
    before: str,
    after: str,
    console: Console,
    summaries: list[Summary],
    every: bool = False,
) -> None:
    """`gpuval compare`: a row per measurement both runs share (report.compare's summaries) with its
    headline metric in A and B, the change and the measurement's verdict, green when better and red when
    worse; with `every`, a row per compared metric (report.compare's rows). Then the totals.

    Past MAX_ROWS rows (a 1,000-node run has ~75,000 measurements) the worse are shown first, then the
    better, then the unchanged, and a line counts the rest: `--json` lists every one."""
    from gpuval.report.compare import totals
    from gpuval.report.limits import MAX_ROWS, cut, more

    table = Table(title=escape(f"gpuval compare · A {cut(before)} → B {cut(after)}"), title_justify="left")
    for column in ("measurement", "scope", "which", "metric"):
        table.add_column(column, overflow="fold")
    for column in ("A", "B", "change"):
        table.add_column(column, justify="right", no_wrap=True)
    if every:
        listed, rank = rows, lambda row: {False: 0, True: 1}.get(row.better, 2)
    else:
        listed, rank = summaries, lambda summary: {"worse": 0, "better": 1}.get(summary.verdict, 2)
    # past MAX_ROWS the worse first, then the better, then the rest (sorted keeps each in its order)
    shown = listed if len(listed) <= MAX_ROWS else sorted(listed, key=rank)[:MAX_ROWS]

    # cells as Text, never markup: names from the file are shown as they are, and a thousand rows are not
    # parsed for markup and emoji (a quarter of the table's time)
    def named(item: Row | Summary) -> list[Text]:
        names = [Text(cut(value)) for value in (item.name, item.scope, item.identity, item.metric)]
        return [*names, Text(f"{item.before:.4g}"), Text(f"{item.after:.4g}")]

    if every:
        for row in shown:
            style = {True: "green", False: "red", None: "dim"}[row.better]
            change = f"{row.change_pct:+.1f} %" if row.change_pct is not None else "new from 0"
            table.add_row(*named(row), Text(f"{row.after - row.before:+.4g} ({change})", style=style))
    else:
        table.add_column("verdict", overflow="fold")
        for summary in shown:
            style = {"better": "green", "worse": "red", "same": "dim"}[summary.verdict]
            change = f"{summary.change_pct:+.1f} %" if summary.change_pct is not None else "new from 0"
            # a measurement worse on another metric than the one shown says which
            hidden = summary.worse and summary.metric not in summary.worse
            verdict = f"worse: {', '.join(summary.worse)}" if hidden else summary.verdict
            table.add_row(*named(summary), Text(change, style=style), Text(cut(verdict), style=style))
    console.print(table)
    if len(shown) < len(listed):
        noun = "metrics" if every else "measurements"
        console.print(more(len(listed) - len(shown), noun, "gpuval compare --json lists every one"))
    if every:
        better = sum(row.better is True for row in rows)
        worse = sum(row.better is False for row in rows)
        console.print(
            f"{len(rows)} metrics compared: {better} better, {worse} worse, {len(rows) - better - worse} "
            "unchanged or not judged"
        )
    count = totals(summaries, unmatched)
    console.print(
        f"{_count(count['compared'], 'measurement')} compared: {_count(count['regressions'], 'regression')}, "
        f"{_count(count['improvements'], 'improvement')}, {count['unchanged']} unchanged; "
        f"{count['only_before']} only in A, {count['only_after']} only in B"
    )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def print_history(
    path: Path,
    listed: list[dict[str, Any]],
    node: str,
    series: list[dict[str, Any]],
    last: int,
    console: Console,
) -> None:
    """`gpuval history`: the runs (history.runs) and the node's trend per check (history.trends), a GPU's
    by its UUID (short form) and the node it was last measured on. What the file holds is shown as text
    (escaped, cut to a cell's length), at most MAX_ROWS trends: `--json` lists every one."""
    from gpuval.history import short_uuid
    from gpuval.report.limits import MAX_ROWS, cut, more

    table = Table(title=escape(f"gpuval history · {path}"), title_justify="left")
    for column in ("run", "started", "profile", "verdict", "nodes"):
        table.add_column(column)
    for run in listed:
        table.add_row(*(escape(cut(run[key])) for key in ("id", "started_at", "profile", "verdict", "nodes")))
    console.print(table)
    trend_table = Table(title=escape(f"trends · node {cut(node)} · last {last} runs"), title_justify="left")
    gpus = any(item.get("gpu_uuid") for item in series)  # a gpu column where some GPU is known by UUID
    trend_table.add_column("check", no_wrap=True)
    trend_table.add_column("scope", no_wrap=True)
    for column in ("gpu",) * gpus + ("node", "values, oldest first", "median"):
        trend_table.add_column(column, overflow="fold")
    trend_table.add_column("latest vs median", justify="right")
    for item in series[:MAX_ROWS]:
        change = item["latest_vs_median_pct"]
        trend_table.add_row(
            escape(cut(item["name"])),
            escape(cut(item["scope"])),
            *((escape(cut(short_uuid(item["gpu_uuid"]))) if item.get("gpu_uuid") else "",) * gpus),
            escape(cut(item.get("node", ""))),
            " ".join(format_number(v) for v in item["values"]),
            escape(f"{format_number(item['median'])} {cut(item['unit'])}".strip()),
            "" if change is None else f"{change:+.1f} %",
        )
    console.print(trend_table)
    if len(series) > MAX_ROWS:
        console.print(more(len(series) - MAX_ROWS, "trends", "gpuval history --json lists every one"))

"""`gpuval fleet`: many nodes' result.json in one verdict: what to drain, what to run again, which nodes are
quietly slower than their peers (gpuval.fleet)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpuval.cli.options import (
    TextfileOption,
    console,
    default_result_dir,
    exits,
    output_dir,
    say,
    say_written,
)

if TYPE_CHECKING:
    from gpuval.fleet.judge import Summary

CONSOLE_ROWS = 40  # nodes listed on the console; fleet.html and fleet.json list every one
CONSOLE_NOTES = 20


@exits
def fleet(
    paths: Annotated[
        list[Path],
        typer.Argument(
            metavar="PATH",
            help="result.json files, or folders searched for them (one per node, as a Slurm array or an "
            "Indexed Job leaves them)",
        ),
    ],
    output: Annotated[
        Path | None, output_dir("fleet.json, fleet.html and junit.xml", "gpuval-results/fleet-<UTC time>")
    ] = None,
    expect: Annotated[
        str | None,
        typer.Option(
            metavar="HOSTLIST|FILE",
            help="the nodes that should have reported, as a Slurm hostlist (node[001-200], "
            "$SLURM_JOB_NODELIST) or a file of names, one a line (@FILE or its path): a node with no "
            "result is MISSING",
        ),
    ] = None,
    fail_outliers: Annotated[
        bool,
        typer.Option(
            "--fail-outliers", help="a fleet outlier FAILs its node (and drains it) instead of a WARN"
        ),
    ] = False,
    json_: Annotated[
        bool, typer.Option("--json", help="print fleet.json to stdout instead of the table")
    ] = False,
    textfile: TextfileOption = None,
) -> int:
    """One verdict for many nodes: each node as its newest run judged it, and against its peers by median
    and MAD; writes fleet.json (the drain list as a Slurm hostlist), fleet.html and junit.xml. Exit 0 every
    node PASS, 1 a node FAILed, 2 bad input, 3 a node ERROR or MISSING (docs/fleet.md)."""
    from gpuval.atomic import ensure_writable_dir
    from gpuval.fleet.document import document
    from gpuval.fleet.judge import Rule, summarize
    from gpuval.fleet.read import read_expected, read_runs
    from gpuval.fleet.write import write_fleet
    from gpuval.result_files import find_result_files
    from gpuval.textfile import fleet_textfile

    if textfile is not None:
        ensure_writable_dir(textfile, "--textfile")
    expected = read_expected(expect) if expect is not None else None
    files = find_result_files(paths)
    summary = summarize(read_runs(files), len(files), expected, Rule(fail=fail_outliers))
    target = output or default_result_dir("fleet")
    command = ["gpuval", *sys.argv[1:]]
    written = write_fleet(summary, target, command)
    if textfile is not None:  # the fleet's view for the head node's node_exporter (docs/monitoring.md)
        written.append(fleet_textfile(textfile, json.loads(document(summary, command).to_json())))
    if json_:
        sys.stdout.write(document(summary, command).to_json())
    else:
        print_fleet(summary)
        say_written(written)
    return summary.exit_code


def print_fleet(summary: Summary) -> None:
    """What needs attention as a table, then the counts, the drain list and the notes."""
    from rich.table import Table
    from rich.text import Text

    from gpuval.fleet.hostlist import compress
    from gpuval.fleet.html import COLOURS
    from gpuval.fleet.judge import MISSING, ORDER

    needing = [node for node in summary.nodes if node.verdict != "PASS"]
    if needing:
        table = Table(
            title=f"needs attention: {len(needing)} of {len(summary.nodes)} nodes", title_justify="left"
        )
        table.add_column("verdict", no_wrap=True)
        table.add_column("node", no_wrap=True)
        table.add_column("why")
        for node in needing[:CONSOLE_ROWS]:
            reasons = node.reasons()
            more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
            table.add_row(
                f"[bold {COLOURS[node.verdict]}]{node.verdict}[/]",
                Text(node.name),
                Text((reasons[0] if reasons else "") + more),
            )
        console.print(table)
        if len(needing) > CONSOLE_ROWS:
            say(f"... {len(needing) - CONSOLE_ROWS} more in fleet.html and fleet.json")
    counts = summary.counts
    say(
        f"{counts['nodes']} nodes from {summary.files} result files: "
        + ", ".join(f"{counts[verdict]} {verdict}" for verdict in ORDER if counts[verdict]),
        soft_wrap=True,
    )
    say(f"drain: {summary.drain or 'none'}", soft_wrap=True)
    for verdict, why in (("ERROR", "their run did not complete"), (MISSING, "no result")):
        if counts[verdict]:
            say(f"run again ({why}): {compress(summary.names(verdict))}", soft_wrap=True)
    say(summary.rule_note, soft_wrap=True)
    for note in summary.notes[:CONSOLE_NOTES]:
        say(note, soft_wrap=True)
    if len(summary.notes) > CONSOLE_NOTES:
        say(f"... {len(summary.notes) - CONSOLE_NOTES} more notes in fleet.json", soft_wrap=True)

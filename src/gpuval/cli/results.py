"""Commands on files gpuval wrote: report, compare, history; and what it ships: schema, profiles."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from gpuval.cli.options import Command, Group, HistoryOption, console, exits, output_file, say
from gpuval.errors import EXIT_FAIL, EXIT_PASS, UsageError, one_line

profiles_app = typer.Typer(
    cls=Group,
    subcommand_metavar="[COMMAND] [ARGS]...",  # without one: list
    help="The built-in profiles: list them (the default), derive one from clean runs, or write the table "
    "of their bounds.",
)


def _write(output: Path, text: str) -> None:
    """`text` into the --output file, all or nothing; a file that cannot be written is a usage error."""
    from gpuval.atomic import write_text_atomic

    try:
        write_text_atomic(output, text)
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}: choose another --output") from None


@profiles_app.callback(invoke_without_command=True)
def profiles(ctx: typer.Context) -> None:
    """`gpuval profiles` alone lists them, as `gpuval profiles list` does."""
    if ctx.invoked_subcommand is None:
        profiles_list()


@profiles_app.command("list", cls=Command)
@exits
def profiles_list() -> int:
    """Each built-in profile's name and what it is for (`gpuval profiles` alone does the same)."""
    from gpuval.config import builtin_profiles, load_profile

    for name in builtin_profiles():
        console.print(f"[bold]{name}[/]: {load_profile(name).description}")
    return EXIT_PASS


@profiles_app.command("derive", cls=Command)
@exits
def profiles_derive(
    runs: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="RUNS",
            help="result.json files (or gpuval bench --output documents) of clean runs of healthy nodes, or "
            "folders searched for result.json (one per node, as a Slurm array or an Indexed Job leaves them)",
        ),
    ] = None,
    output: Annotated[Path | None, output_file("the derived profile YAML")] = None,
    base: Annotated[
        str | None,
        typer.Option(
            metavar="NAME|FILE",
            help="profile whose checks are derived, and whose other fields are kept (default: the profile "
            "the runs were judged by, else the one matching their GPUs)",
        ),
    ] = None,
    k: Annotated[
        float,
        typer.Option(
            metavar="N", help="standard deviations between the worst clean value and the bound", min=0
        ),
    ] = 3.0,
    min_runs: Annotated[
        int, typer.Option(metavar="N", help="runs a bound needs, per GPU count where it depends on it", min=2)
    ] = 3,
    margin: Annotated[
        float,
        typer.Option(
            metavar="FRACTION",
            help="least gap between a bound and the worst clean value, as a fraction of it",
            min=0,
            max=0.99,
        ),
    ] = 0.03,
    keep: Annotated[
        list[str] | None,
        typer.Option(
            metavar="GLOB",
            help="a check (glob) not derived from any run: the base's hand-set bound stays (repeatable)",
        ),
    ] = None,
    manifest: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="derive every profile a manifest lists from its runs and rewrite it in place "
            "(benchmarks/derivation.yaml); no RUNS, no --output",
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="with --manifest: write nothing; exit 1 where a profile's bounds differ"
        ),
    ] = False,
) -> int:
    """Derive a profile's bounds from clean runs: outliers left out and named, floor = worst value - k x sd
    per check, per GPU count for collectives and P2P, a floor that would pass a GPU at half speed refused;
    each bound names the runs, nodes and spread it came from (docs/thresholds.md)."""
    from gpuval.atomic import write_texts_atomic
    from gpuval.derive import Rule, base_for, derive_profile
    from gpuval.derive_manifest import drifted, from_manifest
    from gpuval.derive_runs import load_run
    from gpuval.result_files import find_result_files

    notes: list[str] = []
    if manifest is not None:
        if runs or output is not None:
            raise UsageError("--manifest names the runs and the outputs itself: drop RUNS and --output")
        try:
            derived = from_manifest(manifest, notes=notes)
        finally:  # what was left out or refused, also when a later check stops the derivation
            for line in notes:
                say(line, soft_wrap=True)
        if check:
            stale = [(one, names) for one in derived if (names := drifted(one))]
            for one, names in stale:
                say(
                    f"gpuval: {one.path}: {', '.join(names)} no longer follow from the runs",
                    err=True,
                    soft_wrap=True,
                )
            if not stale:
                say(f"every profile of {manifest} follows from its runs", soft_wrap=True)
            return EXIT_FAIL if stale else EXIT_PASS
        try:  # every profile derived, then all written or none: an error leaves all as they were
            write_texts_atomic({one.path: one.text for one in derived})
        except OSError as exc:
            raise UsageError(
                f"cannot write {exc.filename or 'a profile'}: {exc.strerror or exc}: no profile of "
                f"{manifest} was changed; make their folders writable"
            ) from None
        for one in derived:
            say(f"wrote {one.path}", soft_wrap=True)
        return EXIT_PASS
    if check:
        raise UsageError("--check compares the profiles of a --manifest: pass --manifest FILE")
    if not runs:
        raise UsageError("no runs given: pass the result.json files of clean runs (or --manifest FILE)")
    if output is None:
        raise UsageError("pass --output FILE for the derived profile")
    if output.is_dir():
        raise UsageError(f"--output '{output}' is a directory; give a file name, e.g. {output}/profile.yaml")
    loaded = [load_run(path, skip=frozenset(keep or [])) for path in find_result_files(runs)]
    rule = Rule(k=k, min_runs=min_runs, margin=margin)
    base_path = base_for(loaded, base)
    try:
        text, _, profile = derive_profile(base_path, loaded, rule, notes=notes)
    finally:
        for line in notes:
            say(line, soft_wrap=True)
    _write(output, text)
    say(
        f"wrote {output}: {len(profile.checks)} checks from {len(loaded)} runs, over the base {base_path}",
        soft_wrap=True,
    )
    return EXIT_PASS


@profiles_app.command("table", cls=Command)
@exits
def profiles_table(
    output: Annotated[Path | None, output_file("the document", "print it")] = None,
    manifest: Annotated[
        Path,
        typer.Option(
            metavar="FILE", help="the manifest the profiles' bounds are derived from (runs, rule, skips)"
        ),
    ] = Path("benchmarks/derivation.yaml"),
    check: Annotated[
        bool, typer.Option("--check", help="write nothing; exit 1 where --output differs from the profiles")
    ] = False,
) -> int:
    """Write docs/thresholds.md from the built-in profiles: every bound, how it was made and the runs it
    came from, linked (`gpuval profiles table --output docs/thresholds.md`)."""
    from gpuval.threshold_table import COMMAND, render

    if output is not None and output.is_dir():
        raise UsageError(f"--output '{output}' is a directory; give a file name, e.g. {output}/thresholds.md")
    text = render(manifest, (output.parent if output is not None else Path.cwd()))
    if check:
        if output is None:
            raise UsageError("--check compares the profiles with a document: pass --output FILE")
        if not output.is_file() or output.read_text(encoding="utf-8") != text:
            say(
                f"gpuval: {output} differs from what the profiles give now: run `{COMMAND}`",
                err=True,
                soft_wrap=True,
            )
            return EXIT_FAIL
        say(f"{output} is what the profiles give", soft_wrap=True)
        return EXIT_PASS
    if output is None:
        sys.stdout.write(text)
        return EXIT_PASS
    _write(output, text)
    say(f"wrote {output}", soft_wrap=True)
    return EXIT_PASS


@exits
def report(
    result: Annotated[
        Path, typer.Argument(metavar="RESULT", help="a result.json written by gpuval accept or health")
    ],
    output: Annotated[Path | None, output_file("the HTML report", "report.html beside RESULT")] = None,
) -> int:
    """Render a self-contained HTML report (verdict, problems, nodes, plots) from a result.json."""
    from gpuval.inputs import collector_paused
    from gpuval.report.html import drawing_child, write_html
    from gpuval.results import load_result

    target = output or result.parent / "report.html"
    if target.is_dir():
        raise UsageError(f"--output '{target}' is a directory; give a file name, e.g. {target}/report.html")
    with drawing_child() as drawing:  # forked before the file is read (gpuval.forked)
        with collector_paused(freeze=True):  # a short command: gpuval.inputs says why
            loaded = load_result(result)
        try:
            write_html(loaded, target, drawing)
        except OSError as exc:
            raise UsageError(
                f"cannot write {target}: {exc.strerror or exc}: choose another --output"
            ) from None
    say(f"wrote {target}")
    return EXIT_PASS


@exits
def compare(
    before: Annotated[Path, typer.Argument(metavar="BEFORE", help="result.json of the earlier run (A)")],
    after: Annotated[Path, typer.Argument(metavar="AFTER", help="result.json of the later run (B)")],
    fail_on_regression: Annotated[
        float | None,
        typer.Option(
            metavar="PERCENT",
            help="exit 1 when any measurement got worse by more than this many percent (also the tolerance "
            "within which a measurement counts as unchanged; 0 without it)",
            min=0,
        ),
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="every compared metric, not one headline row per measurement")
    ] = False,
    json_: Annotated[bool, typer.Option("--json", help="print the comparison as JSON")] = False,
) -> int:
    """Every measurement both results share, side by side: its headline metric's change and whether the
    measurement as a whole got better or worse (--all: every metric)."""
    from gpuval.report.compare import compare as compare_results
    from gpuval.report.compare import lost_metrics, read_sides, summarize, to_json
    from gpuval.report.console import print_comparison
    from gpuval.report.limits import cut

    earlier, later = read_sides(before, after)
    rows, unmatched = compare_results(earlier, later)
    if not rows:
        raise UsageError(
            f"{before} and {after} share no measurement: compare runs of the same benchmarks and scopes"
        )
    summaries = summarize(rows, fail_on_regression or 0.0)
    if json_:
        sys.stdout.write(to_json(rows, unmatched, summaries))
    else:
        print_comparison(rows, unmatched, str(before), str(after), console, summaries=summaries, every=all_)
    if fail_on_regression is None:
        return EXIT_PASS
    lost = lost_metrics(earlier, later)
    if later.verdict == "ERROR" or unmatched["only_before"] or lost:  # a run that lost some regressed
        why = [f"its verdict is {later.verdict}"] if later.verdict == "ERROR" else []
        if unmatched["only_before"]:
            why.append(f"it lost {unmatched['only_before']} measurement(s) that {before} has")
        if lost:
            why.append(f"it lost {lost} metric(s) of measurements that {before} has")
        say(
            f"gpuval: {after}: {' and '.join(why)}; find out why with gpuval report {after}",
            err=True,
            soft_wrap=True,
        )
        return EXIT_FAIL
    worse = [summary for summary in summaries if summary.verdict == "worse"]
    if not worse:
        return EXIT_PASS
    first = worse[0]
    key = (first.name, first.scope, first.identity, first.worse[0])  # its headline, when that got worse
    row = next(r for r in rows if (r.name, r.scope, r.identity, r.metric) == key)
    # names from the file: one line, cut to a cell's length (--json shows them in full)
    example = one_line(cut(f"{row.name} {row.scope} {row.identity} {row.metric}"))
    say(
        f"gpuval: {len(worse)} measurement(s) regressed more than {fail_on_regression:g} %, e.g. "
        f"{example}: {row.before:.4g} → {row.after:.4g}",
        err=True,
        soft_wrap=True,
    )
    return EXIT_FAIL


@exits
def history_command(
    history: HistoryOption = None,
    node: Annotated[str | None, typer.Option(metavar="NODE", help="node (default: the latest run's)")] = None,
    last: Annotated[int, typer.Option(metavar="N", help="runs to list and to trend over", min=1)] = 10,
    json_: Annotated[bool, typer.Option("--json", help="print runs and trends as JSON")] = False,
) -> int:
    """Past accept runs of a node and each check's trend: its values, their median, the latest against it."""
    from gpuval.history import history_path_from, runs, trends
    from gpuval.report.console import print_history

    path = history_path_from(history)
    if path is None:
        raise UsageError("history is off (GPUVAL_HISTORY=none): pass --history PATH")
    listed = runs(path, node, last)
    if not listed:
        raise UsageError(f"no run of node {node} in {path}: `gpuval history --history {path}` lists them")
    chosen = node or listed[0]["nodes"].split("+")[0]
    series = trends(path, chosen, last)
    if json_:
        sys.stdout.write(json.dumps({"node": chosen, "runs": listed, "trends": series}, indent=2) + "\n")
    else:
        print_history(path, listed, chosen, series, last, console)
    return EXIT_PASS


@exits
def schema(
    document: Annotated[
        Literal["result", "bench", "fleet"],
        typer.Argument(
            metavar="DOCUMENT",
            help="result: accept's and health's result.json; bench: what bench --output writes; fleet: "
            "gpuval fleet's fleet.json",
        ),
    ] = "result",
) -> int:
    """Print the JSON Schema of result.json (or, with `bench`, of the file `gpuval bench --output` writes;
    with `fleet`, of gpuval fleet's fleet.json)."""
    from gpuval.fleet import document as fleet_document
    from gpuval.results import json_schema

    shipped = fleet_document.json_schema() if document == "fleet" else json_schema(document)
    sys.stdout.write(json.dumps(shipped, indent=2) + "\n")
    return EXIT_PASS

"""Command line: one small function per command; the work lives in the modules it calls."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console

from gpuval.errors import EXIT_ERROR, EXIT_FAIL, EXIT_PASS, GpuvalError, RunError, UsageError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Validate NVIDIA GPU nodes and clusters: benchmarks and an acceptance verdict.",
)
# Logs and CI capture output through a pipe, where rich would fall back to 80 columns and fold the
# check table; there, use a log-friendly width unless COLUMNS says otherwise.
console = Console(stderr=False, width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 150)
err_console = Console(stderr=True)

SetOption = Annotated[list[str], typer.Option("--set", help="override a field: key.path=value (repeatable)")]


def _exits(command):
    """Typer ignores return values: turn a command's returned exit code into typer.Exit."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        raise typer.Exit(command(*args, **kwargs))

    return wrapper


NprocOption = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        help="local ranks when not started by torchrun/srun (default: one per GPU; 2 on a machine without "
        "NVIDIA GPUs; 1 where CUDA cannot use the GPUs there)",
    ),
]


HistoryOption = Annotated[
    str | None,
    typer.Option(
        help="SQLite file of past accept runs, for drift checks (default $GPUVAL_HISTORY or "
        "~/.local/share/gpuval/history.sqlite; 'none': off)"
    ),
]


def _default_nproc(gpus_expected: bool = False) -> int:
    """One rank per GPU CUDA can use; two CPU ranks on a machine without NVIDIA GPUs; one rank where the
    PCI bus or NVML show GPUs that CUDA cannot use, or the profile expects some (health says why, and no
    benchmark runs on the CPU in their place)."""
    import torch

    from gpuval.discover.gpus import gpus_here

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return 1 if gpus_expected or gpus_here() else 2


def _check_gpus_for(ranks: int) -> None:
    """More local ranks than GPUs would put two ranks on one GPU (NCCL refuses): say so before starting."""
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible and ranks > visible:
        raise UsageError(
            f"--nproc {ranks} asks for more ranks than the {visible} GPU(s) visible here; "
            f"use --nproc {visible} or fewer (one rank per GPU)"
        )


def _distributed(
    nproc: int | None,
    work,
    extra_argv: tuple[str, ...] = (),
    gpus_expected: bool = False,
    timeout_s: float = 300.0,
) -> int:
    """Run `work` here, or under torchrun's agent with one rank per local GPU when nothing launched us.

    `extra_argv` pins what the parent resolved (the output directory) so every worker uses the same;
    `gpus_expected`: the profile expects GPUs (no CPU ranks stand in for them); `timeout_s`: the
    collective timeout, which also bounds how long the launcher waits for a rank that outlives the others.
    """
    from gpuval.launch import launch_local, report_exit
    from gpuval.runtime import launcher_env

    ranks = nproc if nproc is not None else _default_nproc(gpus_expected)
    if launcher_env() == "single" and ranks > 1:
        _check_gpus_for(ranks)
        return launch_local(ranks, [*sys.argv[1:], *extra_argv], timeout_s=timeout_s)
    try:
        code = work()
    except GpuvalError as exc:
        if os.environ.get("RANK", "0") == "0":
            err_console.print(f"gpuval: {exc}", markup=False, highlight=False, soft_wrap=True)
        code = exc.exit_code
    return report_exit(code)


def _progress():
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[bench]}"),
        BarColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
    )


def _on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


@app.command()
@_exits
def accept(
    profile: Annotated[
        str | None, typer.Option(help="profile name or YAML file (default: matches the GPUs)")
    ] = None,
    output: Annotated[Path | None, typer.Option(help="directory for result.json and junit.xml")] = None,
    quick: Annotated[bool, typer.Option(help="smaller sweeps, fewer repetitions")] = False,
    set_: SetOption = [],  # noqa: B006 - typer reads the default, never mutates it
    nproc: NprocOption = None,
    json_: Annotated[bool, typer.Option("--json", help="print result.json to stdout")] = False,
    history: HistoryOption = None,
) -> int:
    """Run the profile's benchmarks and checks; exit 0 PASS, 1 FAIL, 2 bad input, 3 ERROR."""
    from gpuval.atomic import ensure_writable_dir
    from gpuval.bench.run import plan_benchmarks
    from gpuval.config import load_profile, pick_profile
    from gpuval.discover import local_gpu_names
    from gpuval.discover.pci import nvidia_gpus
    from gpuval.health.run import families
    from gpuval.history import history_path_from, open_history

    name = profile or pick_profile(local_gpu_names(), [gpu.pci_id for gpu in nvidia_gpus()])
    loaded = load_profile(name, set_)
    families(loaded)  # an unknown name in health.skip is bad input: said before any rank starts
    plan = plan_benchmarks(loaded, quick, _on_gpu())
    extra_argv: tuple[str, ...] = ()
    if output is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        output = Path("gpuval-results") / f"accept-{stamp}"
        extra_argv = ("--output", str(output))
    history_path = history_path_from(history)
    if os.environ.get("RANK", "0") == "0":  # bad input is said before any work or any folder is made
        if history_path is not None:
            open_history(history_path)
        ensure_writable_dir(output)

    def work() -> int:
        from gpuval.accept import run_accept, with_drift, write_reports
        from gpuval.report.console import print_result
        from gpuval.runtime import init_runtime

        runtime = init_runtime(timeout_s=loaded.runtime.timeout_s)
        try:
            if runtime.is_main and not json_:
                err_console.print(
                    f"gpuval accept: profile {loaded.name}, {runtime.world_size} ranks, "
                    f"{runtime.backend}, benchmarks: {', '.join(plan) or 'none'}",
                    markup=False,
                    highlight=False,
                )
            if runtime.is_main:
                with _progress() as bar:
                    tasks = {b: bar.add_task("waiting", bench=b, total=1) for b in ["health", *plan]}
                    result = run_accept(
                        runtime,
                        loaded,
                        plan,
                        quick,
                        lambda b, msg: bar.update(
                            tasks[b], description=msg, completed=1 if msg == "done" else 0
                        ),
                        history=history_path,
                    )
            else:
                result = run_accept(runtime, loaded, plan, quick, history=history_path)
        finally:
            runtime.shutdown()
        if result is None:
            return EXIT_PASS
        result = with_drift(result, history_path, loaded.history)
        # the history record and reports first, result.json last: its verdict is the one we exit with
        result, paths = write_reports(result, output, history_path)
        if json_:
            sys.stdout.write(result.to_json())
        else:
            print_result(result, console)
            console.print(f"wrote {', '.join(str(p) for p in paths)}", markup=False, highlight=False)
        return {"PASS": EXIT_PASS, "FAIL": EXIT_FAIL}.get(result.verdict.value, EXIT_ERROR)

    return _distributed(
        nproc,
        work,
        extra_argv,
        gpus_expected=bool(loaded.expect.gpu_count),
        timeout_s=loaded.runtime.timeout_s,
    )


@app.command()
@_exits
def bench(
    name: Annotated[str | None, typer.Argument(help="benchmark to run; omit to list them")] = None,
    set_: SetOption = [],  # noqa: B006
    quick: Annotated[bool, typer.Option(help="smaller sweep")] = False,
    output: Annotated[Path | None, typer.Option(help="write the measurements as JSON to this file")] = None,
    nproc: NprocOption = None,
    json_: Annotated[bool, typer.Option("--json", help="print the JSON to stdout")] = False,
) -> int:
    """Run one benchmark alone (`gpuval bench` lists them with their options)."""
    from gpuval.bench.registry import all_benchmarks, get
    from gpuval.bench.run import bench_options
    from gpuval.config import apply_sets

    if name is None:
        for bench_name, item in sorted(all_benchmarks().items()):
            console.print(f"[bold]{bench_name}[/]: {item.summary}")
            for field, info in item.options.model_fields.items():
                console.print(f"    --set {field}=…  {info.description or ''}")
        return EXIT_PASS
    benchmark = get(name)
    overrides: dict[str, Any] = {}
    apply_sets(overrides, set_, dotted_maps=())
    options = bench_options(benchmark.name, overrides, quick, _on_gpu())
    if output is not None and os.environ.get("RANK", "0") == "0":
        from gpuval.atomic import ensure_writable_dir

        if output.is_dir():  # said before any work, not after the benchmark ran
            raise UsageError(
                f"--output '{output}' is a directory; give a file name, e.g. {output}/bench.json"
            )
        ensure_writable_dir(output.parent if str(output.parent) else Path("."))

    def work() -> int:
        from gpuval.atomic import write_text_atomic
        from gpuval.bench.run import run_benchmarks
        from gpuval.discover import node_inventory
        from gpuval.health.cuda import cpu_rank_problem
        from gpuval.report.console import print_measurements
        from gpuval.runtime import init_runtime

        runtime = init_runtime()
        began, started_at = time.perf_counter(), datetime.now(timezone.utc).isoformat(timespec="seconds")
        try:
            if not runtime.on_gpu and (problem := cpu_rank_problem()):
                raise RunError(f"bench {benchmark.name}: {problem}; gpuval health says why")
            if runtime.is_main:
                with _progress() as bar:
                    task = bar.add_task("starting", bench=benchmark.name, total=1)
                    outcome = run_benchmarks(
                        runtime,
                        {benchmark.name: options},
                        quick,
                        lambda b, msg: bar.update(task, description=msg),
                    )
            else:
                outcome = run_benchmarks(runtime, {benchmark.name: options}, quick)
            world = runtime.world_info()
            # provenance: what ran it (GPUs, driver, NCCL, torch), from the first rank of every node
            nodes = [
                n
                for n in runtime.all_gather_object(
                    node_inventory(runtime.node_name) if runtime.local_rank == 0 else None
                )
                if n is not None
            ]
        finally:
            runtime.shutdown()
        if not runtime.is_main:
            return EXIT_PASS
        status, reason = outcome.not_run.get(benchmark.name, (None, ""))
        document = {
            "schema": "gpuval.bench/v1",
            "benchmark": benchmark.name,
            "started_at": started_at,
            "duration_s": round(time.perf_counter() - began, 3),
            "world": world,
            "status": status.value if status else "OK",
            "detail": reason,
            "options": options.model_dump(mode="json"),
            "command": ["gpuval", *sys.argv[1:]],
            "inventory": {"nodes": nodes},
            "measurements": [m.model_dump(mode="json") for m in outcome.measurements],
        }
        text = json.dumps(document, indent=2) + "\n"
        if output is not None:
            write_text_atomic(output, text)
        if json_:
            sys.stdout.write(text)
        elif outcome.measurements:
            print_measurements(benchmark.name, outcome.measurements, console)
        if status is not None:
            raise RunError(f"{benchmark.name}: {status.value}: {reason}")
        return EXIT_PASS

    return _distributed(nproc, work)


@app.command()
@_exits
def discover(
    json_: Annotated[bool, typer.Option("--json", help="print the inventory as JSON")] = False,
    output: Annotated[Path | None, typer.Option(help="write the inventory as JSON to this file")] = None,
    paste: Annotated[bool, typer.Option(help="a short plain-text block to paste into a bug report")] = False,
) -> int:
    """What is here: host, software, GPUs, topology, InfiniBand, storage, scheduler (one process)."""
    from gpuval.atomic import ensure_writable_dir, write_text_atomic
    from gpuval.discover import node_inventory
    from gpuval.discover.render import paste_block, print_inventory
    from gpuval.errors import UsageError

    if output is not None:
        if output.is_dir():
            raise UsageError(f"--output '{output}' is a directory; give a file name, e.g. {output}/node.json")
        ensure_writable_dir(output.parent)
    inventory = node_inventory()
    text = json.dumps(inventory, indent=2) + "\n"
    if output is not None:
        write_text_atomic(output, text)
    if json_:
        sys.stdout.write(text)
    elif paste:
        sys.stdout.write(paste_block(inventory))
    else:
        print_inventory(inventory, console)
    if output is not None and not json_:
        err_console.print(f"wrote {output}", markup=False, highlight=False)
    return EXIT_PASS


@app.command()
@_exits
def health(
    profile: Annotated[
        str | None, typer.Option(help="profile name or YAML file (default: matches the GPUs)")
    ] = None,
    set_: SetOption = [],  # noqa: B006 - typer reads the default, never mutates it
    output: Annotated[Path | None, typer.Option(help="directory for result.json and junit.xml")] = None,
    json_: Annotated[bool, typer.Option("--json", help="print result.json to stdout")] = False,
) -> int:
    """Check this node's GPUs, links and driver in seconds; exit 0 PASS, 1 FAIL, 2 bad input, 3 ERROR."""
    from gpuval.accept import write_reports
    from gpuval.atomic import ensure_writable_dir
    from gpuval.config import load_profile, pick_profile
    from gpuval.discover.pci import nvidia_gpus
    from gpuval.health.run import families, health_result, node_health
    from gpuval.history import history_path_from
    from gpuval.nvml import available, snapshot
    from gpuval.report.console import print_result
    from gpuval.results import World
    from gpuval.runtime import launcher_env, node_name

    started_at, began = datetime.now(timezone.utc).isoformat(timespec="seconds"), time.perf_counter()
    nvml = snapshot()  # read once: it picks the profile (as discover.local_gpu_names would) and is judged
    names = [gpu.name for gpu in nvml.gpus if available(gpu.name)]
    loaded = load_profile(profile or pick_profile(names, [gpu.pci_id for gpu in nvidia_gpus()]), set_)
    families(loaded)  # an unknown name in health.skip is bad input: say so before any work
    if output is None:
        output = Path("gpuval-results") / f"health-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
    if os.environ.get("RANK", "0") == "0":
        ensure_writable_dir(output)
    node = node_name()
    history = history_path_from(None)  # read only: accept's last passing run there bounds the XID window

    def report(result) -> int:
        result, paths = write_reports(result, output)  # result.json last: ERROR if a report failed
        if json_:
            sys.stdout.write(result.to_json())
        else:
            where = node if result.world.nodes == 1 else f"{result.world.nodes} nodes"
            print_result(result, console, title=f"gpuval health · {where} · profile {loaded.name}")
            console.print(f"wrote {', '.join(str(p) for p in paths)}", markup=False, highlight=False)
        return {"PASS": EXIT_PASS, "FAIL": EXIT_FAIL}.get(result.verdict.value, EXIT_ERROR)

    if launcher_env() == "single":  # one node, one process: no process group needed
        checks = node_health(loaded, node, snapshot=nvml, history=history)
        return report(health_result(loaded, node, checks, nvml, started_at, time.perf_counter() - began))

    def across_nodes() -> int:  # under torchrun/srun: every node's health, SDC on every rank, fleet checks
        from gpuval.accept import run_health_phase
        from gpuval.runtime import init_runtime

        runtime = init_runtime(timeout_s=loaded.runtime.timeout_s)
        try:
            nodes, checks = run_health_phase(runtime, loaded, command="health", history=history)
            world = World.model_validate(runtime.world_info())
        finally:
            runtime.shutdown()
        if not runtime.is_main:
            return EXIT_PASS
        duration_s = time.perf_counter() - began
        return report(health_result(loaded, node, checks, None, started_at, duration_s, nodes, world))

    return _distributed(None, across_nodes, timeout_s=loaded.runtime.timeout_s)


@app.command()
@_exits
def monitor(
    once: Annotated[
        bool, typer.Option(help="print one reading and exit (two samples --interval apart: rates need both)")
    ] = False,
    json_: Annotated[
        bool, typer.Option("--json", help="JSON: one object (--once) or one line per reading")
    ] = False,
    interval: Annotated[float, typer.Option(help="seconds between readings", min=0.1)] = 1.0,
    count: Annotated[int | None, typer.Option(help="stop after this many readings", min=1)] = None,
    prometheus: Annotated[
        str | None,
        typer.Option(help="serve DCGM-exporter-style metrics at HOST:PORT (PORT alone: 127.0.0.1)"),
    ] = None,
) -> int:
    """Live per-GPU dashboard, InfiniBand port rates, and Prometheus metrics named as DCGM-exporter's.

    Per GPU: utilisation, memory, temperature, power, SM clock, throttle reasons, PCIe and NVLink
    throughput; host CPU and memory where there is no GPU."""
    from gpuval.monitor import run_monitor

    return run_monitor(once=once, json_=json_, interval=interval, count=count, prometheus=prometheus)


@app.command()
@_exits
def profiles() -> int:
    """List the built-in profiles."""
    from gpuval.config import builtin_profiles, load_profile

    for name in builtin_profiles():
        console.print(f"[bold]{name}[/]: {load_profile(name).description}")
    return EXIT_PASS


@app.command()
@_exits
def report(
    result: Annotated[Path, typer.Argument(help="a result.json written by gpuval accept")],
    output: Annotated[
        Path | None, typer.Option(help="HTML file to write (default: report.html beside the result)")
    ] = None,
) -> int:
    """Render a self-contained HTML report (verdict, problems, nodes, plots) from a result.json."""
    from gpuval.report.html import write_html
    from gpuval.results import load_result

    loaded = load_result(result)
    target = output or result.parent / "report.html"
    if target.is_dir():
        raise UsageError(f"--output '{target}' is a directory; give a file name, e.g. {target}/report.html")
    try:
        write_html(loaded, target)
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}: choose another --output") from None
    console.print(f"wrote {target}", markup=False, highlight=False)
    return EXIT_PASS


@app.command()
@_exits
def compare(
    before: Annotated[Path, typer.Argument(help="result.json of the earlier run")],
    after: Annotated[Path, typer.Argument(help="result.json of the later run")],
    fail_on_regression: Annotated[
        float | None,
        typer.Option(help="exit 1 when any measurement got worse by more than this many percent", min=0),
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="print the comparison as JSON")] = False,
) -> int:
    """Every measurement both results share, side by side: absolute and % change, better or worse."""
    from rich.markup import escape
    from rich.table import Table

    from gpuval.report.compare import compare as compare_results
    from gpuval.report.compare import regressions, to_json
    from gpuval.results import load_result

    earlier, later = load_result(before), load_result(after)
    rows, unmatched = compare_results(earlier, later)
    if not rows:
        raise UsageError(
            f"{before} and {after} share no measurement: compare runs of the same benchmarks and scopes"
        )
    worse = regressions(rows, fail_on_regression or 0.0)
    if json_:
        sys.stdout.write(to_json(rows, unmatched, worse))
    else:
        table = Table(title=escape(f"gpuval compare · {before} → {after}"), title_justify="left")
        for column in ("measurement", "scope", "which", "metric"):
            table.add_column(column, overflow="fold")
        for column in ("before", "after", "change"):
            table.add_column(column, justify="right", no_wrap=True)
        for row in rows:
            style = {True: "green", False: "red", None: "dim"}[row.better]
            change = f"{row.change_pct:+.1f} %" if row.change_pct is not None else "new from 0"
            table.add_row(
                escape(row.name),
                escape(row.scope),
                escape(row.identity),
                escape(row.metric),
                f"{row.before:.4g}",
                f"{row.after:.4g}",
                f"[{style}]{row.after - row.before:+.4g} ({change})[/]",
            )
        console.print(table)
        better = sum(row.better is True for row in rows)
        worse_all = sum(row.better is False for row in rows)
        console.print(
            f"{len(rows)} shared: {better} better, {worse_all} worse, {len(rows) - better - worse_all} "
            f"unchanged or not judged; {unmatched['only_before']} only before, "
            f"{unmatched['only_after']} only after"
        )
    if fail_on_regression is None:
        return EXIT_PASS
    if later.verdict.value == "ERROR" or unmatched["only_before"]:  # a run that lost measurements regressed
        why = [f"its verdict is {later.verdict.value}"] if later.verdict.value == "ERROR" else []
        if unmatched["only_before"]:
            why.append(f"it lost {unmatched['only_before']} measurement(s) that {before} has")
        err_console.print(
            f"gpuval: {after}: {' and '.join(why)}; find out why with gpuval report {after}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return EXIT_FAIL
    if not worse:
        return EXIT_PASS
    first = worse[0]
    err_console.print(
        f"gpuval: {len(worse)} measurement(s) regressed more than {fail_on_regression:g} %, e.g. "
        f"{first.name} {first.scope} {first.identity} {first.metric}: {first.before:.4g} → {first.after:.4g}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return EXIT_FAIL


@app.command("history")
@_exits
def history_command(
    history: HistoryOption = None,
    node: Annotated[str | None, typer.Option(help="node (default: the latest run's)")] = None,
    last: Annotated[int, typer.Option(help="runs to list and to trend over", min=1)] = 10,
    json_: Annotated[bool, typer.Option("--json", help="print runs and trends as JSON")] = False,
) -> int:
    """Past accept runs of a node and each check's trend: its values, their median, the latest against it."""
    from rich.markup import escape
    from rich.table import Table

    from gpuval.history import history_path_from, runs, trends

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
        return EXIT_PASS
    table = Table(title=escape(f"gpuval history · {path}"), title_justify="left")
    for column in ("run", "started", "profile", "verdict", "nodes"):
        table.add_column(column)
    for run in listed:
        table.add_row(*(escape(str(run[key])) for key in ("id", "started_at", "profile", "verdict", "nodes")))
    console.print(table)
    trend_table = Table(title=escape(f"trends · node {chosen} · last {last} runs"), title_justify="left")
    for column in ("check", "scope", "values (oldest → latest)", "median", "latest vs median"):
        trend_table.add_column(column, overflow="fold")
    for item in series:
        change = item["latest_vs_median_pct"]
        trend_table.add_row(
            escape(item["name"]),
            escape(item["scope"]),
            " ".join(f"{v:.4g}" for v in item["values"]),
            f"{item['median']:.4g} {item['unit']}".strip(),
            "" if change is None else f"{change:+.1f} %",
        )
    console.print(trend_table)
    return EXIT_PASS


@app.command()
@_exits
def schema() -> int:
    """Print the JSON Schema of result.json."""
    from gpuval.results import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")
    return EXIT_PASS


finetune_app = typer.Typer(
    no_args_is_help=True,
    help="Fine-tune for function calling: synthetic data, preparation, LoRA training, evaluation, all of it.",
)
app.add_typer(finetune_app, name="finetune")


@finetune_app.command("synth")
@_exits
def finetune_synth(
    n: Annotated[int, typer.Option("--n", min=1, help="number of records")],
    output: Annotated[Path, typer.Option(help="file to write (JSONL or a JSON list)")],
    seed: Annotated[int, typer.Option(help="same seed, same records")] = 0,
    format_: Annotated[Literal["jsonl", "json"], typer.Option("--format", help="file format")] = "jsonl",
    values: Annotated[
        Literal["all", "train", "holdout", "synthetic", "pieces"],
        typer.Option(
            help="argument value pools: train and holdout never share a value; synthetic: made-up values, "
            "never held-out ones; pieces: the same, half the text ones from --tokenizer's word pieces"
        ),
    ] = "all",
    tokenizer: Annotated[
        str, typer.Option(help="tokenizer folder or name whose word pieces --values pieces uses")
    ] = "tiny",
) -> int:
    """Synthetic function-calling records in Glaive v2's own format, quirks included."""
    from gpuval.finetune.synth import value_part, write_synth

    path = write_synth(n, output, seed, format_, value_part(values, tokenizer))
    err_console.print(f"wrote {n} records to {path}", markup=False, highlight=False)
    return EXIT_PASS


@finetune_app.command("prepare")
@_exits
def finetune_prepare(
    input_: Annotated[str, typer.Option("--input", help="Glaive .json/.jsonl file, or a datasets name")],
    output: Annotated[Path, typer.Option(help="directory for train/eval/eval_unseen.jsonl and stats.json")],
    eval_fraction: Annotated[float, typer.Option(help="in-distribution eval share of the records")] = 0.02,
    unseen_fraction: Annotated[
        float | None, typer.Option(help="most records held out with unseen functions (default: eval share)")
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of the splits")] = 0,
    json_: Annotated[bool, typer.Option("--json", help="print stats.json to stdout")] = False,
) -> int:
    """Glaive records to {"tools", "messages"} JSONL: train, eval and eval_unseen splits; skipped counted."""
    from gpuval.finetune.data import prepare

    stats = prepare(input_, output, eval_fraction, seed, unseen_fraction)
    if json_:
        sys.stdout.write(json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
        return EXIT_PASS
    splits = ", ".join(f"{name} {count}" for name, count in stats["splits"].items())
    reasons = ", ".join(f"{reason} {count}" for reason, count in stats["skipped_by_reason"].items())
    console.print(
        f"{stats['kept']} of {stats['total']} records kept ({splits}); skipped {stats['skipped']}"
        + (f" ({reasons})" if reasons else "")
        + f"; wrote {output}",
        markup=False,
        highlight=False,
    )
    return EXIT_PASS


ConfigOption = Annotated[Path, typer.Option(help="fine-tune config YAML (configs/finetune/)")]
# Its own name: annotations are read when typer builds the commands, so a second `NprocOption` here
# replaced accept's and bench's help with this one's.
FinetuneNprocOption = Annotated[
    int | None,
    typer.Option(
        "--nproc", help="local ranks when not started by torchrun (default: one per GPU, 1 on a CPU)"
    ),
]


@finetune_app.command("train")
@_exits
def finetune_train(
    config: ConfigOption,
    set_: SetOption = [],  # noqa: B006 - typer reads the default, never mutates it
    resume: Annotated[
        bool, typer.Option(help="continue from the newest checkpoint in the output folder")
    ] = False,
    nproc: FinetuneNprocOption = None,
) -> int:
    """LoRA training (DDP, FSDP2 or DeepSpeed; torchrun/srun, or one rank per local GPU) -> OUTPUT/adapter."""
    return _finetune(config, set_, nproc, data=False, train=True, resume=resume, evaluate=False)


@finetune_app.command("eval")
@_exits
def finetune_eval(
    config: ConfigOption,
    set_: SetOption = [],  # noqa: B006
    adapter: Annotated[
        Path | None, typer.Option(help="PEFT adapter folder (default: OUTPUT/adapter)")
    ] = None,
    nproc: FinetuneNprocOption = None,
) -> int:
    """Greedy generation on the eval splits, function-calling scores for the tuned and base model."""
    return _finetune(
        config, set_, nproc, data=False, train=False, resume=False, evaluate=True, adapter=adapter
    )


@finetune_app.command("run")
@_exits
def finetune_run(
    config: ConfigOption,
    output: Annotated[Path | None, typer.Option(help="run folder (overrides the config's output)")] = None,
    set_: SetOption = [],  # noqa: B006
    nproc: FinetuneNprocOption = None,
) -> int:
    """synth (when configured) -> prepare -> train -> eval, end to end; writes OUTPUT/eval.json."""
    sets = [*set_, f"output={output}"] if output else list(set_)
    return _finetune(config, sets, nproc, data=True, train=True, resume=False, evaluate=True)


def _finetune(
    config: Path,
    sets: list[str],
    nproc: int | None,
    *,
    data: bool,
    train: bool,
    resume: bool,
    evaluate: bool,
    adapter: Path | None = None,
) -> int:
    """The fine-tune steps asked for, on every rank of one process group (rank 0 alone makes data)."""
    from gpuval.finetune.config import load_finetune_config

    cfg = load_finetune_config(config, sets)  # a bad config is exit 2 before any rank starts
    if os.environ.get("RANK", "0") == "0":  # every step writes there (data, adapter, eval.json): say it now
        from gpuval.atomic import ensure_writable_dir

        ensure_writable_dir(Path(cfg.output))
    # One trainer per output folder: a second one is exit 2. The process that starts the run holds the lock
    # (gpuval's launcher, not its ranks; rank 0 under torchrun/srun) until the run ends or it dies.
    from gpuval.runtime import distributed_env

    first = distributed_env()["rank"] == 0  # RANK under torchrun, SLURM_PROCID under srun
    locked = train and first and "GPUVAL_EXIT_DIR" not in os.environ
    if locked:
        from gpuval.finetune.lock import lock_output

        lock_output(cfg.output)

    def work() -> int:
        from gpuval.finetune.pipeline import make_data, run_eval
        from gpuval.finetune.trainer import train as train_lora
        from gpuval.runtime import init_runtime

        runtime = init_runtime()
        try:
            if data:
                if runtime.is_main:
                    make_data(cfg)
                runtime.barrier()
            if train:
                summary = train_lora(cfg, runtime, resume=resume)
                if runtime.is_main:
                    last = summary["steps"][-1] if summary["steps"] else {}
                    console.print(
                        f"trained {summary['final_step']} steps on {summary['world_size']} rank(s); "
                        f"final loss {last.get('loss', float('nan')):.4f}; adapter {summary['adapter']}",
                        markup=False,
                        highlight=False,
                    )
            if evaluate:
                from gpuval.finetune.evaluate import render_table

                document = run_eval(cfg, runtime, adapter)
                if document is not None:
                    console.print(render_table(document))
                    console.print(f"wrote {Path(cfg.output) / 'eval.json'}", markup=False, highlight=False)
        finally:
            runtime.shutdown()
        return EXIT_PASS

    if nproc is None:  # one rank per GPU; one process on a CPU (ranks there would share its few cores)
        import torch

        nproc = torch.cuda.device_count() if torch.cuda.is_available() else 1
    try:
        return _distributed(nproc, work)
    finally:
        if locked:
            from gpuval.finetune.lock import unlock_output

            unlock_output(cfg.output)


def _click_line(exc: Exception) -> str:
    """A click usage error (unknown option, missing argument, bad value) as one line naming the help."""
    message = " ".join(exc.format_message().split()).rstrip(".")  # type: ignore[attr-defined]
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "gpuval"
    return f"gpuval: {message} (see {command} --help)"


def main() -> None:
    """Entry point: usage errors exit 2 (typer), our own errors print one line with their exit code."""
    import signal

    from gpuval.errors import Interrupted
    from gpuval.launch import worker_start
    from gpuval.runtime import launcher_env, leave_process

    worker_start()  # a rank that gpuval's own launcher started: dies with it (launch.py)
    # Signals received: Interrupted is raised wherever the process is, also inside an import, where a
    # library may turn it into an error of its own (transformers' lazy imports do): the signal decides.
    signalled: list[int] = []
    if launcher_env() == "single":  # not a rank of torchrun/srun: SIGINT/SIGTERM end it in one line

        def _interrupted(signum, _frame):
            signalled.append(signum)
            raise Interrupted(signum)

        signal.signal(signal.SIGINT, _interrupted)
        signal.signal(signal.SIGTERM, _interrupted)
    try:  # typer >= 0.25 carries its own copy of click: its exceptions are the ones raised
        from typer import _click as click
    except ImportError:  # pragma: no cover - older typer, on click itself
        import click

    code = 0
    try:
        # standalone_mode=False: click's own usage errors come here, to be said in one line
        code = app(prog_name="gpuval", standalone_mode=False) or 0
    except click.exceptions.NoArgsIsHelpError as exc:  # `gpuval` or `gpuval finetune` alone: the help
        exc.show()
        code = exc.exit_code
    except click.ClickException as exc:
        err_console.print(_click_line(exc), markup=False, highlight=False, soft_wrap=True)
        code = exc.exit_code
    except typer.Abort:
        err_console.print("gpuval: aborted", markup=False, highlight=False)
        code = 1
    except GpuvalError as exc:
        err_console.print(f"gpuval: {exc}", markup=False, highlight=False, soft_wrap=True)
        code = exc.exit_code
    except (Interrupted, KeyboardInterrupt) as exc:
        stop = exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT)
        err_console.print(f"gpuval: {stop}", markup=False, highlight=False, soft_wrap=True)
        code = stop.exit_code
    except Exception:
        if not signalled:
            raise
        stop = Interrupted(signalled[0])
        err_console.print(f"gpuval: {stop}", markup=False, highlight=False, soft_wrap=True)
        code = stop.exit_code
    except SystemExit as exc:  # typer ends every command this way
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            err_console.print(str(exc.code), markup=False, highlight=False)
            code = 1
    leave_process(code)

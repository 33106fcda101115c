"""`gpuval bench`: one benchmark alone, its measurements as a table or a `gpuval.bench/v1` document."""

from __future__ import annotations

import contextlib
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuval import launch
from gpuval.cli.options import NprocOption, SetOption, console, exits, is_first_rank, output_file, progress
from gpuval.errors import EXIT_PASS, GpuvalError, RunError, UsageError


@exits
def bench(
    name: Annotated[
        str | None, typer.Argument(metavar="NAME", help="benchmark to run; omit to list them")
    ] = None,
    set_: SetOption = [],  # noqa: B006
    quick: Annotated[bool, typer.Option("--quick", help="smaller sweep")] = False,
    output: Annotated[Path | None, output_file("the measurements as a gpuval.bench/v1 JSON document")] = None,
    nproc: NprocOption = None,
    json_: Annotated[bool, typer.Option("--json", help="print the JSON to stdout")] = False,
) -> int:
    """Run one benchmark alone (`gpuval bench` lists them with their options)."""
    from gpuval.bench.registry import all_benchmarks, get
    from gpuval.bench.run import bench_options
    from gpuval.config import apply_sets

    if name is None:
        from rich.markup import escape
        from rich.table import Table

        console.print(
            "Each benchmark and its options: `gpuval bench NAME --set KEY=VALUE` (accept takes "
            "`--set benchmarks.NAME.KEY=VALUE`)",
            style="dim",
            markup=False,
        )
        for bench_name, item in sorted(all_benchmarks().items()):
            console.print(f"[bold]{bench_name}[/]: {escape(item.summary)}")
            # each description wraps under its own column, not under the option names
            options = Table.grid(padding=(0, 2))
            options.add_column(no_wrap=True)
            options.add_column()
            for field, description in _option_lines(item.options):
                options.add_row(f"  {field}", escape(description))
            console.print(options)
        return EXIT_PASS
    benchmark = get(name)
    overrides: dict[str, Any] = {}
    apply_sets(overrides, [_own_path(assignment, benchmark.name) for assignment in set_], dotted_maps=())
    options = bench_options(benchmark.name, overrides, quick, launch.on_gpu())
    if output is not None and is_first_rank():
        from gpuval.atomic import ensure_writable_dir

        if output.is_dir():  # said before any work, not after the benchmark ran
            raise UsageError(
                f"--output '{output}' is a directory; give a file name, e.g. {output}/bench.json"
            )
        ensure_writable_dir(output.parent if str(output.parent) else Path("."))

    def work() -> int:
        from gpuval.atomic import write_text_atomic
        from gpuval.results import BenchDocument
        from gpuval.runtime import init_runtime

        folder = (output.parent if str(output.parent) else Path(".")) if output is not None else None
        runtime = init_runtime(log_dir=folder)
        try:
            return measured(runtime, folder)
        except GpuvalError:
            raise
        except Exception as exc:  # unforeseen: rank 0's document says ERROR with the one line, exit 3
            if not runtime.is_main:
                raise
            from gpuval.crash import as_error

            error = as_error(exc, folder)
            if output is not None and not isinstance(error, UsageError):
                document = BenchDocument(
                    benchmark=benchmark.name,
                    started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    duration_s=0.0,
                    world=runtime.world_info(),
                    status="ERROR",
                    detail=str(error),
                    options=options.model_dump(mode="json"),
                    command=["gpuval", *sys.argv[1:]],
                )
                with contextlib.suppress(OSError):  # the one line still says what happened
                    write_text_atomic(output, document.to_json())
            raise error from None

    def measured(runtime, folder: Path | None) -> int:
        from gpuval.atomic import write_text_atomic
        from gpuval.bench.run import run_benchmarks
        from gpuval.deadline import watching
        from gpuval.discover import node_inventory
        from gpuval.health.cuda import cpu_rank_problem
        from gpuval.report.console import print_measurements
        from gpuval.results import BenchDocument

        if folder is not None:  # the libraries' warnings and loading bars: to a log beside the document
            from gpuval.quiet import route_third_party_output

            route_third_party_output(folder, runtime.rank)
        began, started_at = time.perf_counter(), datetime.now(timezone.utc).isoformat(timespec="seconds")
        # A rank that stops answering ends the run (gpuval.deadline); no document is written then.
        with watching(runtime), contextlib.ExitStack() as finally_:
            finally_.callback(runtime.shutdown)  # leaves the group on the way out, still watched
            if not runtime.on_gpu and (problem := cpu_rank_problem()):
                raise RunError(f"bench {benchmark.name}: {problem}; gpuval health says why")
            if runtime.is_main:
                with progress() as bar:
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
        if not runtime.is_main:
            return EXIT_PASS
        status, reason = outcome.not_run.get(benchmark.name, (None, ""))
        document = BenchDocument.model_validate(
            {
                "benchmark": benchmark.name,
                "started_at": started_at,
                "duration_s": round(time.perf_counter() - began, 3),
                "world": world,
                "status": status.value if status else "OK",
                "detail": reason,
                "options": options.model_dump(mode="json"),
                "command": ["gpuval", *sys.argv[1:]],
                "inventory": {"nodes": nodes},
                "measurements": outcome.measurements,
            }
        )
        text = document.to_json()
        if output is not None:
            write_text_atomic(output, text)
        if json_:
            sys.stdout.write(text)
        elif outcome.measurements:
            print_measurements(benchmark.name, outcome.measurements, console)
        if status is not None:
            raise RunError(f"{benchmark.name}: {status.value}: {reason}")
        return EXIT_PASS

    return launch.run_distributed(nproc, work)


def _own_path(assignment: str, name: str) -> str:
    """`--set` as accept takes it (`benchmarks.NAME.key=value`) or short (`key=value`): the short form."""
    key = assignment.partition("=")[0].strip()
    if not key.startswith("benchmarks."):
        return assignment
    prefix = f"benchmarks.{name}."
    if key.startswith(prefix):
        return assignment.strip()[len(prefix) :]
    raise UsageError(
        f"--set '{assignment}': this runs benchmark '{name}'; set its options as "
        f"{prefix}KEY=VALUE or KEY=VALUE"
    )


def _option_lines(model: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Every option of a benchmark as `--set` takes it: a section's fields dotted (`step.compile`)."""
    from pydantic import BaseModel

    lines: list[tuple[str, str]] = []
    for field, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            lines += _option_lines(annotation, f"{prefix}{field}.")
        else:
            lines.append((f"{prefix}{field}", info.description or ""))
    return lines

"""`gpuval accept`: the profile's benchmarks and checks, and the verdict as the exit code."""

from __future__ import annotations

import os
import sys
from datetime import datetime, timezone
from typing import Annotated

import typer

from gpuval import launch
from gpuval.cli.options import (
    AcceptOutputOption,
    HistoryOption,
    JsonResultOption,
    NprocOption,
    ProfileOption,
    SetOption,
    TextfileOption,
    console,
    default_result_dir,
    exits,
    home_short,
    is_first_rank,
    progress,
    say,
    say_written,
)
from gpuval.errors import EXIT_ERROR, EXIT_FAIL, EXIT_PASS, GpuvalError, Interrupted


@exits
def accept(
    profile: ProfileOption = None,
    output: AcceptOutputOption = None,
    quick: Annotated[bool, typer.Option("--quick", help="smaller sweeps, fewer repetitions")] = False,
    set_: SetOption = [],  # noqa: B006 - typer reads the default, never mutates it
    nproc: NprocOption = None,
    json_: JsonResultOption = False,
    history: HistoryOption = None,
    textfile: TextfileOption = None,
    duration: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION",
            help="soak: repeat the whole accept (health + benchmarks) for this long (90s, 30m, 2h) and judge "
            "the iterations against each other; each one's result goes to iterations.jsonl (docs/soak.md)",
        ),
    ] = None,
    iterations: Annotated[
        int | None,
        typer.Option(
            metavar="N", help="soak: repeat the whole accept N times (with --duration: whichever ends first)"
        ),
    ] = None,
) -> int:
    """Run the profile's benchmarks and checks; exit 0 PASS, 1 FAIL, 2 bad input, 3 ERROR."""
    from gpuval.atomic import ensure_writable_dir
    from gpuval.bench.run import plan_benchmarks
    from gpuval.config import load_profile, pick_profile
    from gpuval.discover import local_gpu_names
    from gpuval.discover.pci import nvidia_gpus
    from gpuval.health.run import families
    from gpuval.history import history_path_from, open_history
    from gpuval.soak import forget_earlier_run, soak_plan
    from gpuval.textfile import published

    soak = soak_plan(iterations, duration)  # a bad --duration or --iterations: said before anything runs
    name = profile or pick_profile(local_gpu_names(), [gpu.pci_id for gpu in nvidia_gpus()])
    loaded = load_profile(name, set_)
    families(loaded)  # an unknown name in health.skip is bad input: said before any rank starts
    plan = plan_benchmarks(loaded, quick, launch.on_gpu())
    extra_argv: tuple[str, ...] = ()
    if output is None:  # one folder for every rank: the parent names it and passes it on
        output = default_result_dir("accept")
        extra_argv = ("--output", str(output))
    history_path = history_path_from(history)
    if is_first_rank():  # bad input is said before any work or any folder is made
        if history_path is not None:
            open_history(history_path)
        ensure_writable_dir(output)
        if textfile is not None:
            ensure_writable_dir(textfile, "--textfile")
        if soak is not None:  # a result.json found after an interrupt (below) is then this soak's
            forget_earlier_run(output)

    started_at = datetime.now(timezone.utc)

    def header(ranks: int, backend: str) -> str:
        return (
            f"gpuval accept: profile {loaded.name}, {ranks} ranks, {backend}, benchmarks: "
            f"{', '.join(plan) or 'none'}" + (f"; soak: {soak.describe()}" if soak else "")
        )

    def starting(ranks: int) -> None:
        if not json_:
            say(header(ranks, "nccl" if launch.on_gpu() else "gloo"), err=True)

    # The process the user started says what runs once every refusal is behind it (`starting`): its ranks
    # then take seconds to start (torch's import, the process group) on a screen that stayed blank. Ranks
    # that torchrun or srun started have no such parent: rank 0 says it once they joined.
    from gpuval.runtime import launcher_env

    said_by_parent = launcher_env() == "single" or launch.EXIT_DIR_VARIABLE in os.environ

    def work() -> int:
        from gpuval.accept import write_error_reports
        from gpuval.quiet import route_third_party_output
        from gpuval.runtime import init_runtime

        try:
            runtime = init_runtime(timeout_s=loaded.runtime.timeout_s, log_dir=output)
        except GpuvalError as exc:  # the group never formed, so no rank can judge: rank 0 records ERROR
            if is_first_rank():
                from gpuval.accept import write_unfinished_result

                write_unfinished_result(output, loaded, started_at, _world(nproc), str(exc))
            raise
        route_third_party_output(output, runtime.rank)  # the train benchmark's libraries: to a file
        try:
            return judged(runtime)
        except GpuvalError:
            raise
        except Exception as exc:  # unforeseen: rank 0 leaves result files saying ERROR, exit 3
            if not runtime.is_main:
                raise
            raise write_error_reports(exc, output, loaded, started_at, runtime.world_info()) from None

    def judged(runtime) -> int:
        from gpuval.accept import run_accept, with_drift, write_error_result, write_reports
        from gpuval.deadline import watching
        from gpuval.report.console import print_result

        # A rank that stops answering ends the run (gpuval.deadline): rank 0 then leaves an ERROR result.
        with watching(runtime, lambda line: write_error_result(output, loaded, runtime, started_at, line)):
            try:
                if runtime.is_main and not json_ and not said_by_parent:
                    say(header(runtime.world_size, runtime.backend), err=True)

                def once(iteration: int = 0):  # one whole accept: the Result on rank 0, None elsewhere
                    if not runtime.is_main:
                        return run_accept(runtime, loaded, plan, quick, history=history_path)
                    with progress() as bar:
                        tasks = {b: bar.add_task("waiting", bench=b, total=1) for b in ["health", *plan]}
                        return run_accept(
                            runtime,
                            loaded,
                            plan,
                            quick,
                            lambda b, msg: bar.update(
                                tasks[b], description=msg, completed=1 if msg == "done" else 0
                            ),
                            history=history_path,
                        )

                if soak is None:
                    result = once()
                else:
                    from gpuval.soak import run_soak

                    result = run_soak(runtime, soak, once, output, loaded, lambda line: say(line, err=True))
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
            say_written(paths)
            if history_path is not None:  # a database in the home folder nobody asked for: say where
                from gpuval.history import recorded_runs

                try:
                    nodes, count = recorded_runs(history_path, result)
                except GpuvalError:  # it went bad during the run: the result's ERROR checks say so
                    pass
                else:
                    runs = f"{count} run" if count == 1 else f"{count} runs"
                    of = f"nodes {nodes}" if "+" in nodes else f"node {nodes}"
                    where = home_short(history_path)  # soft-wrapped: a long path stays one piece to copy
                    say(f"history: {runs} of {of} in {where} (gpuval history)", style="dim", soft_wrap=True)
        return {"PASS": EXIT_PASS, "FAIL": EXIT_FAIL}.get(result.verdict.value, EXIT_ERROR)

    # The process the user started (or rank 0 under torchrun/srun) writes the textfile once the run ended,
    # however it ended: from the result.json the run left, or ERROR where it left none.
    writer = textfile if is_first_rank() and launch.EXIT_DIR_VARIABLE not in os.environ else None
    with published(writer, "accept", output, loaded.name, started_at):
        try:
            return launch.run_distributed(
                nproc,
                work,
                extra_argv,
                gpus_expected=bool(loaded.expect.gpu_count),
                timeout_s=loaded.runtime.timeout_s,
                starting=starting,
                shutdown_s=launch.SHUTDOWN_TIMEOUT_S if soak is None else launch.SOAK_SHUTDOWN_TIMEOUT_S,
            )
        except GpuvalError:
            raise
        except Exception as exc:  # unforeseen in the launcher itself (a torch it does not know, say)
            from gpuval.accept import write_error_reports

            if not is_first_rank():
                raise
            raise write_error_reports(exc, output, loaded, started_at, _world(nproc)) from None
        except Interrupted as stop:
            # The launcher stopped its ranks, and rank 0 wrote the summary of the iterations done: the exit
            # code is that summary's verdict (never PASS: a soak cut short is ERROR unless hardware FAILed).
            from gpuval.soak import read_summary

            summary = read_summary(output) if soak is not None else None
            if summary is None:
                raise
            done = summary.inventory["soak"].get("completed")
            say(
                f"gpuval: {Interrupted(stop.signum)}: the soak stopped after {done} iteration(s); its "
                f"summary ({summary.verdict.value}) is in {output / 'result.json'}",
                err=True,
            )
            return {"PASS": EXIT_PASS, "FAIL": EXIT_FAIL}.get(summary.verdict.value, EXIT_ERROR)


def _world(nproc: int | None) -> dict[str, object]:
    """The run's world as the process the user started knows it, for a result no rank wrote."""
    world = int(os.environ.get("WORLD_SIZE", nproc or 1))
    nodes = max(1, world // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    return {"size": world, "nodes": nodes, "backend": "nccl" if launch.on_gpu() else "gloo"}

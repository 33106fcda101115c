"""Command line: the typer app, one module per command group, and `main()` (the `gpuval` entry point).

Every command module only parses its options and calls the modules that do the work; launching ranks is
gpuval.launch's, rendering gpuval.report's. Their heavy imports (torch, transformers) stay inside the
commands, so `gpuval --help` and a usage error stay fast.
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Annotated

import typer

from gpuval.cli import accept, bench, discover, finetune, fleet, health, monitor, results
from gpuval.cli.options import Command, Group, err_console
from gpuval.errors import GpuvalError, one_line

app = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Validate NVIDIA GPU nodes and clusters: benchmarks and an acceptance verdict.",
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("gpuval")  # the installed distribution's, as pip shows it
        except PackageNotFoundError:  # run from a source tree (PYTHONPATH=src)
            from gpuval import __version__ as found
        typer.echo(f"gpuval {found}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="print gpuval's version and exit"),
    ] = False,
) -> None:
    """Validate NVIDIA GPU nodes and clusters: benchmarks and an acceptance verdict."""


# registered here, in the order `gpuval --help` lists them
app.command(cls=Command)(accept.accept)
app.command(cls=Command)(bench.bench)
app.command(cls=Command)(discover.discover)
app.command(cls=Command)(health.health)
app.command(cls=Command)(monitor.monitor)
app.command(cls=Command)(results.report)
app.command(cls=Command)(results.compare)
app.command(cls=Command)(fleet.fleet)
app.command("history", cls=Command)(results.history_command)
app.command(cls=Command)(results.schema)
app.add_typer(results.profiles_app, name="profiles")
app.add_typer(finetune.finetune_app, name="finetune")


def _click_line(exc: Exception) -> str:
    """A click usage error (unknown option, missing argument, bad value) as one line naming the help."""
    message = " ".join(exc.format_message().split()).rstrip(".")  # type: ignore[attr-defined]
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "gpuval"
    return f"gpuval: {message} (see {command} --help)"


def _say(text: str) -> None:
    err_console.print(text, markup=False, highlight=False, soft_wrap=True)


def _importing(frame: FrameType | None) -> bool:
    """Whether a module is being imported somewhere on this Python stack."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib."):
            return True
        frame = frame.f_back
    return False


def main() -> None:
    """Entry point: usage errors exit 2 (typer), our own errors print one line with their exit code."""
    import signal

    from gpuval.errors import Interrupted
    from gpuval.launch import EXIT_DIR_VARIABLE, worker_start
    from gpuval.runtime import launcher_env, leave_process

    worker_start()  # a rank that gpuval's own launcher started: dies with it (launch.py)
    # Signals received: Interrupted is raised wherever the process is, also inside an import, where a
    # library may turn it into an error of its own (transformers' lazy imports do): the signal decides.
    signalled: list[int] = []
    launcher = launcher_env()
    external_rank = launcher != "single" and not os.environ.get(EXIT_DIR_VARIABLE)
    if launcher == "single" or external_rank:
        # Not a rank (SIGINT/SIGTERM end it in one line), or a rank of someone else's torchrun/srun: when a
        # peer fails, the launcher SIGTERMs the others, often before rank 0 has seen the peer go; rank 0 then
        # says in one line that the launcher stopped it (the default would end it without a word), the
        # other ranks end quietly as before. Ranks of gpuval's own launcher leave it to the launcher.
        rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
        world = os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "?"))
        stopped = f"rank {rank} of {world}: {launcher} stopped this rank (its output names the failed one)"

        def _interrupted(signum, frame):
            signalled.append(signum)
            if external_rank and rank != "0":
                os._exit(Interrupted(signum).exit_code)
            if _importing(frame):
                # An exception raised inside a module's import may have to cross C++ (torch's extension
                # init calls back into Python): pybind11 then aborts the process. Nothing is being written
                # during an import (outputs are atomic, the output lock is an flock the kernel frees), so
                # the run ends here, in one line, without unwinding.
                _say(f"gpuval: {Interrupted(signum, stopped if external_rank else '')}")
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                os._exit(Interrupted(signum).exit_code)
            raise Interrupted(signum, stopped if external_rank else "")

        if not external_rank:  # a rank's Ctrl-C is the launcher's to forward
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
        _say(one_line(_click_line(exc)))
        code = exc.exit_code
    except typer.Abort:
        _say("gpuval: aborted")
        code = 1
    except GpuvalError as exc:
        _say(f"gpuval: {one_line(str(exc))}")  # a bad value echoed back may hold a newline
        code = exc.exit_code
    except (Interrupted, KeyboardInterrupt) as exc:
        stop = exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT)
        _say(f"gpuval: {stop}")
        code = stop.exit_code
    except Exception as exc:
        if signalled:
            stop = Interrupted(signalled[0])
            _say(f"gpuval: {stop}")
            code = stop.exit_code
        else:  # bad input only a path or a parser can meet (exit 2), else unforeseen: ERROR (exit 3),
            from gpuval.crash import as_error  # never exit 1, which means the hardware FAILed

            error = as_error(exc)
            _say(f"gpuval: {one_line(str(error))}")
            code = error.exit_code
    except SystemExit as exc:  # typer ends every command this way
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            err_console.print(str(exc.code), markup=False, highlight=False)
            code = 1
    leave_process(code)


def run() -> None:
    """The program's entry point (`gpuval`, `python -m gpuval`): `main`, then the exit without the
    interpreter's finalization (gpuval.exiting says why)."""
    from gpuval.exiting import exit_now

    try:
        main()
    except SystemExit as exc:  # leave_process's: main has made every code an int (or None: 0)
        exit_now(int(exc.code or 0))

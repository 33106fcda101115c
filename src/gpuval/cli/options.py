"""What every command group shares, defined once: the consoles, the options, the exit-code decorator."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress

# Logs and CI capture output through a pipe, where rich would fall back to 80 columns and fold the
# check table; there, use a log-friendly width unless COLUMNS says otherwise.
console = Console(stderr=False, width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 150)
err_console = Console(stderr=True)

SetOption = Annotated[list[str], typer.Option("--set", help="override a field: key.path=value (repeatable)")]

# One option object per meaning: typer reads annotations when it builds the commands, and a second
# `--nproc` annotation of the same name once replaced accept's and bench's help with the fine-tune's.
NprocOption = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        help="local ranks when not started by torchrun/srun (default: one per GPU; 2 on a machine without "
        "NVIDIA GPUs; 1 where CUDA cannot use the GPUs there)",
    ),
]
FinetuneNprocOption = Annotated[
    int | None,
    typer.Option(
        "--nproc", help="local ranks when not started by torchrun (default: one per GPU, 1 on a CPU)"
    ),
]

HistoryOption = Annotated[
    str | None,
    typer.Option(
        help="SQLite file of past accept runs, for drift checks (default $GPUVAL_HISTORY or "
        "~/.local/share/gpuval/history.sqlite; 'none': off)"
    ),
]

ProfileOption = Annotated[
    str | None, typer.Option(help="profile name or YAML file (default: matches the GPUs)")
]


# `--output` has one meaning per kind of thing written, and its help says which: a folder (DIR) where a
# command writes several files, a file (FILE) where it writes one document. tests/test_cli.py holds every
# command to it.
def output_dir(what: str) -> Any:
    """`--output DIR`: the folder a command writes its files into (created when missing)."""
    return typer.Option("--output", metavar="DIR", help=f"folder to write {what} into (created if missing)")


def output_file(what: str) -> Any:
    """`--output FILE`: the one file a command writes."""
    return typer.Option("--output", metavar="FILE", help=f"file to write {what} to")


ResultDirOption = Annotated[Path | None, output_dir("result.json, junit.xml and report.html")]
JsonResultOption = Annotated[bool, typer.Option("--json", help="print result.json to stdout")]


def exits(command: Callable[..., int]) -> Callable[..., None]:
    """Typer ignores return values: turn a command's returned exit code into typer.Exit."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        raise typer.Exit(command(*args, **kwargs))

    return wrapper


def is_first_rank() -> bool:
    """Rank 0, or no launcher at all: the process that checks input and paths before any work."""
    return os.environ.get("RANK", "0") == "0"


def say(text: str, *, err: bool = False, soft_wrap: bool = False) -> None:
    """One plain line: paths, names and messages come from files and users, never rich markup."""
    (err_console if err else console).print(text, markup=False, highlight=False, soft_wrap=soft_wrap)


def progress() -> Progress:
    """The progress bars of accept and bench, on stderr so that stdout stays the result."""
    from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

    from gpuval.report.console import WholeLineProgress

    return WholeLineProgress(
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[bench]}"),
        BarColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
    )

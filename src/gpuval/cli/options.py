"""What every command group shares, defined once: the consoles, the options, the exit-code decorator."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.core
from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress

# Logs and CI capture output through a pipe, where rich would fall back to 80 columns and fold the
# check table; there, use a log-friendly width unless COLUMNS says otherwise.
console = Console(stderr=False, width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 150)
err_console = Console(stderr=True)


def _readable(command: Any) -> None:
    """What typer's help would otherwise show badly, made right once for every command and group.

    A flag shows no metavar: typer's rich help prints the type after every option, `--json <bool>` and
    `--help <bool>` included, though a flag takes no value; every value option and argument declares a
    metavar that says what goes there (NAME|FILE, KEY=VALUE, N), and tests/test_cli.py holds each
    command to it. And the
    help reads as prose: typer keeps a docstring's line breaks in a group's command list and in a help's
    later paragraphs, so a summary wrapped at the source's width broke mid-sentence there.
    """
    if command.help:
        paragraphs = inspect.cleandoc(command.help).split("\n\n")
        command.help = "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)
    for param in command.params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
        elif param.param_type_name == "argument" and hasattr(param, "display_type_rich"):
            # typer >= 0.2x prints an argument's type beside its metavar (`RESULT <path>`): the metavar
            # alone says what goes there, as it does for an option
            param.display_type_rich = lambda ctx: None


class _Readable:
    """The help of a command or a group, made readable by `_readable` once it is built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _readable(self)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""  # a flag: no `<bool>`
        return option


class Command(_Readable, typer.core.TyperCommand):
    """Every gpuval command: `app.command(cls=Command)`."""


class Group(_Readable, typer.core.TyperGroup):
    """Every gpuval command group: `typer.Typer(cls=Group)`."""


SetOption = Annotated[
    list[str],
    typer.Option("--set", metavar="KEY=VALUE", help="override a field: key.path=value (repeatable)"),
]

# One option object per meaning: typer reads annotations when it builds the commands, and a second
# `--nproc` annotation of the same name once replaced accept's and bench's help with the fine-tune's.
# At least one rank, at most MAX_NPROC (far past any node's GPUs): a larger count is a typo that would start
# that many processes
MAX_NPROC = 1024
NprocOption = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        metavar="N",
        min=1,
        max=MAX_NPROC,
        help="local ranks when not started by torchrun/srun (default: one per GPU; 2 on a machine without "
        "NVIDIA GPUs; 1 where CUDA cannot use the GPUs there)",
    ),
]
FinetuneNprocOption = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        metavar="N",
        min=1,
        max=MAX_NPROC,
        help="local ranks when not started by torchrun (default: one per GPU, 1 on a CPU)",
    ),
]

HistoryOption = Annotated[
    str | None,
    typer.Option(
        metavar="FILE|none",
        help="SQLite file of past accept runs, for drift checks; none: keep no history (default: "
        "$GPUVAL_HISTORY, else ~/.local/share/gpuval/history.sqlite)",
    ),
]

ProfileOption = Annotated[
    str | None,
    typer.Option(
        metavar="NAME|FILE",
        help="built-in profile (`gpuval profiles` lists them) or YAML file (default: the one matching "
        "the GPUs)",
    ),
]


# `--output` has one meaning per kind of thing written, and its help says which: a folder (DIR) where a
# command writes several files, a file (FILE) where it writes one document. tests/test_cli.py holds every
# command to it.
def output_dir(what: str, default: str | None = None) -> Any:
    """`--output DIR`: the folder a command writes its files into (created when missing)."""
    said = f"; default: {default}" if default else ""
    return typer.Option(
        "--output", metavar="DIR", help=f"folder to write {what} into (created if missing{said})"
    )


def output_file(what: str, default: str | None = None) -> Any:
    """`--output FILE`: the one file a command writes."""
    said = f" (default: {default})" if default else ""
    return typer.Option("--output", metavar="FILE", help=f"file to write {what} to{said}")


RESULTS_FOLDER = Path("gpuval-results")


def default_result_dir(command: str) -> Path:
    """Where accept and health write without --output: gpuval-results/<command>-<UTC start time>."""
    return RESULTS_FOLDER / f"{command}-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"


_RESULT_FILES = "result.json, junit.xml and report.html"
AcceptOutputOption = Annotated[Path | None, output_dir(_RESULT_FILES, f"{RESULTS_FOLDER}/accept-<UTC time>")]
HealthOutputOption = Annotated[Path | None, output_dir(_RESULT_FILES, f"{RESULTS_FOLDER}/health-<UTC time>")]
JsonResultOption = Annotated[bool, typer.Option("--json", help="print result.json to stdout")]
TextfileOption = Annotated[
    Path | None,
    typer.Option(
        "--textfile",
        metavar="DIR",
        help="also write the verdict for node_exporter's textfile collector into this folder, replaced "
        "atomically (gpuval.prom; health: gpuval-health.prom; docs/monitoring.md)",
    ),
]


def exits(command: Callable[..., int]) -> Callable[..., None]:
    """Typer ignores return values: turn a command's returned exit code into typer.Exit."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        raise typer.Exit(command(*args, **kwargs))

    return wrapper


def is_first_rank() -> bool:
    """Rank 0, or no launcher at all: the process that checks input and paths before any work."""
    return os.environ.get("RANK", "0") == "0"


def say(text: str, *, err: bool = False, soft_wrap: bool = False, style: str | None = None) -> None:
    """One plain line: paths, names and messages come from files and users, never rich markup."""
    (err_console if err else console).print(
        text, markup=False, highlight=False, soft_wrap=soft_wrap, style=style
    )


def home_short(path: Path) -> str:
    """A path as people write it: under the home folder, from `~` (~/.local/share/gpuval/history.sqlite)."""
    try:
        return f"~/{path.expanduser().absolute().relative_to(Path.home())}"
    except ValueError:
        return str(path)


def say_written(paths: list[Path]) -> None:
    """'wrote result.json, junit.xml and report.html to DIR': one folder said once, so that the line fits
    80 columns more often than three full paths did; soft-wrapped, so that a long path is never cut in
    two where rich would fold it, and copies whole."""
    folders = {path.parent for path in paths}
    if len(folders) != 1 or len(paths) < 2:
        say(f"wrote {', '.join(str(p) for p in paths)}", soft_wrap=True)
        return
    names = [path.name for path in paths]
    say(f"wrote {', '.join(names[:-1])} and {names[-1]} to {folders.pop()}", soft_wrap=True)


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

"""An exception gpuval did not foresee: exit 3 (ERROR), one line, the traceback kept in a file.

A bug in gpuval, or a library release that behaves differently from the ones gpuval is tested with (a
torch outside the supported range, say), is a statement about the run, not about the hardware: it must
never end as exit 1, which means FAIL. The person gets one line naming the exception and where its
traceback was saved, so a bug report can carry it.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from datetime import datetime, timezone
from pathlib import Path

from gpuval.errors import GpuvalError, RunError, first_line

TRACEBACK_NAME = "gpuval-error.log"


def save_traceback(exc: BaseException, folder: Path | None = None) -> Path | None:
    """Append `exc`'s traceback to `folder`/gpuval-error.log (the temp directory when the folder cannot
    take it); returns the file, or None when no file could be written at all."""
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rank = os.environ.get("RANK", "0")
    text = f"--- {stamp} pid {os.getpid()} rank {rank}\n" + "".join(
        traceback.format_exception(type(exc), exc, exc.__traceback__)
    )
    for place in (folder, Path(tempfile.gettempdir())):
        if place is None:
            continue
        path = place / TRACEBACK_NAME if place == folder else place / f"gpuval-error-{os.getpid()}.log"
        try:
            place.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as out:
                out.write(text)
        except OSError:
            continue
        return path
    return None


def unforeseen(exc: BaseException, folder: Path | None = None) -> RunError:
    """The one-line ERROR for an exception gpuval has no handling for, its traceback saved first."""
    where = save_traceback(exc, folder)
    kept = f"traceback in {where}" if where else "no file could take its traceback"
    return RunError(f"internal error, {type(exc).__name__}: {first_line(exc)} ({kept}); {_likely_cause()}")


def _likely_cause() -> str:
    from gpuval.versions import supported_torch, torch_problem

    try:
        from importlib.metadata import version

        problem = torch_problem(version("torch"))
    except Exception:  # torch not installed as a distribution: nothing to say about it
        problem = None
    if problem:
        return f"{problem}: install a supported torch"
    return f"a gpuval bug ({supported_torch()} is supported): please report it with that file"


def as_error(exc: Exception, folder: Path | None = None) -> GpuvalError:
    """What an exception escaping a command stands for: bad input where only the input can have caused it
    (inputs.refused_input: exit 2, nothing kept), else an unforeseen ERROR (exit 3, traceback kept)."""
    from gpuval.inputs import refused_input

    return refused_input(exc) or unforeseen(exc, folder)

"""One trainer per output folder: an flock on OUTPUT/.gpuval.lock, held by the process that started the
run (the launcher of its ranks, or rank 0 under torchrun/srun) until it exits. The kernel releases it
when that process ends in any way, also on SIGKILL, so a stale lock file never blocks the next run."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from gpuval.errors import UsageError

LOCK_NAME = ".gpuval.lock"
_HELD: dict[Path, int] = {}  # output folder -> file descriptor of its held lock, for the process's life


def lock_output(output: str | os.PathLike[str]) -> Path:
    """Take the output folder's lock for the rest of this process, or raise a one-line UsageError naming
    the process that holds it. Returns the lock file's path."""
    folder = Path(output).resolve()
    path = folder / LOCK_NAME
    if folder in _HELD:
        return path
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise UsageError(f"output '{output}': cannot create its lock file: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = ""
        with contextlib.suppress(OSError, UnicodeDecodeError):
            holder = os.pread(fd, 64, 0).decode().strip()
        os.close(fd)
        by = f" (pid {holder})" if holder.isdigit() else ""
        raise UsageError(
            f"output '{output}' is in use by another trainer{by}; wait for it to end or set another output"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[folder] = fd
    return path


def unlock_output(output: str | os.PathLike[str]) -> None:
    fd = _HELD.pop(Path(output).resolve(), None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the descriptor releases the flock

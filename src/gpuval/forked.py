"""One piece of a short command's work done in a forked child process while the command goes on: the
second core of a two-core machine put to use where one command would wait seconds on one.

`in_child(work, *args)` forks a child that computes `work(*args)` and hands back a `Later`, whose
`result()` is the value the child sent (pickled: keep it small) or the exception it raised (a UsageError
stays one line). `waiting_child(work, warm)` forks at once, while this process is still small (a child
forked from a process holding a large document makes both copy every page either of them touches), runs
`warm()` (an import) and waits for `Later.send(*args)`. Used by `gpuval compare` (the later
file is read in a child while the command reads the earlier) and `gpuval report` (matplotlib imported
while the command reads the file, then the per-GPU and P2P plots drawn beside the rest of the page).

Where no child can help or fork is not safe, `work` runs in this process when its result is asked for:
one CPU, no fork() (another system), or Python threads running (fork copies only the calling thread).
A child ends silently at SIGINT/SIGTERM (the command says the one line); a child still running when its
`Later` is left (an error, a signal) is killed, and a child that dies without answering is a RunError.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from gpuval.errors import RunError

T = TypeVar("T")
_NOT_SENT = object()


def can_fork() -> bool:
    """A child would run beside this process: two CPUs or more, fork() here, no other Python thread."""
    import multiprocessing

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cpus >= 2 and threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods()


class Later(Generic[T]):
    """The value of work started by in_child; a context manager that kills a child still running when
    the block is left."""

    def __init__(self, work: Callable[..., T], warm: Callable[[], object] | None) -> None:
        self._work = work
        self._args: Any = _NOT_SENT
        self._process: Any = None
        self._pipe: Any = None
        if not can_fork():
            return
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self._pipe, theirs = context.Pipe()
        for stream in (sys.stdout, sys.stderr):  # the child flushes them when it ends: never twice
            stream.flush()
        self._process = context.Process(target=_answer, args=(theirs, self._pipe, work, warm), daemon=True)
        self._process.start()
        theirs.close()

    @property
    def in_child(self) -> bool:
        return self._process is not None

    def send(self, *args: Any) -> None:
        """The work's arguments (pickled to the child)."""
        self._args = args
        if self._process is not None:
            try:
                self._pipe.send(args)
            except OSError:  # the child is gone: result() says so
                pass

    def result(self) -> T:
        if self._args is _NOT_SENT:
            raise RuntimeError("Later.result() before send(): the work has no arguments")
        if self._process is None:
            return self._work(*self._args)
        try:
            ok, value = self._pipe.recv()
        except (EOFError, OSError):
            self._process.join()
            raise RunError(
                f"a child process of gpuval ended without answering (exit status {self._process.exitcode}); "
                "run the command again"
            ) from None
        finally:
            self._pipe.close()
        self._process.join()
        self._process = None
        if not ok:
            raise value
        return value

    def __enter__(self) -> Later[T]:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join()


def in_child(work: Callable[..., T], *args: Any) -> Later[T]:
    """`work(*args)`, computed in a forked child while this process goes on (see the module)."""
    later = Later(work, None)
    later.send(*args)
    return later


def waiting_child(work: Callable[..., T], warm: Callable[[], object] | None = None) -> Later[T]:
    """A child forked now that runs `warm()` and then waits for Later.send(*args) to compute work(*args)."""
    return Later(work, warm)


def _answer(pipe: Any, parents: Any, work: Callable[..., Any], warm: Callable[[], object] | None) -> None:
    """In the child: warm up, wait for the arguments, do the work and send (True, value) or (False, the
    exception). A parent that goes away first ends the child: the child closes its copy of the parent's
    end at once, so that the pipe breaks when the parent's own copy goes."""
    parents.close()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if warm is not None:
        try:
            warm()
        except Exception:  # noqa: BLE001, S110 - only a head start: the work does it again if it must
            pass
    try:
        args = pipe.recv()
    except (EOFError, OSError):
        return
    try:
        answer: tuple[bool, Any] = (True, work(*args))
    except Exception as exc:  # noqa: BLE001 - the parent raises it; anything else ends the child
        answer = (False, exc)
    try:
        pipe.send(answer)
    except OSError:  # the parent is gone (killed): nobody to tell
        return
    except Exception as exc:  # noqa: BLE001 - an exception (or value) that does not pickle
        with contextlib.suppress(OSError):
            said = f"a child process of gpuval failed: {type(exc).__name__}: {exc}"[:300]
            pipe.send((False, RunError(said)))
    pipe.close()

"""How the gpuval program ends: as interpreter shutdown would, less its finalization (`exit_now`). A leaf
module: gpuval.cli's entry point calls it; a rank that had peers ends by gpuval.runtime.leave_process."""

from __future__ import annotations

import os
import sys


def exit_now(code: int) -> None:
    """End this process with `code` as interpreter shutdown would, less its finalization: non-daemon
    threads are waited for and the exit handlers run (atexit: logging's flush, temporary files'
    finalizers, multiprocessing's clean-up), then the output is flushed and the process exits.

    What is skipped, tearing down every module and collecting every object, is all cost and no effect:
    with torch loaded it takes about a CPU-second (a process that imported torch's launcher: 3.4 CPU-s
    with it, 2.7 without; with transformers and PEFT: 8.4 against 7.4, on a 2-core AMD EPYC), and on a
    loaded machine several seconds after a Ctrl-C or SIGTERM (5 s measured beside four busy cores),
    when a user waits for the prompt. The program's entry points (gpuval.cli.run) end this way; `main`
    itself still raises SystemExit for callers in the same process."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    flush_and_exit(code)


def flush_and_exit(code: int) -> None:
    """What is printed reaches its pipe or file (a pipe is block-buffered), then the process ends at once."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

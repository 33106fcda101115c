"""Starting one process per local GPU through torchrun's own engine (torch.distributed.launcher).

`gpuval accept` on a node with 8 GPUs, started without torchrun, runs itself under torchrun's elastic
agent with 8 local ranks — exactly what `torchrun --standalone --nproc-per-node=8 -m gpuval ...` does.
Workers report their exit code through a file, because the agent turns any non-zero worker exit into
its own failure and would blur FAIL (1) into a crash; a worker that really dies is reported as ERROR.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

from gpuval.errors import EXIT_ERROR, RunError

EXIT_DIR_VARIABLE = "GPUVAL_EXIT_DIR"


def launch_local(nproc: int, argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    exit_dir = Path(tempfile.mkdtemp(prefix="gpuval-exit-"))
    os.environ[EXIT_DIR_VARIABLE] = str(exit_dir)
    # One OpenMP thread pool per rank must not oversubscribe the cores (torchrun's own default is 1).
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
    )
    try:
        elastic_launch(config, entrypoint=sys.executable)("-m", "gpuval", *argv)
        codes = {int(p.name): int(p.read_text()) for p in exit_dir.iterdir() if p.name.isdigit()}
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        how = f"signal {-failure.exitcode}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
        raise RunError(f"rank {rank} died ({how}) before finishing; its own output above says why") from None
    finally:
        # Also after a dead rank or an interrupt: no exit folder is left behind in the temp directory.
        os.environ.pop(EXIT_DIR_VARIABLE, None)
        shutil.rmtree(exit_dir, ignore_errors=True)
    return codes.get(0, EXIT_ERROR)


def report_exit(code: int) -> int:
    """In a worker started by launch_local: leave the exit code for the parent, and exit 0 to the agent."""
    exit_dir = os.environ.get(EXIT_DIR_VARIABLE)
    if not exit_dir:
        return code
    rank = os.environ.get("RANK", "0")
    (Path(exit_dir) / rank).write_text(str(code))
    return 0

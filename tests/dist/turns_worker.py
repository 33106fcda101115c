"""Worker for tests/test_runtime.py under `torchrun --standalone --nproc_per_node=4`:

    turns_worker.py OUT.json

The four local ranks pose as two nodes of two. Each works (sleeps 0.3 s) only on its turn from
Runtime.local_turns and records when; rank 0 writes every rank's (node, local rank, start, end).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from gpuval.runtime import init_runtime, leave_process


def main() -> None:
    out = Path(sys.argv[1])
    runtime = init_runtime(timeout_s=60)
    runtime.local_world_size = 2
    runtime.node_rank = runtime.rank // 2
    runtime.local_rank = runtime.rank % 2
    spans = []
    for mine in runtime.local_turns():
        if mine:
            start = time.monotonic()  # one clock for every process of this host
            time.sleep(0.3)
            spans.append((start, time.monotonic()))
    gathered = runtime.all_gather_object((runtime.node_rank, runtime.local_rank, spans))
    if runtime.is_main:
        out.write_text(json.dumps(gathered))
    runtime.shutdown()
    leave_process(0)


if __name__ == "__main__":
    main()

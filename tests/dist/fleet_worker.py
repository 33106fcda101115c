"""Worker for tests/test_fleet.py under `torchrun --standalone --nproc_per_node=4`:

    fleet_worker.py SHARED_DIR ODD_DIR OUT.json

The four local ranks pose as two nodes of two ('node-a', 'node-b'). Node a's ranks look in SHARED_DIR;
node b's look in ODD_DIR, unless ODD_DIR is '-': a node whose mount at that path is another file system.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpuval.health.fleet import shared_fs_checks
from gpuval.runtime import init_runtime


def main() -> None:
    shared, odd, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    runtime = init_runtime(timeout_s=60)
    runtime.local_world_size = 2
    runtime.node_rank = runtime.rank // 2
    runtime.local_rank = runtime.rank % 2
    runtime.node_names = ["node-a", "node-b"]
    runtime.node_name = runtime.node_names[runtime.node_rank]
    directory = Path(odd) if runtime.node_rank == 1 and odd != "-" else shared
    checks = shared_fs_checks(runtime, directory)
    if runtime.is_main:
        Path(out).write_text(json.dumps([c.model_dump(mode="json") for c in checks]))
    runtime.shutdown()


if __name__ == "__main__":
    main()

"""Worker for tests/test_collectives.py, started by `torchrun --standalone --nproc_per_node=N`.

    collectives_worker.py MODE OUT.json

MODE 'world' (3 ranks): every op in float32 and bfloat16, then all_reduce with a faulty op substituted
into `collectives.OPS` (rank 1 corrupts one element after the real all_reduce), then scope='node' on this
single node.
MODE 'split' (4 ranks): the runtime is told the 4 ranks sit on two nodes of 2 ('fake-a', 'fake-b'), and
scope='node' runs each node alone; global rank 3 corrupts one all_reduce element, so only node fake-b
must report wrong elements.

Every rank returns its own measurements; they are gathered and rank 0 writes them as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch.distributed as dist

from gpuval.bench import collectives
from gpuval.bench.registry import Context
from gpuval.runtime import init_runtime

SMALL = {
    "min_bytes": "4KiB",
    "max_bytes": "64KiB",
    "step_factor": 4,
    "extra_sizes": [5000],
    "warmup": 1,
    "iters": 2,
    "repeats": 2,
}


def corrupting(real: collectives.CollectiveOp, bad_global_rank: int) -> collectives.CollectiveOp:
    def call(c: collectives.Call) -> None:
        real.call(c)
        if dist.get_rank() == bad_global_rank:
            c.output[0] += 1  # one flipped element, as silent data corruption would leave it

    return dataclasses.replace(real, call=call)


def run(runtime, **options) -> list[dict]:
    opts = collectives.CollectiveOptions(**{**SMALL, **options})
    mine = collectives.run_collectives(Context(runtime=runtime), opts)
    gathered = runtime.all_gather_object([m.model_dump(mode="json") for m in mine])
    return [m for per_rank in gathered for m in per_rank]


def with_faulty_all_reduce(runtime, bad_global_rank: int, **options) -> list[dict]:
    real = collectives.OPS["all_reduce"]
    collectives.OPS["all_reduce"] = corrupting(real, bad_global_rank)
    try:
        return run(runtime, **options)
    finally:
        collectives.OPS["all_reduce"] = real


def main() -> None:
    mode, out = sys.argv[1], sys.argv[2]
    runtime = init_runtime(timeout_s=60)
    document: dict = {
        "runtime": {
            "rank": runtime.rank,
            "world_size": runtime.world_size,
            "local_rank": runtime.local_rank,
            "local_world_size": runtime.local_world_size,
            "node_rank": runtime.node_rank,
            "node_name": runtime.node_name,
            "node_names": runtime.node_names,
            "backend": runtime.backend,
            "device": str(runtime.device),
            "launcher": runtime.launcher,
        },
        "runs": {},
    }
    runs = document["runs"]
    if mode == "world":
        runs["float32"] = run(runtime, dtype="float32")
        runs["bfloat16"] = run(runtime, dtype="bfloat16")
        runs["faulty"] = with_faulty_all_reduce(runtime, 1, ops=["all_reduce", "broadcast"])
        runs["node"] = run(runtime, scope="node", ops=["all_reduce", "sendrecv"])
    elif mode == "split":
        # Four local ranks posing as two nodes of two: what init_runtime would find on 2 x 2 GPUs.
        runtime.local_world_size = 2
        runtime.node_rank = runtime.rank // 2
        runtime.node_names = ["fake-a", "fake-b"]
        runtime.node_name = runtime.node_names[runtime.node_rank]
        runs["node"] = run(runtime, scope="node")
        runs["node_faulty"] = with_faulty_all_reduce(runtime, 3, scope="node", ops=["all_reduce"])
        runs["world_after_split"] = run(runtime, ops=["all_reduce"])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    runtime.barrier()
    if runtime.rank == 0:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
    runtime.shutdown()


if __name__ == "__main__":
    main()

"""Worker for tests/test_pairs.py, started by `torchrun --standalone --nproc_per_node=4`:

    pairs_worker.py layouts OUT.json
    pairs_worker.py throttle OUT.json CGROUP_DIR HOME_DIR

The four local ranks pose as several nodes (as the split fixtures of test_collectives do), and the
benchmarks run through gpuval's own harness and checks, as `gpuval accept` runs them after health:
run_benchmarks, the outliers derived from the planned benchmarks' outlier metrics, threshold_checks.

'layouts': scope 'pairs' on 3 nodes of 2, 1 and 1 ranks (an odd count: byes), on 2 nodes of 2, on one
node (a SKIP); then accept's plan for collectives on 4 nodes of one rank (world sweep, then every pair).
'throttle': 4 nodes of one rank; the rank posing as node-d first moves its whole process (every thread:
gloo works in its own threads) into the CPU-limited cgroup CGROUP_DIR the test made, runs scope 'pairs',
and moves back to HOME_DIR. Nothing in gpuval knows: the node is slow because the kernel throttles it.

Rank 0 writes every run's measurements, checks and not-run reasons as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from gpuval.bench.registry import all_benchmarks
from gpuval.bench.run import bench_options, plan_benchmarks, run_benchmarks
from gpuval.checks import correctness_checks, outlier_measurements, threshold_checks
from gpuval.config import Profile
from gpuval.runtime import init_runtime

SMALL = {"warmup": 1, "iters": 2, "repeats": 2, "pair_bytes": "64KiB"}


def pose(runtime, node_of_rank: list[int]) -> None:
    """This rank belongs to node `node_of_rank[rank]` of nodes named node-a, node-b, ..."""
    runtime.node_rank = node_of_rank[runtime.rank]
    runtime.node_names = [f"node-{chr(ord('a') + i)}" for i in range(max(node_of_rank) + 1)]
    runtime.node_name = runtime.node_names[runtime.node_rank]
    mine = [rank for rank, node in enumerate(node_of_rank) if node == runtime.node_rank]
    runtime.local_world_size, runtime.local_rank = len(mine), mine.index(runtime.rank)


def judged(runtime, plan: dict, profile: Profile) -> dict:
    """What accept makes of these benchmarks' measurements (accept.run_accept after health)."""
    outcome = run_benchmarks(runtime, plan, quick=False)
    benchmarks = all_benchmarks()
    producers = {produced: name for name, bench in benchmarks.items() for produced in bench.produces}
    outliers = {name: benchmarks[name].outlier_metrics for name in plan if benchmarks[name].outlier_metrics}
    measurements = outcome.measurements + outlier_measurements(outcome.measurements, outliers)
    checks = threshold_checks(profile, measurements, outcome.not_run, producers)
    checks += correctness_checks(measurements)
    return {
        "measurements": [m.model_dump(mode="json") for m in measurements],
        "checks": [c.model_dump(mode="json") for c in checks],
        "not_run": {name: [status.value, reason] for name, (status, reason) in outcome.not_run.items()},
        "options": {name: options.model_dump(mode="json") for name, options in plan.items()},
    }


def pairs_scope(runtime, **options) -> dict:
    plan = {"collectives": bench_options("collectives", {"scope": "pairs", **options}, False, False)}
    return judged(runtime, plan, Profile(name="pairs-test"))


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    runtime = init_runtime(timeout_s=120)
    runs: dict = {}
    if mode == "layouts":
        pose(runtime, [0, 0, 1, 2])
        runs["three_nodes"] = pairs_scope(runtime, pair_ops=["all_reduce", "sendrecv"], **SMALL)
        pose(runtime, [0, 0, 1, 1])
        runs["two_nodes"] = pairs_scope(runtime, **SMALL)
        pose(runtime, [0, 0, 0, 0])
        runs["one_node"] = pairs_scope(runtime, **SMALL)
        pose(runtime, [0, 1, 2, 3])
        profile = Profile.model_validate(
            {
                "name": "pairs-accept",
                "checks": {"all_reduce.busbw_gbps": {"min": 1e-6, "bytes": "4KiB"}},
                "benchmarks": {"collectives": {"ops": ["all_reduce"], "max_bytes": "4KiB", **SMALL}},
            }
        )
        runs["accept_plan"] = judged(runtime, plan_benchmarks(profile, quick=True, on_gpu=False), profile)
    elif mode == "throttle":
        cgroup, home = Path(sys.argv[3]), Path(sys.argv[4])
        pose(runtime, [0, 1, 2, 3])
        throttled = runtime.node_name == "node-d"
        runtime.barrier()
        if throttled:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))  # the whole process, every thread
        runtime.barrier()
        try:
            # 4 MiB all_reduce over loopback TCP: copies and sums that a throttled CPU slows roughly
            # tenfold; 5 ops per timed block, the median of 3 blocks, so a single stall cannot decide
            runs["pairs"] = pairs_scope(runtime, pair_bytes="4MiB", warmup=1, iters=5, repeats=3)
        finally:
            if throttled:
                (home / "cgroup.procs").write_text(str(os.getpid()))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    runtime.barrier()
    if runtime.rank == 0:
        out.write_text(json.dumps(runs, indent=1), encoding="utf-8")
    runtime.shutdown()


if __name__ == "__main__":
    main()

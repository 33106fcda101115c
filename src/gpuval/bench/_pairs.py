"""Scope 'pairs' on the ranks: one process group per pair of nodes, and the rounds of the round-robin
schedule (gpuval.pairs) run one after the other, the pairs of a round at once (they share no node).

What a pair runs is the caller's: `measure(group, scope, params)` returns the measurements that pair's
first rank made (the collectives benchmark passes its op loop), so this module knows groups and rounds,
not collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuval.bench.registry import BenchmarkSkipped, Context
from gpuval.pairs import pair_scope, round_robin
from gpuval.results import Measurement

Measure = Callable[[Any, str, dict[str, Any]], list[Measurement]]


def run_pairs(ctx: Context, measure: Measure) -> list[Measurement]:
    """`measure` over every pair of nodes, scope 'pair:A+B', params 'nodes' [A, B] and 'round'."""
    import torch.distributed as dist

    runtime = ctx.runtime
    if runtime.num_nodes < 2:
        raise BenchmarkSkipped("one node: scope 'pairs' needs two or more nodes")
    node_of_rank = runtime.all_gather_object(runtime.node_rank)  # any rank layout, not only blocks
    ranks = {node: [r for r, n in enumerate(node_of_rank) if n == node] for node in range(runtime.num_nodes)}
    rounds = round_robin(range(runtime.num_nodes))
    # new_group is collective over every rank: every pair's group is made here, by all, in schedule order
    groups = {pair: dist.new_group(ranks[pair[0]] + ranks[pair[1]]) for pairs in rounds for pair in pairs}
    names = runtime.node_names
    measurements: list[Measurement] = []
    try:
        for number, pairs in enumerate(rounds, start=1):
            for a, b in pairs:
                if runtime.node_rank in (a, b):
                    scope = pair_scope(names[a], names[b])
                    ctx.progress(f"round {number}/{len(rounds)}: {scope}")
                    params = {"nodes": [names[a], names[b]], "round": number}
                    measurements += measure(groups[(a, b)], scope, params)
            runtime.barrier()  # rounds never overlap: a pair shares the network with its own round only
    finally:
        for (a, b), group in groups.items():
            if runtime.node_rank in (a, b):
                dist.destroy_process_group(group)  # its communicator (NCCL buffers) goes before later work
    return measurements

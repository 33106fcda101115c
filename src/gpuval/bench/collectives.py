"""NCCL/gloo collectives with nccl-tests' algbw/busbw, timed over a size sweep, results checked exactly.

Definitions follow NVIDIA/nccl-tests doc/PERFORMANCE.md: `S` is the size nccl-tests prints for the op
(column "size"), t the time of one op averaged over the ranks, `algbw = S / t`, `busbw = algbw *
factor(n)`. One table row per op holds its buffer layout, its busbw factor, the torch call, and the
exact expected result; one loop times them all.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, StrictInt

from gpuval.bench._pairs import run_pairs
from gpuval.bench._sweep import SizeSweep, sweep_sizes
from gpuval.bench.registry import Benchmark, BenchmarkSkipped, Context, register
from gpuval.config import PositiveByteSize
from gpuval.metrics import MeasurementDecl, Metric
from gpuval.results import Measurement
from gpuval.timing import MAX_CALLS, measure

# Largest integer each dtype holds exactly: sums of the fill pattern stay below it, so equality is exact.
_EXACT_LIMIT = {"float32": 2**24, "bfloat16": 2**8, "float16": 2**11}


@dataclass(frozen=True)
class Layout:
    """Element counts for one op at nccl-tests size S (in elements, already a multiple of n)."""

    input_count: int
    output_count: int


@dataclass
class Call:
    """Everything an op's torch call and expected-result function need."""

    group: Any
    n: int  # ranks in the group
    rank: int  # rank within the group
    count: int  # S in elements
    input: Any
    output: Any
    pattern: Callable[[int, int, int], Any]  # (rank, offset, length) -> tensor of that rank's input values


@dataclass(frozen=True)
class CollectiveOp:
    name: str
    layout: Callable[[int, int], Layout]  # (S elements, n) -> buffer sizes per rank
    busbw_factor: Callable[[int], float]  # n -> factor, nccl-tests doc/PERFORMANCE.md
    call: Callable[[Call], None]
    expected: Callable[[Call], Any]  # tensor this rank must hold in `output` afterwards
    in_place: bool = False  # output is the input buffer
    redop: str = "none"  # the reduction, as nccl-tests' redop column ('sum' for the reducing ops)
    root: int = -1  # the root rank of a rooted op (broadcast), -1 for the others, as nccl-tests prints


def _dist():
    import torch.distributed as dist

    return dist


def _global(call: Call, group_rank: int) -> int:
    return _dist().get_global_rank(call.group, group_rank)


def _sum_over_ranks(call: Call, offset: int, length: int):
    total = call.pattern(0, offset, length).clone()
    for other in range(1, call.n):
        total += call.pattern(other, offset, length)
    return total


def _all_reduce(call: Call) -> None:
    _dist().all_reduce(call.output, group=call.group)


def _all_gather(call: Call) -> None:
    dist = _dist()
    # torch >= 2.13 renamed all_gather_into_tensor; the device image (2.11) has only the old name.
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(
        call.output, call.input, group=call.group
    )


def _reduce_scatter(call: Call) -> None:
    dist = _dist()
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(
        call.output, call.input, group=call.group
    )


def _alltoall(call: Call) -> None:
    _dist().all_to_all_single(call.output, call.input, group=call.group)


def _broadcast(call: Call) -> None:
    _dist().broadcast(call.output, src=_global(call, 0), group=call.group)


def _sendrecv(call: Call) -> None:
    # nccl-tests' sendrecv: every rank sends to r+1 and receives from r-1 at the same time (a ring).
    dist = _dist()
    send_to, recv_from = _global(call, (call.rank + 1) % call.n), _global(call, (call.rank - 1) % call.n)
    ops = [
        dist.P2POp(dist.isend, call.input, send_to, group=call.group),
        dist.P2POp(dist.irecv, call.output, recv_from, group=call.group),
    ]
    for request in dist.batch_isend_irecv(ops):
        request.wait()


def _cat(parts):
    import torch

    return torch.cat(parts)


OPS: dict[str, CollectiveOp] = {
    op.name: op
    for op in (
        # all_reduce: S = per-rank buffer; busbw = algbw * 2(n-1)/n
        CollectiveOp(
            "all_reduce",
            layout=lambda s, n: Layout(s, s),
            busbw_factor=lambda n: 2 * (n - 1) / n,
            call=_all_reduce,
            expected=lambda c: _sum_over_ranks(c, 0, c.count),
            in_place=True,
            redop="sum",
        ),
        # all_gather: S = whole output (n x per-rank input); busbw = algbw * (n-1)/n
        CollectiveOp(
            "all_gather",
            layout=lambda s, n: Layout(s // n, s),
            busbw_factor=lambda n: (n - 1) / n,
            call=_all_gather,
            expected=lambda c: _cat([c.pattern(r, 0, c.count // c.n) for r in range(c.n)]),
        ),
        # reduce_scatter: S = whole input (n x per-rank output); busbw = algbw * (n-1)/n
        CollectiveOp(
            "reduce_scatter",
            layout=lambda s, n: Layout(s, s // n),
            busbw_factor=lambda n: (n - 1) / n,
            call=_reduce_scatter,
            expected=lambda c: _sum_over_ranks(c, c.rank * (c.count // c.n), c.count // c.n),
            redop="sum",
        ),
        # alltoall: S = per-rank send buffer; busbw = algbw * (n-1)/n
        CollectiveOp(
            "alltoall",
            layout=lambda s, n: Layout(s, s),
            busbw_factor=lambda n: (n - 1) / n,
            call=_alltoall,
            expected=lambda c: _cat(
                [c.pattern(r, c.rank * (c.count // c.n), c.count // c.n) for r in range(c.n)]
            ),
        ),
        # broadcast: S = buffer; busbw = algbw
        CollectiveOp(
            "broadcast",
            layout=lambda s, n: Layout(s, s),
            busbw_factor=lambda n: 1.0,
            call=_broadcast,
            expected=lambda c: c.pattern(0, 0, c.count),
            in_place=True,
            root=0,
        ),
        # sendrecv: S = buffer; busbw = algbw
        CollectiveOp(
            "sendrecv",
            layout=lambda s, n: Layout(s, s),
            busbw_factor=lambda n: 1.0,
            call=_sendrecv,
            expected=lambda c: c.pattern((c.rank - 1) % c.n, 0, c.count),
        ),
    )
}


# The op table above is the one list of collective names: options, measurements and declarations follow it.
ALL_OPS: tuple[str, ...] = tuple(OPS)
OpName = Literal[ALL_OPS]  # type: ignore[valid-type]


def bandwidth_gbps(op: str, size_bytes: int, time_s: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 B/s) as nccl-tests reports them for one op of size S taking time_s."""
    algbw = size_bytes / time_s / 1e9
    return algbw, algbw * OPS[op].busbw_factor(n)


def exact_count(size_bytes: int, element_size: int, n: int) -> int:
    """Elements of S, rounded down to a multiple of n (nccl-tests does the same), at least n."""
    count = size_bytes // element_size
    return max(n, count - count % n)


class CollectiveOptions(SizeSweep):
    ops: list[OpName] = Field(
        default_factory=lambda: list(ALL_OPS), min_length=1, description="the collectives to run"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="type (nccl-tests -d)")
    warmup: StrictInt = Field(5, ge=0, le=MAX_CALLS, description="untimed ops first (nccl-tests -w)")
    iters: StrictInt = Field(20, ge=1, le=MAX_CALLS, description="ops per timed block (nccl-tests -n)")
    repeats: StrictInt = Field(5, ge=1, le=MAX_CALLS, description="timed blocks; the median is reported")
    scope: Literal["world", "node", "pairs"] = Field(
        "world",
        description="'node': each node runs alone (NVLink only); 'pairs': every pair of nodes, round by "
        "round, with pair_ops at pair_bytes (finds a slow node or link)",
    )
    also_pairs: bool = Field(
        False, description="scope 'world' on three or more nodes: then run scope 'pairs' too (accept sets it)"
    )
    pair_ops: list[OpName] = Field(
        default_factory=lambda: ["all_reduce"], min_length=1, description="ops scope 'pairs' runs"
    )
    pair_bytes: PositiveByteSize = Field(
        2**30, description="S of scope 'pairs': large, where busbw is the links' rate"
    )
    cuda_graph: bool = Field(
        True,
        description="GPU: replay the timed ops from a CUDA graph, so Python's "
        "launch cost (~40 us per op) does not hide small-message latency",
    )


def _defaults(quick: bool, on_gpu: bool) -> dict[str, Any]:
    if on_gpu:
        return {
            "min_bytes": 2**20,
            "max_bytes": 2**30 if quick else 2**32,
            "step_factor": 4 if quick else 2,
            "repeats": 3 if quick else 5,
        }
    return {
        "min_bytes": 2**12,
        "max_bytes": 2**20 if quick else 2**22,
        "step_factor": 4,
        "warmup": 2,
        "iters": 5,
        "repeats": 3,
        "pair_bytes": 2**22,
    }


# Pessimistic rates for the phase's deadline (gpuval.deadline), keyed by "on a GPU": seconds per call (launch,
# rendezvous, the check's copies) and bytes S per second of one collective (NCCL: 5 GB/s, TCP sockets at
# 40 Gb/s, far below any NVLink or InfiniBand floor; gloo: 50 MB/s, a loaded CPU).
_PESSIMISTIC = {True: (0.005, 5e9), False: (0.02, 5e7)}


def expected_s(options: CollectiveOptions, runtime: Any) -> float:
    """Seconds the sweep takes at the pessimistic rates: every op at every size, warm-up, timed blocks and
    the check's call; scope 'pairs' as about one round per node."""
    call_s, rate = _PESSIMISTIC[bool(runtime.on_gpu)]
    calls = options.warmup + options.iters * options.repeats + 1
    sweep_s = len(options.ops) * calls * sum(call_s + size / rate for size in sweep_sizes(options))
    pairs_s = max(runtime.num_nodes, 1) * len(options.pair_ops) * calls * (call_s + options.pair_bytes / rate)
    if options.scope == "pairs":
        return pairs_s
    also_pairs = options.also_pairs and options.scope == "world" and runtime.num_nodes >= 3  # as run below
    return sweep_s + (pairs_s if also_pairs else 0.0)


def _group_for(ctx: Context, scope: str):
    dist = _dist()
    runtime = ctx.runtime
    if scope == "node" and runtime.num_nodes > 1:
        group, _ = dist.new_subgroups(group_size=runtime.local_world_size)
        return group, runtime.node_scope
    return dist.group.WORLD, "cluster"


def _capture(fn: Callable[[], None], count: int, group: Any, device: Any):
    """A CUDA graph of `count` back-to-back calls, or None where capture fails (then ops run eagerly).

    Every rank must agree: capture is tried everywhere and kept only if it worked on all ranks.
    """
    import torch

    dist = _dist()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(count):
                fn()
        ok = 1
    except Exception:  # noqa: BLE001 - an op or torch version that cannot be captured: time it eagerly
        graph, ok = None, 0
    torch.cuda.synchronize(device)
    flag = torch.tensor([ok], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return graph if flag.item() == 1 else None


def run_collectives(ctx: Context, options: CollectiveOptions) -> list[Measurement]:
    def pair(group: Any, scope: str, params: dict[str, Any]) -> list[Measurement]:
        return _run_ops(ctx, options, group, scope, options.pair_ops, [options.pair_bytes], params)

    if options.scope == "pairs":
        return run_pairs(ctx, pair)
    group, scope = _group_for(ctx, options.scope)
    measurements = _run_ops(ctx, options, group, scope, options.ops, sweep_sizes(options))
    if options.also_pairs and options.scope == "world" and ctx.runtime.num_nodes >= 3:
        measurements += run_pairs(ctx, pair)  # with two nodes the one pair is the world just measured
    return measurements


def _run_ops(
    ctx: Context,
    options: CollectiveOptions,
    group: Any,
    scope: str,
    ops: list[str],
    sizes: list[int],
    params: dict[str, Any] | None = None,
) -> list[Measurement]:
    """Each op at each size over `group`, timed and checked exactly; the group's first rank returns them."""
    import torch

    dist = _dist()
    runtime = ctx.runtime
    device = runtime.device
    dtype = getattr(torch, options.dtype)
    element_size = torch.tensor([], dtype=dtype).element_size()
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if n < 2:
        raise BenchmarkSkipped("one rank: a collective needs two or more GPUs (or processes) to move data")
    modulus = min(61, _EXACT_LIMIT[options.dtype] // n - 1)
    if modulus < 3:
        # Too few distinct values per rank to tell chunks apart, or sums past the dtype's exact range.
        raise ValueError(f"{options.dtype} cannot hold exact sums over {n} ranks; use dtype=float32")

    def pattern(source_rank: int, offset: int, length: int):
        # Small positive integers that differ per rank and per element: sums over n ranks stay exact in
        # `dtype`, and any misrouted, dropped or stale chunk changes the result.
        # (3*i + 11*r) mod m, reduced before multiplying so int32 indices cannot overflow (half the
        # memory of int64 at 4 GiB buffers).
        index_dtype = torch.int32 if offset + length < 2**31 else torch.int64
        index = torch.arange(offset, offset + length, device=device, dtype=index_dtype)
        index.remainder_(modulus).mul_(3).add_(source_rank * 11).remainder_(modulus).add_(1)
        return index.to(dtype)

    def barrier() -> None:
        dist.barrier(group=group, device_ids=[device.index] if device.type == "cuda" else None)
        runtime.synchronize()

    measurements: list[Measurement] = []
    for op_name in ops:
        op = OPS[op_name]
        for size in sizes:
            ctx.progress(f"{op_name} {size} B")
            count = exact_count(size, element_size, n)
            layout = op.layout(count, n)
            source = pattern(rank, 0, layout.input_count)
            output = source if op.in_place else torch.empty(layout.output_count, dtype=dtype, device=device)
            if not op.in_place:
                output.fill_(-1)  # poison: an element the op never wrote cannot pass the check
            call = Call(group, n, rank, count, source, output, pattern)

            OPS[op_name].call(call)  # looked up at call time so tests can substitute a faulty op
            runtime.synchronize()
            wrong = int((call.output != op.expected(call)).sum().item())
            counts = torch.tensor([wrong], dtype=torch.int64, device=device)
            dist.all_reduce(counts, group=group)

            graph = (
                _capture(lambda o=op_name, c=call: OPS[o].call(c), options.iters, group, device)
                if (options.cuda_graph and device.type == "cuda")
                else None
            )
            if graph is not None:
                times = [
                    t / options.iters
                    for t in measure(
                        graph.replay,
                        device,
                        warmup=options.warmup,
                        repeats=options.repeats,
                        before_each=barrier,
                    )
                ]
            else:
                times = measure(
                    lambda o=op_name, c=call: OPS[o].call(c),
                    device,
                    warmup=options.warmup,
                    repeats=options.repeats,
                    inner=options.iters,
                    before_each=barrier,
                )
            # nccl-tests reports the time averaged over ranks (its default -a 1); then the median block.
            per_rank = torch.tensor(times, dtype=torch.float64, device=device)
            dist.all_reduce(per_rank, group=group)
            mean_times = (per_rank / n).tolist()
            median_s = statistics.median(mean_times)
            exact_bytes = count * element_size
            algbw, busbw = bandwidth_gbps(op_name, exact_bytes, median_s, n)
            if rank != 0:
                continue  # one measurement per group, made by its first rank (all ranks timed it)
            measurements.append(
                Measurement(
                    name=op_name,
                    scope=scope,
                    params={
                        "bytes": size,
                        "bytes_exact": exact_bytes,
                        "count": count,  # elements, as nccl-tests' count column
                        "dtype": options.dtype,
                        "redop": op.redop,
                        "root": op.root,
                        "in_place": op.in_place,
                        "ranks": n,
                        "iters": options.iters,
                        "cuda_graph": graph is not None,
                        **(params or {}),
                    },
                    metrics={
                        "time_us": median_s * 1e6,
                        "time_us_min": min(mean_times) * 1e6,
                        "time_us_max": max(mean_times) * 1e6,
                        "algbw_gbps": algbw,
                        "busbw_gbps": busbw,
                        "wrong_elements": float(counts.item()),
                    },
                    samples=options.repeats,
                )
            )
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return measurements


def _plan(overrides: dict[str, Any], thresholds: dict[str, Any]) -> dict[str, Any]:
    """accept's options: on three or more nodes every pair of nodes runs after the world (unless the
    profile sets also_pairs), and the sizes the thresholds name are measured."""
    return {"also_pairs": True, **_sizes_from_thresholds(overrides, thresholds)}


def _sizes_from_thresholds(overrides: dict[str, Any], thresholds: dict[str, Any]) -> dict[str, Any]:
    """Sizes named by thresholds are measured even when the sweep would not reach them."""
    sizes = {t.bytes for t in thresholds.values() if t.bytes is not None}
    extra = overrides.get("extra_sizes", [])
    if sizes and isinstance(extra, list):  # anything else is refused by the options' validation
        overrides = {
            **overrides,
            "extra_sizes": [*extra, *sorted(size for size in sizes if size not in extra)],
        }
    return overrides


_METRICS = (
    Metric("time_us", "us", -1, description="time per op, averaged over the ranks"),
    Metric("algbw_gbps", "GB/s", +1, description="algbw"),
    Metric("busbw_gbps", "GB/s", +1, description="busbw, nccl-tests' definition", plot=True),
    Metric("wrong_elements", "elements", -1, description="elements that differ from the exact result"),
)
_HINT = (
    "check NVLink/InfiniBand state and errors (nvidia-smi nvlink -e, ibstat), topology "
    "(nvidia-smi topo -m) and NCCL_* settings; --set benchmarks.collectives.scope=node finds the node"
)

register(
    Benchmark(
        name="collectives",
        summary=f"{', '.join(ALL_OPS)}: nccl-tests busbw",
        options=CollectiveOptions,
        defaults=_defaults,
        run=run_collectives,
        expected_s=expected_s,
        metrics=tuple(
            MeasurementDecl(
                op, _METRICS, identity=("bytes", "dtype"), hint=_HINT, view="size_sweep", by_gpu_count=True
            )
            for op in ALL_OPS
        ),
        # 'outliers.collectives_pct': the node or link that the pairs of nodes (scope 'pairs') blame
        outlier_metrics=("busbw_gbps",),
        plan=_plan,
        crosses_nodes=True,
    )
)

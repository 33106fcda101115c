"""Summarise a PyTorch profiler Chrome trace (train.log.profile_steps' trace.json) of GPU 0: the window
from the first to the last kernel, the time some kernel ran (union over streams), the idle rest, each
stream's kernel time, NCCL's time and how much of it no compute kernel overlapped, the top kernels.

    python3 tools/device/trace_summary.py TRACE.json [TRACE.json ...]   # one JSON line per trace
"""

from __future__ import annotations

import bisect
import json
import sys
from collections import defaultdict


def union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summary(path: str) -> dict:
    events = json.load(open(path))["traceEvents"]
    kernels = [
        e
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "kernel" and e.get("args", {}).get("device", 0) == 0
    ]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in kernels]
    window = max(b for _, b in spans) - min(a for a, _ in spans)
    nccl = union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" in e["name"].lower()])
    compute = union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" not in e["name"].lower()])
    streams: dict[int, float] = defaultdict(float)
    names: dict[str, float] = defaultdict(float)
    for e in kernels:
        streams[e["args"].get("stream", -1)] += e["dur"]
        names[e["name"][:90]] += e["dur"]
    top = sorted(names.items(), key=lambda kv: -kv[1])[:15]
    gaps = idle_gaps(union(spans))
    host = host_in_gaps(events, gaps)
    ms = 1e-3
    return {
        "trace": path,
        "window_ms": round(window * ms, 1),
        "busy_ms": round(length(union(spans)) * ms, 1),
        "compute_ms": round(length(compute) * ms, 1),
        "nccl_ms": round(length(nccl) * ms, 1),
        "nccl_not_overlapped_ms": round((length(nccl) - overlap(nccl, compute)) * ms, 1),
        "idle_ms": round((window - length(union(spans))) * ms, 1),
        "streams_ms": {str(k): round(v * ms, 1) for k, v in sorted(streams.items())},
        "top_kernels_ms": [[n, round(t * ms, 1)] for n, t in top],
        "idle_gaps": {
            "count": len(gaps),
            "over_1ms": sum(1 for a, b in gaps if b - a > 1000),
            "largest_ms": [round((b - a) * ms, 2) for a, b in sorted(gaps, key=lambda g: g[0] - g[1])[:10]],
        },
        **host,
    }


def largest(spent: dict[str, float], n: int = 12) -> list[list]:
    """The n names that took the most time, with their milliseconds."""
    return [[name, round(t * 1e-3, 1)] for name, t in sorted(spent.items(), key=lambda kv: -kv[1])[:n]]


def idle_gaps(busy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """GPU 0's times between kernels (longer than 20 us: launch latency is not a gap)."""
    return [(a[1], b[0]) for a, b in zip(busy, busy[1:], strict=False) if b[0] - a[1] > 20]


def host_in_gaps(events: list[dict], gaps: list[tuple[float, float]]) -> dict:
    """What the host's threads ran while GPU 0 idled: the CUDA runtime calls (synchronisations and
    copies are the host waiting on the GPU) and the operators, each by its time inside the gaps; time in
    no operator nor runtime call of the main thread is Python between operators (hooks, bookkeeping)."""
    ms = 1e-3
    runtime = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    if not ops:
        return {}
    threads: dict[object, int] = defaultdict(int)
    for e in ops:
        threads[e.get("tid")] += 1
    # the trainer's thread: the one holding its phase ranges; else the one that ran the most operators (on a
    # GPU, autograd's device thread can run more than the main thread)
    phase_threads = {
        e.get("tid") for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("gpuval: ")
    }
    main = next(iter(phase_threads)) if len(phase_threads) == 1 else max(threads, key=lambda t: threads[t])
    gap_spans = union(gaps)

    def inside(selected: list[dict]) -> dict[str, float]:
        spent: dict[str, float] = defaultdict(float)
        for e in selected:
            spent[e["name"][:60]] += overlap([(e["ts"], e["ts"] + e["dur"])], gap_spans)
        return spent

    # every thread's but Python's own threads (gpuval's deadline watchers, waiting): the backward's hooks
    # run on autograd's device thread, which Python did not start
    python = [e for e in events if e.get("ph") == "X" and e.get("cat") == "python_function"]
    started = {
        e.get("tid") for e in python if "threading.py" in e["name"] and e["name"].endswith(": _bootstrap")
    }
    python = [e for e in python if e.get("tid") not in started]
    by_runtime = inside([e for e in runtime if e.get("tid") == main])
    by_op_all = inside([e for e in ops if e.get("tid") == main])
    main_busy = union([(e["ts"], e["ts"] + e["dur"]) for e in ops + runtime if e.get("tid") == main])
    gap_total = length(gap_spans)
    covered = overlap(main_busy, gap_spans)
    return {
        "gap_ms": round(gap_total * ms, 1),
        "gap_in_an_op_or_runtime_call_ms": round(covered * ms, 1),
        "gap_in_python_between_ops_ms": round((gap_total - covered) * ms, 1),
        "gap_runtime_calls_ms": largest(by_runtime),
        "gap_ops_ms (nested ops counted in each)": largest(by_op_all),
        **phases_of_gaps(events, gap_spans, main),
        "largest_gaps": describe(events, gap_spans, python),
        **(python_in_gaps(python, gap_spans) if python else {}),
    }


def phases_of_gaps(events: list[dict], gaps: list[tuple[float, float]], main: object) -> dict:
    """The idle time by the step's phase the main thread was in (the trainer's `gpuval: ...` ranges)."""
    phases = [
        (e["ts"], e["ts"] + e["dur"], e["name"])
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
        and e.get("tid") == main
        and e["name"].startswith("gpuval: ")
    ]
    spent: dict[str, float] = defaultdict(float)
    for name in {n for _, _, n in phases}:
        spent[name] = overlap(union([(a, b) for a, b, n in phases if n == name]), gaps)
    spent["(outside them)"] = length(gaps) - sum(spent.values())
    return {"gap_by_phase_ms": largest(spent)} if phases else {}


def describe(events: list[dict], gaps: list[tuple[float, float]], python: list[dict], n: int = 8) -> list:
    """The n longest gaps: when (ms from the first kernel), how long, and what the host ran meanwhile (the
    operators and, with stacks, the DeepSpeed/gpuval/... functions overlapping it most, any thread)."""
    first = gaps[0][0] if gaps else 0.0
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    library = [e for e in python if any(o in e["name"] for o in OWNERS)]
    described = []
    for a, b in sorted(gaps, key=lambda g: g[0] - g[1])[:n]:

        def most(selected: list[dict], a: float = a, b: float = b) -> list[list]:
            # per name: the most of the gap one of its calls covers, and that call's length; listed by
            # coverage, then innermost (shortest call) first, so enclosing frames come after
            spent: dict[str, tuple[float, float]] = {}
            for e in selected:
                if e["ts"] < b and e["ts"] + e["dur"] > a:
                    name = e["name"].split("site-packages/")[-1][:90]
                    covered = round(min(b, e["ts"] + e["dur"]) - max(a, e["ts"]), -1)  # 10 us steps
                    spent[name] = max(spent.get(name, (0.0, 0.0)), (covered, -e["dur"]))
            ranked = sorted(spent.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))[:6]
            return [[name, round(covered * 1e-3, 2)] for name, (covered, _) in ranked]

        described.append(
            {"at_ms": round((a - first) * 1e-3, 1), "ms": round((b - a) * 1e-3, 2), "ops": most(ops)}
            | ({"python": most(library)} if library else {})
        )
    return described


OWNERS = ("deepspeed/", "gpuval/", "peft/", "transformers/", "accelerate/")


def python_in_gaps(python: list[dict], gaps: list[tuple[float, float]]) -> dict:
    """With the profiler's Python stacks (train.log.profile_stack): the main thread's time inside GPU 0's
    idle gaps, by the innermost Python function (its own time, callees' taken out) and by the innermost
    frame of DeepSpeed, gpuval, PEFT, transformers or accelerate on the stack (torch and builtins charged to
    the library code that called them), and the library functions that held the most of it, callees
    included."""
    starts = [a for a, _ in gaps]
    before = [0.0]  # gap time before each gap starts
    for a, b in gaps:
        before.append(before[-1] + b - a)

    def in_gaps(t: float) -> float:  # gap time before instant t
        i = bisect.bisect_right(starts, t)
        if i == 0:
            return 0.0
        a, b = gaps[i - 1]
        return before[i - 1] + min(t, b) - a

    own: dict[str, float] = defaultdict(float)
    owner: dict[str, float] = defaultdict(float)
    held: dict[str, float] = defaultdict(float)
    threads: dict[str, float] = defaultdict(float)
    by_thread: dict[object, list[dict]] = defaultdict(list)
    for e in python:
        by_thread[e.get("tid")].append(e)
    for tid, selected in by_thread.items():  # the backward's hooks run on autograd's device thread
        stack: list[list] = []  # [end, name, gap time of its own, owner name]

        def close(frame: list, tid: object = tid) -> None:
            own[frame[1]] += frame[2]
            owner[frame[3]] += frame[2]
            threads[str(tid)] += frame[2]

        for e in sorted(selected, key=lambda e: (e["ts"], -e["dur"])):
            start, end = e["ts"], e["ts"] + e["dur"]
            while stack and stack[-1][0] <= start:
                close(stack.pop())
            inside = in_gaps(end) - in_gaps(start)
            name = e["name"].split("site-packages/")[-1][:110]
            if stack:
                stack[-1][2] -= inside
            library = any(o in name for o in OWNERS)
            if library and not any(f[1] == name for f in stack):  # recursion counted once
                held[name] += inside
            outer = stack[-1][3] if stack else "(no library)"
            stack.append([end, name, inside, name if library else outer])
        while stack:
            close(stack.pop())
    return {
        "gap_python_own_ms": largest(own, 25),
        "gap_python_by_library_frame_ms": largest(owner, 25),
        "gap_python_library_held_ms (callees included)": largest(held, 60),
        "gap_python_threads_ms": largest(threads),
    }


if __name__ == "__main__":
    for trace in sys.argv[1:]:
        print(json.dumps(summary(trace)))

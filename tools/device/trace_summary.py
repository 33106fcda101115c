"""Summarise a PyTorch profiler Chrome trace (train.log.profile_steps' trace.json) of GPU 0: the window
from the first to the last kernel, the time some kernel ran (union over streams), the idle rest, each
stream's kernel time, NCCL's time and how much of it no compute kernel overlapped, the top kernels.

    python3 tools/device/trace_summary.py TRACE.json [TRACE.json ...]   # one JSON line per trace
"""

from __future__ import annotations

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
    }


if __name__ == "__main__":
    for trace in sys.argv[1:]:
        print(json.dumps(summary(trace)))

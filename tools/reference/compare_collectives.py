"""gpuval's busbw against raw NCCL's (nccl_reference.cu) at every op and size: ratio in %.

Usage: compare_collectives.py REFERENCE.jsonl GPUVAL.json [GPUVAL_EAGER.json] --output COMPARE.json
       compare_collectives.py --rounds DIR --output ALTERNATE.json
The second form reads DIR/nccl-N.jsonl and DIR/gpuval-N.json of alternated rounds (collectives_alternate.sh)
and reports, per op and size, every round's busbw and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics


def _gpuval(path: str) -> dict[tuple[str, int], float]:
    with open(path) as handle:
        document = json.load(handle)
    return {(m["name"], m["params"]["bytes"]): m["metrics"]["busbw_gbps"] for m in document["measurements"]}


def _reference(path: str) -> dict[tuple[str, int], float]:
    with open(path) as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return {(r["op"], r["bytes"]): r["busbw_gbps"] for r in rows}


def rounds(directory: str, output: str) -> None:
    found = glob.glob(os.path.join(directory, "nccl-*.jsonl"))
    numbers = sorted(int(os.path.basename(p)[len("nccl-") : -len(".jsonl")]) for p in found)
    nccl = [_reference(os.path.join(directory, f"nccl-{n}.jsonl")) for n in numbers]
    ours = [_gpuval(os.path.join(directory, f"gpuval-{n}.json")) for n in numbers]
    rows = []
    header = f"{'op':15} {'size':>10} {'nccl busbw per round':>30} {'gpuval busbw per round':>30}"
    print(f"{header} {'median %':>9}")
    for key in nccl[0]:
        ratios = [100 * g[key] / r[key] for r, g in zip(nccl, ours, strict=True) if key in g and r.get(key)]
        row = {
            "op": key[0],
            "bytes": key[1],
            "nccl_busbw_gbps": [r.get(key) for r in nccl],
            "gpuval_busbw_gbps": [g.get(key) for g in ours],
            "pct_of_nccl_per_round": ratios,
            "median_pct_of_nccl": statistics.median(ratios) if ratios else None,
        }
        rows.append(row)
        label = f"{key[1] >> 20} MiB" if key[1] < 2**30 else f"{key[1] >> 30} GiB"
        print(
            f"{key[0]:15} {label:>10} {' '.join(f'{v:7.1f}' for v in row['nccl_busbw_gbps']):>30} "
            f"{' '.join(f'{v or 0:7.1f}' for v in row['gpuval_busbw_gbps']):>30} "
            f"{row['median_pct_of_nccl'] or 0:9.1f}"
        )
    with open(output, "w") as handle:
        json.dump({"rounds": numbers, "rows": rows}, handle, indent=2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("reference", nargs="?")
    parser.add_argument("gpuval", nargs="?")
    parser.add_argument("gpuval_eager", nargs="?")
    parser.add_argument("--rounds", help="folder of alternated rounds (collectives_alternate.sh)")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    if args.rounds:
        rounds(args.rounds, args.output)
        return
    if not (args.reference and args.gpuval):
        parser.error("give REFERENCE.jsonl and GPUVAL.json, or --rounds DIR")
    with open(args.reference) as handle:
        reference = [json.loads(line) for line in handle if line.strip()]
    graph = _gpuval(args.gpuval)
    eager = _gpuval(args.gpuval_eager) if args.gpuval_eager else {}
    rows = []
    for ref in reference:
        key = (ref["op"], ref["bytes"])
        row = {
            "op": ref["op"],
            "bytes": ref["bytes"],
            "nccl_busbw_gbps": ref["busbw_gbps"],
            "gpuval_busbw_gbps": graph.get(key),
            "gpuval_eager_busbw_gbps": eager.get(key),
        }
        for label, table in (("gpuval_pct_of_nccl", graph), ("eager_pct_of_nccl", eager)):
            row[label] = 100 * table[key] / ref["busbw_gbps"] if key in table else None
        rows.append(row)
    with open(args.output, "w") as handle:
        json.dump({"rows": rows}, handle, indent=2)
    print(f"{'op':15} {'size':>10} {'nccl':>8} {'gpuval':>8} {'%':>6} {'eager':>8} {'%':>6}")
    for row in rows:
        size = row["bytes"]
        label = f"{size >> 20} MiB" if size < 2**30 else f"{size >> 30} GiB"
        values = [
            row[k] or 0.0
            for k in (
                "nccl_busbw_gbps",
                "gpuval_busbw_gbps",
                "gpuval_pct_of_nccl",
                "gpuval_eager_busbw_gbps",
                "eager_pct_of_nccl",
            )
        ]
        print(f"{row['op']:15} {label:>10} " + " ".join(f"{v:8.1f}" for v in values))


if __name__ == "__main__":
    main()

"""gpuval's busbw against raw NCCL's (nccl_reference.cu) at every op and size: ratio in %.

Usage: compare_collectives.py REFERENCE.jsonl GPUVAL.json [GPUVAL_EAGER.json] --output COMPARE.json
"""

from __future__ import annotations

import argparse
import json


def _gpuval(path: str) -> dict[tuple[str, int], float]:
    with open(path) as handle:
        document = json.load(handle)
    return {(m["name"], m["params"]["bytes"]): m["metrics"]["busbw_gbps"] for m in document["measurements"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("reference")
    parser.add_argument("gpuval")
    parser.add_argument("gpuval_eager", nargs="?")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
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

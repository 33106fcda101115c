"""The scaling table of one finetune_scaling_device.sh phase: every run's per-GPU tokens/s against the
fastest one-GPU run of the same precision in the same folder (the same call, the same machine).

    python tools/device/scaling_table.py FOLDER      # prints the table, writes FOLDER/scaling.json

A run is a `gpuval bench train` result (gpuval.bench/v1: its `train` measurement) or a fine-tune
train_summary.json (the shipped recipe: median tokens/s/GPU over the steps after the first two, which
compile and warm the allocator). Retention = tokens/s/GPU of the run / tokens/s/GPU of the one-GPU run:
what a user's job keeps per GPU when it spreads over N of them (issue 35's targets at 4 GPUs: DDP >= 95 %,
FSDP2 >= 90 %, ZeRO-3 >= 80 %).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from gpuval.finetune.trainer import step_summary_keys

TARGETS = {"ddp": 0.95, "fsdp": 0.90, "deepspeed": 0.80}  # issue 35, at 4 GPUs
SHIPPED_SKIP = 2  # first steps of a fine-tune left out: compilation and the allocator's warm-up
PART_KEYS = step_summary_keys()  # what the parts ran, as the trainer declares it


def read_run(path: Path) -> dict[str, Any] | None:
    """One run's row: name, world, parallel, precision, tokens/s/GPU (median, min, max), peak GiB, parts."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema", "").startswith("gpuval.bench"):
        found = [m for m in data.get("measurements", []) if m["name"] == "train"]
        if not found:
            return {"name": path.stem, "error": f"status {data.get('status')}: {data.get('detail')}"}
        m = found[0]
        p, metrics = m["params"], m["metrics"]
        return {
            "name": path.stem,
            "world": p["world_size"],
            "parallel": p["parallel"],
            "precision": p.get("precision", "bf16"),
            "tokens_per_s_per_gpu": metrics["tokens_per_s_per_gpu"],
            "min": metrics["tokens_per_s_per_gpu_min"],
            "max": metrics["tokens_per_s_per_gpu_max"],
            "mfu_pct": metrics.get("mfu_pct"),
            "peak_memory_gib": metrics.get("peak_memory_gib"),
            "loss_first": metrics.get("loss_first"),
            "loss_last": metrics.get("loss_last"),
            "parts": {k: p[k] for k in PART_KEYS if k in p},
        }
    if "steps" in data:  # train_summary.json
        rates = [s["tokens_per_s_per_gpu"] for s in data["steps"][SHIPPED_SKIP:]]
        if not rates:
            return {"name": path.stem, "error": "fewer steps than the warm-up left out"}
        return {
            "name": path.stem,
            "world": data["world_size"],
            "parallel": data["parallel"],
            "precision": data["precision"],
            "tokens_per_s_per_gpu": statistics.median(rates),
            "min": min(rates),
            "max": max(rates),
            "mfu_pct": None,
            "shipped": True,  # the shipped recipe: its own batch shape, so no ratio to bench train's one GPU
            "peak_memory_gib": data.get("peak_memory_gib"),
            "loss_first": data["steps"][0]["loss"],
            "loss_last": data["steps"][-1]["loss"],
            "parts": {k: data[k] for k in PART_KEYS if k in data},
        }
    return None


def table(folder: Path) -> dict[str, Any]:
    rows = [
        r
        for p in sorted(folder.glob("*.json"))
        if p.name not in ("env.json", "scaling.json")
        if (r := read_run(p)) is not None
    ]
    # the baseline of each precision: its fastest one-GPU run (a folder may hold a diagnostic one too, such
    # as eager layers), so no run is flattered by a slower baseline
    ones: dict[str, dict[str, Any]] = {}
    for r in rows:
        if "error" not in r and r["world"] == 1 and not r.get("shipped"):
            best = ones.get(r["precision"])
            if best is None or r["tokens_per_s_per_gpu"] > best["tokens_per_s_per_gpu"]:
                ones[r["precision"]] = r
    for row in rows:
        one = ones.get(row.get("precision"))
        if "error" in row or one is None or row["world"] == 1 or row.get("shipped"):
            continue
        row["retention"] = row["tokens_per_s_per_gpu"] / one["tokens_per_s_per_gpu"]
        row["against"] = one["name"]
        target = TARGETS.get(row["parallel"])
        if target is not None and row["world"] >= 4 and row["name"].startswith(row["parallel"] + "-"):
            row["target"] = target
            row["meets_target"] = row["retention"] >= target
    return {"folder": folder.name, "runs": rows}


def main() -> int:
    folder = Path(sys.argv[1])
    result = table(folder)
    (folder / "scaling.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"{'run':<28} {'GPUs':>4} {'tokens/s/GPU':>13} {'range':>17} {'of 1 GPU':>9} {'peak GiB':>9}")
    for r in result["runs"]:
        if "error" in r:
            print(f"{r['name']:<28} ERROR {r['error']}")
            continue
        share = f"{100 * r['retention']:.1f} %" if "retention" in r else "-"
        peak = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") is not None else "-"
        span = f"{r['min']:,.0f}-{r['max']:,.0f}"
        rate = f"{r['tokens_per_s_per_gpu']:,.0f}"
        print(f"{r['name']:<28} {r['world']:>4} {rate:>13} {span:>17} {share:>9} {peak:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

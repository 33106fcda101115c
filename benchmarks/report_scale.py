"""`gpuval report` and `gpuval compare` at scale: one result of 1,000 nodes × 8 GPUs, in how many seconds.

Synthesises one accept result of N nodes as benchmarks/fleet_scale.py synthesises its fleet, from the same
committed 4×H200 standard run (widened to 8 GPUs, renamed per node, values jittered by a seeded RNG): every
node's checks, measurements and inventory in one result.json, the cluster's collectives once, the verdict
made again from the checks. The per-shape matmul sweep (`matmul_sweep`, 488 rows a node, kept in the JSON
only: no report shows it) is left out unless --sweep. A second run of the same nodes (another seed) is
compare's AFTER. Both are written as gpuval writes a result (indented JSON).

Then times, as a user waits for them, `gpuval report A` and `gpuval compare A B` as child processes, each
--runs times (median, fastest, slowest); and, in this process, their parts: reading and validating one
file (gpuval.results.load_result, whose size limit, MAX_RESULT_BYTES, a result of this size is within),
rendering the page, reading both files (the later in a child: gpuval.forked), comparing, and printing the
comparison table.

    python benchmarks/report_scale.py [--nodes 1000] [--gpus 8] [--sweep] [--runs 5] [--output figures.json]

Issue 50's goal: report and compare ≤ 5 s each on a 2-core machine.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import fleet_scale  # beside this file: python puts the script's folder on sys.path

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 5.0  # issue 50


def _cluster_wide(item: dict) -> bool:
    return item["scope"] == "cluster"


def synthesise(base: dict, names: list[str], seed: int) -> dict:
    """One result of every node in `names`: `base` (a one-node result) per node, renamed and jittered, its
    cluster-wide checks and measurements (the collectives) once."""
    from gpuval.results import Check, verdict

    rng = random.Random(seed)
    local = dict(base)
    local["checks"] = [c for c in base["checks"] if not _cluster_wide(c)]
    local["measurements"] = [m for m in base["measurements"] if not _cluster_wide(m)]
    document = copy.deepcopy(base)
    document["inventory"]["nodes"] = []
    document["checks"] = [c for c in document["checks"] if _cluster_wide(c)]
    document["measurements"] = [m for m in document["measurements"] if _cluster_wide(m)]
    started = datetime(2026, 12, 6, 8, 0, tzinfo=timezone.utc)
    for name in names:
        node = fleet_scale.node_result(local, name, rng, started)
        document["inventory"]["nodes"] += node["inventory"]["nodes"]
        document["checks"] += node["checks"]
        document["measurements"] += node["measurements"]
    document["started_at"] = started.isoformat(timespec="seconds")
    document["world"].update(size=len(names) * len(base["inventory"]["nodes"][0]["gpus"]), nodes=len(names))
    document["verdict"] = verdict([Check.model_validate(c) for c in document["checks"]]).value
    return document


def _write(document: dict, path: Path) -> int:
    from gpuval.results import Result

    text = Result.model_validate(document).to_json()  # as accept writes it: validated, indented
    path.write_text(text, encoding="utf-8")
    return len(text.encode("utf-8"))


def _child(args: list[str], runs: int) -> dict:
    """`python -m gpuval ARGS`, `runs` times one after the other: the median, fastest and slowest wall
    time (a shared host's speed moves by a quarter from minute to minute), the exit codes and the last
    line said on stderr."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), COLUMNS="150", NO_COLOR="1")
    walls, codes, said = [], [], ""
    for _ in range(runs):
        began = time.perf_counter()
        command = [sys.executable, "-m", "gpuval", *args]
        proc = subprocess.run(command, capture_output=True, text=True, env=env)
        walls.append(round(time.perf_counter() - began, 2))
        codes.append(proc.returncode)
        said = (proc.stderr.strip().splitlines() or [""])[-1][:300]
    return {
        "wall_s": walls,
        "median_s": round(statistics.median(walls), 2),
        "min_s": min(walls),
        "max_s": max(walls),
        "exit_codes": codes,
        "stderr_last_line": said,
    }


def _timed(work):
    began = time.perf_counter()
    value = work()
    return value, round(time.perf_counter() - began, 2)


def _in_process(before: Path, after: Path) -> dict:
    """Each command's parts, timed in this process as the commands run them."""
    from rich.console import Console

    from gpuval.inputs import collector_paused
    from gpuval.report.compare import compare, lost_metrics, read_sides, summarize
    from gpuval.report.console import print_comparison
    from gpuval.report.html import render_html
    from gpuval.results import load_result

    def read() -> Any:
        with collector_paused(freeze=True):
            return load_result(before)

    result, read_s = _timed(read)
    page, render_s = _timed(lambda: render_html(result))
    (side_a, side_b), sides_s = _timed(lambda: read_sides(before, after))
    (rows, unmatched), compare_s = _timed(lambda: compare(side_a, side_b))
    summaries, summarize_s = _timed(lambda: summarize(rows, 0.0))
    _, lost_s = _timed(lambda: lost_metrics(side_a, side_b))
    console = Console(file=io.StringIO(), width=150)
    _, print_s = _timed(
        lambda: print_comparison(rows, unmatched, str(before), str(after), console, summaries=summaries)
    )
    return {
        "report_read_and_validate_s": read_s,
        "report_render_s": render_s,
        "report_page_mib": round(len(page.encode("utf-8")) / 2**20, 2),
        "compare_read_both_s": sides_s,
        "compare_s": round(compare_s + summarize_s + lost_s, 2),
        "compare_print_s": print_s,
        "compared_measurements": len(summaries),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--base", type=Path, default=fleet_scale.BASE_8GPU)
    parser.add_argument("--sweep", action="store_true", help="keep the per-shape matmul sweep rows")
    parser.add_argument("--runs", type=int, default=5, help="times each command is run (default 5)")
    parser.add_argument("--output", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    import gpuval

    base = fleet_scale.load(args.base)
    fleet_scale.widen(base, args.gpus)
    if not args.sweep:
        base["measurements"] = [m for m in base["measurements"] if m["name"] != "matmul_sweep"]
    width = len(str(args.nodes))
    names = [f"gpu-node{number:0{width}d}" for number in range(1, args.nodes + 1)]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="gpuval-report-scale-") as tmp:
        before, after = Path(tmp) / "a.json", Path(tmp) / "b.json"
        began = time.perf_counter()
        sizes = [_write(synthesise(base, names, seed), path) for seed, path in ((50, before), (51, after))]
        made_s = time.perf_counter() - began
        cli = {
            "report": _child(["report", str(before), "--output", f"{tmp}/report.html"], args.runs),
            "compare": _child(["compare", str(before), str(after)], args.runs),
        }
        parts = _in_process(before, after)
    figures = {
        "command": ["python", "benchmarks/report_scale.py", *sys.argv[1:]],
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "base": str(args.base.resolve().relative_to(REPO)),
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "matmul_sweep_kept": args.sweep,
        "result_mib": round(sizes[0] / 2**20, 1),
        "synthesis_s": round(made_s, 1),
        "cli": cli,
        "in_process": parts,
        "goal_s": GOAL_S,
        "versions": {
            "python": platform.python_version(),
            "gpuval": gpuval.__version__,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
        },
    }
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

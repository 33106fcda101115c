"""`gpuval fleet` at scale: 1,000 nodes × 8 GPUs summarised in how many seconds and how much memory.

Synthesises one result.json per node from a committed real result (a 4×H200 `accept` standard run, widened
to 8 GPUs: every per-GPU check and measurement copied to GPUs 4-7, every ordered pair of the 8 GPUs given a
P2P link), renamed per node and its checks' values jittered by a seeded RNG; plants one FAIL node, three
nodes 8 % slow on one check and two expected nodes with no result; then runs `python -m gpuval fleet` on
the folder as a child process and records its wall time and peak RSS (getrusage of the child).

    python benchmarks/fleet_scale.py --output benchmarks/results/<date>-cpu-fleet-scale/fleet-scale.json

The synthesis functions are also the fixtures of tests/test_fleet_view.py (200 nodes from an H100 run).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE_8GPU = REPO / "benchmarks/results/2026-11-27-h200x4-multi-gpu-truth/standard-1.json"
GOAL_S, GOAL_RSS_MIB = 10.0, 1024.0  # issue 49


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _rescoped(text: str, old: str, new: str, shift: int = 0) -> str:
    """A scope text with node `old` renamed `new`, a GPU index (or a link's gpuN ends) moved by `shift`."""
    from gpuval.scope import Scope

    scope = Scope.parse(text)
    if scope.kind == "cluster":
        return text
    changes: dict = {"node": new if scope.node == old else scope.node}
    if scope.other is not None:
        changes["other"] = new if scope.other == old else scope.other
    if shift and scope.index is not None:
        changes["index"] = scope.index + shift
    if shift and scope.ends is not None:
        changes["ends"] = tuple(_gpu_end(end, shift) for end in scope.ends)
    return str(dataclasses.replace(scope, **changes))


def _gpu_end(end: str, shift: int) -> str:
    return f"gpu{int(end[3:]) + shift}" if end.startswith("gpu") and end[3:].isdigit() else end


def rename(document: dict, old: str, new: str) -> None:
    """Node `old` called `new` everywhere the result names it: its inventory and every scope."""
    for node in document["inventory"].get("nodes", []):
        if node.get("node") == old:
            node["node"] = new
        if isinstance(node.get("host"), dict) and node["host"].get("hostname") == old:
            node["host"]["hostname"] = new
    for item in document["checks"] + document["measurements"]:
        item["scope"] = _rescoped(item["scope"], old, new)


def widen(document: dict, gpus: int) -> None:
    """A one-node result of G GPUs made a result of `gpus` (a multiple of G): per-GPU checks and measurements
    copied to the new GPUs, every ordered GPU pair given a link copied from one of the measured ones."""
    from gpuval import derived
    from gpuval.scope import Scope

    node = document["inventory"]["nodes"][0]
    have = len(node["gpus"])
    name = node["node"]
    for k in range(1, gpus // have):
        for gpu in node["gpus"][:have]:
            extra = copy.deepcopy(gpu)
            extra["index"] = gpu["index"] + k * have
            extra["uuid"] = f"{gpu['uuid'][:-4]}{k:04d}"
            node["gpus"].append(extra)
    node["gpu_count"] = gpus
    for key in ("checks", "measurements"):
        kept, links = [], {}
        for item in document[key]:
            scope = Scope.parse(item["scope"])
            if derived.get(item["name"].split(".")[0]) is not None:  # a gap of the node's own GPUs: one
                kept.append(item)
                continue
            if scope.kind == "link" and all(
                end.startswith("gpu") and end[3:].isdigit() for end in scope.ends
            ):
                links.setdefault((item["name"], scope.ends), item)
                continue
            kept.append(item)
            if scope.kind == "gpu":
                for k in range(1, gpus // have):
                    extra = copy.deepcopy(item)
                    extra["scope"] = _rescoped(item["scope"], name, name, k * have)
                    kept.append(extra)
        names = sorted({link_name for link_name, _ in links})
        for link_name in names:
            for a in range(gpus):
                for b in range(gpus):
                    if a == b:
                        continue
                    ta, tb = a % have, b % have
                    tb = tb if tb != ta else (ta + 1) % have
                    template = links.get((link_name, (f"gpu{ta}", f"gpu{tb}")))
                    if template is None:
                        continue
                    extra = copy.deepcopy(template)
                    extra["scope"] = str(Scope.link(name, f"gpu{a}", f"gpu{b}"))
                    if "src" in extra.get("params", {}):
                        extra["params"].update(src=a, dst=b)
                    kept.append(extra)
        document[key] = kept
    document["world"]["size"] = gpus
    for check in document["checks"]:
        if "gpus" in check["threshold"]:
            check["threshold"]["gpus"] = gpus


@functools.cache
def _on_a_metric(check_name: str) -> bool:
    from gpuval import metrics

    return metrics.of_check(check_name) is not None


def jitter(document: dict, rng: random.Random, sd: float, scale: dict[str, float] | None = None) -> None:
    """Every check on a declared metric multiplied by 1 + N(0, sd) (and by `scale[check name]`), judged
    again against its own min/max, and the verdict made again from the checks (gpuval.results.verdict)."""
    from gpuval.results import Check, verdict

    scale = scale or {}
    for check in document["checks"]:
        value = check.get("value")
        if value is None or check["status"] not in ("PASS", "FAIL") or not _on_a_metric(check["name"]):
            continue
        value *= (1 + rng.gauss(0, sd)) * scale.get(check["name"], 1.0)
        check["value"] = value
        low, high = check["threshold"].get("min"), check["threshold"].get("max")
        bad = (isinstance(low, (int, float)) and value < low) or (
            isinstance(high, (int, float)) and value > high
        )
        check["status"] = "FAIL" if bad else "PASS"
        bound = f", required >= {low:g}" if isinstance(low, (int, float)) else ""
        check["detail"] = f"{value:.4g} {check['unit']}{bound} (synthesised)"
    document["verdict"] = verdict([Check.model_validate(c) for c in document["checks"]]).value


def node_result(
    base: dict,
    name: str,
    rng: random.Random,
    started_at: datetime,
    sd: float = 0.005,
    scale: dict[str, float] | None = None,
) -> dict:
    """One node's result: `base` renamed `name`, started at `started_at`, its values jittered."""
    document = copy.deepcopy(base)
    rename(document, document["inventory"]["nodes"][0]["node"], name)
    document["started_at"] = started_at.isoformat(timespec="seconds")
    jitter(document, rng, sd, scale)
    return document


def write_fleet(
    base: dict,
    folder: Path,
    names: list[str],
    seed: int = 49,
    plants: dict[str, dict[str, float]] | None = None,
) -> list[Path]:
    """One folder per node under `folder`, each with its result.json; `plants` scales checks of some nodes."""
    rng = random.Random(seed)
    start = datetime(2026, 12, 6, 8, 0, tzinfo=timezone.utc)
    written = []
    for number, name in enumerate(names):
        document = node_result(
            base, name, rng, start + timedelta(seconds=number), scale=(plants or {}).get(name)
        )
        path = folder / name / "result.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document), encoding="utf-8")
        written.append(path)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--base", type=Path, default=BASE_8GPU)
    parser.add_argument("--output", type=Path, required=True, help="the JSON file of the figures")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    import pydantic

    import gpuval

    base = load(args.base)
    widen(base, args.gpus)
    width = len(str(args.nodes))
    names = [f"gpu-node{number:0{width}d}" for number in range(1, args.nodes + 1)]
    reporting = names[:-2]  # the last two never report: MISSING
    plants = {names[0]: {"matmul.bf16_tflops": 0.6}} | {n: {"matmul.fp8_tflops": 0.92} for n in names[10:13]}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="gpuval-fleet-scale-") as tmp:
        folder = Path(tmp) / "runs"
        made = time.perf_counter()
        files = write_fleet(base, folder, reporting, plants=plants)
        made = time.perf_counter() - made
        total_bytes = sum(path.stat().st_size for path in files)
        expect = f"gpu-node[{names[0][8:]}-{names[-1][8:]}]"
        command = [
            sys.executable,
            "-m",
            "gpuval",
            "fleet",
            str(folder),
            "--output",
            f"{tmp}/out",
            "--expect",
            expect,
        ]
        env = dict(os.environ, PYTHONPATH=str(REPO / "src"), COLUMNS="150")
        began = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, env=env)
        wall_s = time.perf_counter() - began
        peak_rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
        fleet = (
            json.loads((Path(tmp) / "out" / "fleet.json").read_text()) if proc.returncode in (0, 1, 3) else {}
        )
    figures = {
        "command": ["python", "benchmarks/fleet_scale.py", *sys.argv[1:]],
        "fleet_command": ["python", "-m", "gpuval", "fleet", "RUNS", "--output", "OUT", "--expect", expect],
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "base": str(args.base.relative_to(REPO)),
        "nodes_expected": args.nodes,
        "result_files": len(files),
        "gpus_per_node": args.gpus,
        "result_bytes_total": total_bytes,
        "synthesis_s": round(made, 2),
        "wall_s": round(wall_s, 2),
        "peak_rss_mib": round(peak_rss_mib, 1),
        "goal": {"wall_s": GOAL_S, "peak_rss_mib": GOAL_RSS_MIB},
        "met": wall_s <= GOAL_S and peak_rss_mib <= GOAL_RSS_MIB,
        "exit_code": proc.returncode,
        "counts": fleet.get("counts"),
        "drain": fleet.get("drain"),
        "rerun": fleet.get("rerun"),
        "stderr_tail": proc.stderr[-2000:],
        "versions": {
            "python": platform.python_version(),
            "gpuval": gpuval.__version__,
            "pydantic": pydantic.__version__,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
        },
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({key: figures[key] for key in ("wall_s", "peak_rss_mib", "met", "exit_code", "counts")}))
    return 0 if figures["met"] else 1


if __name__ == "__main__":
    sys.exit(main())

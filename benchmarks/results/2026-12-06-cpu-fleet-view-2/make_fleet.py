"""A 40-node fleet from the committed 4xH200 standard run, as benchmarks/fleet_scale.py makes them: one node
FAILs (bf16 matmul at 60 %), three run fp8 matmul 8 % slow, two expected nodes never report."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # the repository, from benchmarks/results/<folder>/
spec = importlib.util.spec_from_file_location("fleet_scale", REPO / "benchmarks/fleet_scale.py")
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
base = m.load(REPO / "benchmarks/results/2026-11-27-h200x4-multi-gpu-truth/standard-1.json")
names = [f"gpu-node{i:02d}" for i in range(1, 43)]
missing = {"gpu-node07", "gpu-node42"}
plants = {"gpu-node17": {"matmul.bf16_tflops": 0.6}} | {
    n: {"matmul.fp8_tflops": 0.92} for n in ("gpu-node23", "gpu-node24", "gpu-node31")
}
m.write_fleet(base, Path(sys.argv[1]), [n for n in names if n not in missing], plants=plants)

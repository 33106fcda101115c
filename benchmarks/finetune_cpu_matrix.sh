#!/usr/bin/env bash
# Issue 48, point 3: the tiny CPU fine-tune as shipped (configs/finetune/tiny-cpu.yaml) for three training
# seeds on two kernel paths: the machine's own (ATen's and MKL's widest: AVX-512 where the CPU has it) and
# AVX2 (ATEN_CPU_CAPABILITY=avx2 with MKL_ENABLE_INSTRUCTIONS=AVX2, the kernels an AVX2-only CPU runs).
# Every run alone, one after the other, with every core (as a user runs it): each run's wall time is the
# shipped run's time on that path. Run it on an otherwise idle machine: two torch processes on two cores
# slow each other several-fold.
# Writes under OUT (default benchmarks/results/DATE-cpu-finetune-seeds): runs.json (each run's path, seed,
# threads, wall time, CPU capability and every split's tuned exact_call_accuracy), table.md, log-*.txt,
# run.json (date, CPU, versions, commit).
set -uo pipefail
OUT=${OUT:-benchmarks/results/$(date -u +%F)-cpu-finetune-seeds}
RUN=${RUN:-/tmp/gpuval-tiny-matrix}
SEEDS=${SEEDS:-"0 1 2"}
PATHS=${PATHS:-"native avx2"}
mkdir -p "$OUT" "$RUN"
one() {  # PATH SEED
  local path=$1 seed=$2 env=() start rc
  [ "$path" = avx2 ] && env=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2)
  rm -rf "${RUN:?}/$path-$seed"
  start=$(date +%s.%N)
  env "${env[@]}" python3 -m gpuval finetune run --config configs/finetune/tiny-cpu.yaml \
    --output "$RUN/$path-$seed" --set train.seed="$seed" >"$OUT/log-$path-$seed.txt" 2>&1
  rc=$?
  env "${env[@]}" python3 - "$RUN/$path-$seed" "$path" "$seed" "$rc" "$start" >"$RUN/$path-$seed.json" <<'PY'
import json, os, sys, time
from pathlib import Path
import torch
folder, path, seed, rc, start = sys.argv[1:]
row = {"path": path, "seed": int(seed), "threads": torch.get_num_threads(), "exit_code": int(rc),
       "wall_s": round(time.time() - float(start), 1), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
try:
    splits = json.loads((Path(folder) / "eval.json").read_text())["splits"]
    row["tuned"] = {name: {"examples": m["tuned"]["examples"], "exact_call_accuracy": m["tuned"]["exact_call_accuracy"]}
                    for name, m in splits.items()}
except (OSError, KeyError, ValueError) as error:  # the run failed: its log says why
    row["error"] = repr(error)
print(json.dumps(row))
PY
}
for seed in $SEEDS; do
  for path in $PATHS; do one "$path" "$seed"; done
done
python3 - "$RUN" "$OUT" <<'PY'
import datetime, json, os, platform, subprocess, sys
from pathlib import Path
import peft, torch, transformers
run, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = sorted((json.loads(p.read_text()) for p in run.glob("*.json")), key=lambda r: (r["path"], r["seed"]))
(out / "runs.json").write_text(json.dumps(rows, indent=1) + "\n")
splits = ["eval", "eval_unseen", "holdout_values"]
lines = ["| path (capability) | seed | threads | wall s | " + " | ".join(splits) + " |", "|" + " --- |" * (4 + len(splits))]
for r in rows:
    cells = [f"{r['tuned'][s]['exact_call_accuracy']:.3f} ({r['tuned'][s]['examples']})" if "tuned" in r else "error" for s in splits]
    lines.append(f"| {r['path']} ({r['cpu_capability']}) | {r['seed']} | {r['threads']} | {r['wall_s']} | " + " | ".join(cells) + " |")
(out / "table.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
(out / "run.json").write_text(json.dumps({
    "command": "bash benchmarks/finetune_cpu_matrix.sh", "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "commit": commit, "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
    "transformers": transformers.__version__, "peft": peft.__version__}, indent=2) + "\n")
PY

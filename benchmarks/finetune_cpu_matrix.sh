#!/usr/bin/env bash
# Issue 48, point 3: the tiny CPU fine-tune as shipped (configs/finetune/tiny-cpu.yaml) for three training
# seeds on two kernel paths: the machine's own (ATen's and MKL's widest: AVX-512 where the CPU has it) and
# AVX2 (ATEN_CPU_CAPABILITY=avx2 with MKL_ENABLE_INSTRUCTIONS=AVX2, the kernels an AVX2-only CPU runs).
# Seed 0 on the machine's path runs first and alone, with every core: the shipped run, timed. The other five
# run two at a time, one thread each (their scores, not their times, are what they are for). ALONE=0: no
# run alone; every run in the pairs, on one thread.
# Writes under OUT (default benchmarks/results/DATE-cpu-finetune-seeds): runs.json (each run's path, seed,
# threads, wall time, CPU capability and every split's tuned exact_call_accuracy), table.md, log-*.txt,
# run.json (date, CPU, versions).
set -uo pipefail
OUT=${OUT:-benchmarks/results/$(date -u +%F)-cpu-finetune-seeds}
RUN=${RUN:-/tmp/gpuval-tiny-matrix}
SEEDS=${SEEDS:-"0 1 2"}
mkdir -p "$OUT" "$RUN"
one() {  # PATH SEED THREADS
  local path=$1 seed=$2 threads=$3 env=() start rc
  [ "$path" = avx2 ] && env=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2)
  rm -rf "$RUN/$path-$seed"
  start=$(date +%s.%N)
  env "${env[@]}" OMP_NUM_THREADS="$threads" python3 -m gpuval finetune run --config configs/finetune/tiny-cpu.yaml \
    --output "$RUN/$path-$seed" --set train.seed="$seed" >"$OUT/log-$path-$seed.txt" 2>&1
  rc=$?
  env "${env[@]}" python3 - "$RUN/$path-$seed" "$path" "$seed" "$threads" "$rc" "$start" >"$RUN/$path-$seed.json" <<'PY'
import json, sys, time
from pathlib import Path
import torch
folder, path, seed, threads, rc, start = sys.argv[1:]
row = {"path": path, "seed": int(seed), "threads": int(threads), "exit_code": int(rc),
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
first=${SEEDS%% *}
[ "${ALONE:-1}" = 1 ] && one native "$first" "$(nproc)"
pairs=()
for seed in $SEEDS; do
  [ "$seed" = "$first" ] && [ "${ALONE:-1}" = 1 ] || pairs+=("native $seed")
  pairs+=("avx2 $seed")
done
for ((i = 0; i < ${#pairs[@]}; i += 2)); do
  # shellcheck disable=SC2086  # "PATH SEED" splits into two words on purpose
  one ${pairs[i]} 1 &
  # shellcheck disable=SC2086
  [ -n "${pairs[i + 1]:-}" ] && one ${pairs[i + 1]} 1 &
  wait
done
python3 - "$RUN" "$OUT" <<'PY'
import datetime, json, os, platform, sys
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
(out / "run.json").write_text(json.dumps({
    "command": "bash benchmarks/finetune_cpu_matrix.sh", "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
    "transformers": transformers.__version__, "peft": peft.__version__}, indent=2) + "\n")
PY

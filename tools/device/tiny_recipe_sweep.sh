#!/usr/bin/env bash
# Issue 48, point 3: which recipe of the tiny CPU fine-tune (configs/finetune/tiny-cpu.yaml) copies held-out
# argument values best, asked of many variants at once on one lent GPU (the tiny model trains in about a
# minute there; the chosen recipe is then timed and run for three seeds on both kernel paths on the 2-core
# CPU, where its claim is made). Each variant runs `gpuval finetune run` with `--set` overrides, every seed
# its own process, JOBS at a time, in float32 with no compile (as on a CPU) and without the base model's
# evaluation, with the dense document mask (flash varlen takes no float32). Writes $OUT/sweep.json (each run's settings, exit code, wall time and every split's tuned
# exact_call_accuracy; rows.jsonl as they end) and $OUT/sweep-log.txt (each run's last lines).
#   VARIANTS: lines of NAME|--set overrides; SEEDS: train.seed values; JOBS: runs at once;
#   OMP_NUM_THREADS: CPU threads per run (default 1: twelve runs at each process's default of sixteen
#   threads oversubscribed the host's sixteen cores and trained at a tenth of the speed)
set -uo pipefail
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
source "$(dirname "$0")/device_env.sh"
SEEDS=${SEEDS:-"0 1 2"}
JOBS=${JOBS:-9}
W=${W:-/tmp/gpuval-sweep}
default_variants='shipped|
n4000|--set synth.n=4000 --set prepare.eval_fraction=0.025 --set prepare.unseen_fraction=0.05
n4000-lr3e-3|--set synth.n=4000 --set prepare.eval_fraction=0.025 --set prepare.unseen_fraction=0.05 --set train.optim.lr=3e-3
lr3e-3|--set train.optim.lr=3e-3
n8000|--set synth.n=8000 --set prepare.eval_fraction=0.0125 --set prepare.unseen_fraction=0.025
n4000-steps750|--set synth.n=4000 --set prepare.eval_fraction=0.025 --set prepare.unseen_fraction=0.05 --set train.max_steps=750'
VARIANTS=${VARIANTS:-$default_variants}
rm -rf "$W"; mkdir -p "$W"
run_one() {  # NAME SEED OVERRIDES...
  local name=$1 seed=$2; shift 2
  local dir="$W/$name-s$seed" start rc
  start=$(date +%s.%N)
  # shellcheck disable=SC2068
  python3 -m gpuval finetune run --config configs/finetune/tiny-cpu.yaml --output "$dir" \
    --set train.seed="$seed" --set eval.base_model=false --set train.step.compile=false --set train.step.attention=sdpa $@ \
    >"$W/$name-s$seed.log" 2>&1
  rc=$?
  python3 - "$dir" "$name" "$seed" "$rc" "$start" "$*" >"$W/$name-s$seed.json" <<'PY'
import json, sys, time
from pathlib import Path
folder, name, seed, rc, start, overrides = sys.argv[1:]
row = {"variant": name, "seed": int(seed), "exit_code": int(rc), "wall_s": round(time.time() - float(start), 1),
       "overrides": overrides}
try:
    splits = json.loads((Path(folder) / "eval.json").read_text())["splits"]
    row["tuned"] = {s: {k: v for k, v in m.get("tuned", m).items() if k in ("examples", "exact_call_accuracy")}
                    for s, m in splits.items()}
except Exception as error:  # the run failed: its log says why
    row["error"] = repr(error)
print(json.dumps(row))
PY
  cat "$W/$name-s$seed.json" >>"$OUT/rows.jsonl"  # as each run ends: a call cut at its limit keeps these
}
export -f run_one; export W OUT
python3 -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__, torch.cuda.get_device_name())' | tee "$OUT/versions.txt"
# shellcheck disable=SC2016  # the single-quoted script is bash -c's, which expands it
while IFS='|' read -r name overrides; do
  for seed in $SEEDS; do printf '%s\t%s\t%s\n' "$name" "$seed" "$overrides"; done
done <<<"$VARIANTS" | xargs -P "$JOBS" -L 1 -d '\n' bash -c 'IFS=$'"'"'\t'"'"' read -r n s o <<<"$0"; run_one "$n" "$s" $o'
python3 - "$W" "$OUT/sweep.json" <<'PY'
import json, sys
from pathlib import Path
rows = [json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*.json"))]
Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
for r in rows:
    t = r.get("tuned", {})
    print(r["variant"], r["seed"], r["exit_code"], r["wall_s"], {s: v.get("exact_call_accuracy") for s, v in t.items()}, r.get("error", ""))
PY
for f in "$W"/*.log; do echo "=== $f"; tail -n 15 "$f"; done >"$OUT/sweep-log.txt"

#!/usr/bin/env bash
# Issue 52, point 4 (and any change that must not move the fine-tune's speed): benchmarks/finetune_speed.py's
# gpuval side on the code of an earlier commit and on this tree, alternated in one device call, so both run
# on the same GPU, clocks and driver.
#   here:        bash tools/device/before_after_speed.sh --prepare COMMIT   # writes before/ (git-ignored)
#   on a device: one `run` with carry [".whl", "before"]:
#                ROUNDS=2 VARIANTS=gpuval bash tools/device/before_after_speed.sh
# Writes under $OUT: gpu.txt, versions.txt, before-N.json and after-N.json (finetune_speed.py's report of
# round N), log.txt. Each side runs its own tree's finetune_speed.py and gpuval.
set -uo pipefail
if [ "${1:-}" = --prepare ]; then
  commit=${2:?usage: --prepare COMMIT}
  rm -rf before && mkdir before
  git archive "$commit" src benchmarks tools configs | tar -x -C before
  rm -rf before/benchmarks/results  # evidence only: keeps the carry small
  git rev-parse --short "$commit" >before/COMMIT
  echo "before/ holds $(cat before/COMMIT)'s code ($(du -sh before | cut -f1))"
  exit 0
fi
[ -d before/src ] || { echo "no before/: run --prepare COMMIT here first and carry it" >&2; exit 2; }
source "$(dirname "$0")/device_env.sh"
exec > >(tee "$OUT/log.txt") 2>&1
# what device_env.sh put on PYTHONPATH (carried wheels, Unsloth, FA4) but this tree's src: each side adds its own
site=$(tr ':' '\n' <<<"$PYTHONPATH" | grep -vx "$PWD/src" | paste -sd: -)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)' | tee "$OUT/versions.txt"
echo "before: $(cat before/COMMIT); after: this tree" | tee -a "$OUT/versions.txt"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for side in before after; do
    dir=$PWD commit=${GPUVAL_COMMIT:-}  # the after side's: pass GPUVAL_COMMIT (a device's .git can be stale)
    [ "$side" = before ] && dir=$PWD/before commit=$(cat before/COMMIT)
    echo "=== $side, round $round ($(date -u +%T))"
    (cd "$dir" && GPUVAL_COMMIT=$commit PYTHONPATH="${site:+$site:}$dir/src" python3 benchmarks/finetune_speed.py \
      --output "$OUT/$side-$round.json" --steps "${STEPS:-6}" --warmup 2 --variants "${VARIANTS:-gpuval}" \
      --variant-timeout 140 2>&1 | tail -4)
  done
done

#!/usr/bin/env bash
# On a device machine of several GPUs (issue 5's scaling target): `gpuval bench train` (Qwen2-7B shape,
# LoRA r64 q/k/v/o, 4096-token sequences, bench train's GPU defaults) on one GPU, then on every local GPU
# under torchrun with DDP, FSDP2 and DeepSpeed ZeRO-3 (carried wheel). Per-GPU tokens/s of each against the
# one-GPU run: DDP should keep >= 95 %.
# Writes $OUT/scaling.tgz: train-1gpu.json, train-{ddp,fsdp,deepspeed}.json (gpuval.result/v1) and
# scaling-log.txt (one archive: the device tool brings back eight files at most).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-3}
MODES=${MODES:-"ddp fsdp deepspeed"}
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
W=/tmp/gpuval-scaling
mkdir -p "$W"
COMMON=(--set steps="$STEPS" --set untimed_steps="$WARMUP" --set lora.dropout=0.05)
run() {  # run NAME COMMAND...: time it, keep its exit code
  local name=$1; shift
  local start
  start=$(date +%s.%N)
  echo "=== $name: $*"
  "$@"
  echo "=== $name exit=$? wall_s=$(python3 -c "import time; print(round(time.time()-$start,1))")"
}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  run 1gpu env CUDA_VISIBLE_DEVICES=0 python3 -m gpuval bench train "${COMMON[@]}" --output "$W/train-1gpu.json"
  for mode in $MODES; do
    extra=(--set parallel="$mode")
    # ZeRO-3 without compiled layers: its parameter gathering in module hooks is untried under compile.
    [ "$mode" = deepspeed ] && extra+=(--set deepspeed_config=configs/finetune/deepspeed/zero3.json \
      --set step.compile=false)
    run "$mode" torchrun --standalone --nproc_per_node="$GPUS" -m gpuval bench train "${COMMON[@]}" \
      "${extra[@]}" --output "$W/train-$mode.json"
  done
  python3 - "$W" <<'PY'
import json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
def rate(name):
    path = folder / f"train-{name}.json"
    if not path.exists():
        return None
    (m,) = [m for m in json.loads(path.read_text())["measurements"] if m["name"] == "train"]
    return m["metrics"]["tokens_per_s_per_gpu"], m["params"]["world_size"]
one = rate("1gpu")
for name in ("1gpu", "ddp", "fsdp", "deepspeed"):
    r = rate(name)
    if r is None:
        print(f"{name:<10} no result")
        continue
    share = f"{100 * r[0] / one[0]:.1f} % of one GPU" if one else ""
    print(f"{name:<10} world {r[1]}  {r[0]:>9,.0f} tokens/s/GPU  {share}")
PY
} 2>&1 | tee "$W/scaling-log.txt"
tar -czf "$OUT/scaling.tgz" -C "$W" .

#!/usr/bin/env bash
# On a device machine (issue 4): the Qwen2-7B shape (random weights, gpuval/finetune/shapes/qwen2-7b) with
# the seeds' LoRA recipe (configs/finetune/qwen2-7b-lora.yaml) trains STEPS steps under torchrun on every
# local GPU, once per way of spreading it: ddp, fsdp (FSDP2), deepspeed (ZeRO-3, carried wheel).
# Data: synthetic Glaive records, prepared, tokenized with the bundled tiny tokenizer (ids < vocab).
# Writes under $OUT: finetune-ddp.json, finetune-fsdp.json, finetune-deepspeed.json (train_summary.json of
# each run: per-step loss, grad norm, tokens/s/GPU, MFU, peak memory), finetune-log.txt.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
STEPS=${STEPS:-8}
MODES=${MODES:-"ddp fsdp deepspeed"}
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
W=/tmp/gpuval-finetune
mkdir -p "$W"
exec > >(tee "$OUT/finetune-log.txt") 2>&1
python3 -m gpuval finetune synth --n 1500 --values train --output "$W/glaive.jsonl"
python3 -m gpuval finetune prepare --input "$W/glaive.jsonl" --output "$W/data"
for mode in $MODES; do
  extra=()
  [ "$mode" = deepspeed ] && extra=(--set train.deepspeed_config=configs/finetune/deepspeed/zero3.json)
  echo "=== $mode on $GPUS GPU(s)"
  start=$(date +%s.%N)
  torchrun --standalone --nproc_per_node="$GPUS" -m gpuval finetune train \
    --config configs/finetune/qwen2-7b-lora.yaml --set model=qwen2-7b-shape --set tokenizer=tiny \
    --set data.train="$W/data/train.jsonl" --set data.eval=null --set output="$W/$mode" \
    --set train.parallel="$mode" --set train.max_steps="$STEPS" --set train.optim.warmup_steps=2 \
    --set train.optim.lr=1e-4 --set train.save.every_steps=0 --set train.log.every_steps=1 "${extra[@]}"
  rc=$?
  echo "=== $mode exit=$rc wall_s=$(python3 -c "import time; print(round(time.time()-$start,1))")"
  [ -f "$W/$mode/train_summary.json" ] && cp "$W/$mode/train_summary.json" "$OUT/finetune-$mode.json"
done

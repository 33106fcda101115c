#!/usr/bin/env bash
# Issue 35: where a ZeRO-3 step's time goes on every local GPU, against one GPU with the same eager layers:
# `gpuval bench train` with train.log.profile_steps (2 steps profiled on rank 0), each trace summarised
# by trace_summary.py (GPU 0's busy, idle and NCCL time, top kernels); then `gpuval accept --quick` on
# every local GPU, its console kept (nothing but gpuval's own lines may reach it). Writes under $OUT:
# profile.tgz (the bench JSONs, operators tables, summaries, logs) and accept/.
#
#   GPUVAL_COMMIT=SHA bash tools/device/zero3_profile_device.sh      # carry .whl
#   ZERO3_ONLY=1 ...: the ZeRO-3 run alone (no one-GPU run, no accept)
#   STACK=1 ...: and the ZeRO-3 run again with the Python functions recorded (train.log.profile_stack):
#                the summary then names the functions the host ran while GPU 0 idled (the tracer slows
#                the host, so its gaps are longer than the plain run's: read it for where, not how much)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
D="$OUT/profile"
mkdir -p "$D"
exec > >(tee "$D/log.txt") 2>&1
COMMON=(--set steps=6 --set untimed_steps=3 --set lora.dropout=0.05 --set step.compile=false)
ZERO3=(--set parallel=deepspeed --set deepspeed_config=configs/finetune/deepspeed/zero3.json)
python3 -c "import torch; print(torch.__version__, torch.version.cuda, [torch.cuda.get_device_name(i) for i in range($GPUS)])"
if [ -z "${ZERO3_ONLY:-}" ]; then
  echo "=== 1gpu-eager"
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m gpuval bench train "${COMMON[@]}" \
    --set profile_dir="$D/1gpu-eager" --output "$D/1gpu-eager.json" </dev/null
fi
echo "=== deepspeed-$GPUS"
timeout 150 torchrun --standalone --nproc_per_node="$GPUS" -m gpuval bench train "${COMMON[@]}" "${ZERO3[@]}" \
  --set profile_dir="$D/deepspeed-$GPUS" --output "$D/deepspeed-$GPUS.json" </dev/null
if [ -n "${STACK:-}" ]; then
  echo "=== deepspeed-$GPUS-stack"
  timeout 240 torchrun --standalone --nproc_per_node="$GPUS" -m gpuval bench train "${COMMON[@]}" "${ZERO3[@]}" \
    --set profile_dir="$D/deepspeed-$GPUS-stack" --set profile_stack=true \
    --output "$D/deepspeed-$GPUS-stack.json" </dev/null
fi
python3 tools/device/trace_summary.py "$D"/*/trace.json | tee "$D/summary.jsonl"
find "$D" -name trace.json -delete
[ -n "${ZERO3_ONLY:-}" ] && { tar -czf "$OUT/profile.tgz" -C "$OUT" profile && rm -rf "$D"; exit 0; }
echo "=== accept --quick on $GPUS GPUs"
mkdir -p "$OUT/accept"
start=$(date +%s.%N)
timeout 240 python3 -m gpuval accept --quick --output "$OUT/accept/run" >"$OUT/accept/console.txt" 2>&1
echo "exit=$? wall_s=$(python3 -c "import time; print(round(time.time()-$start,1))")" | tee "$OUT/accept/exit.txt"
cat "$OUT/accept/console.txt"
tar -czf "$OUT/profile.tgz" -C "$OUT" profile accept && rm -rf "$D" "$OUT/accept/run"

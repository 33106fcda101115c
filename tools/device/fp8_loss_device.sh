#!/usr/bin/env bash
# On one Hopper GPU (issue 23): benchmarks/fp8_loss.py, the FP8 frozen base's loss curve against bf16's over
# 200 steps on the Qwen2-7B shape (same seed and data). Carry .whl (pydantic, liger-kernel). Writes under
# $OUT: fp8-loss.json and fp8-loss-log.txt. Arguments go to fp8_loss.py.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
exec > >(tee "$OUT/fp8-loss-log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python3 benchmarks/fp8_loss.py --output "$OUT/fp8-loss.json" "$@"

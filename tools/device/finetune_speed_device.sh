#!/usr/bin/env bash
# On a device machine (issue 5): benchmarks/finetune_speed.py, every variant, Qwen2-7B shape at 4096 tokens.
# Carry .whl (pydantic, liger-kernel). Writes under $OUT: finetune-speed.json, finetune-speed-log.txt, and
# with --profile VARIANT: profile-VARIANT/{trace.json.gz,operators.txt}.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
exec > >(tee "$OUT/finetune-speed-log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python3 benchmarks/finetune_speed.py --output "$OUT/finetune-speed.json" "$@"
rc=$?
gzip -f "$OUT"/profile-*/trace.json 2>/dev/null  # a 7B step's trace is tens of MB
exit $rc

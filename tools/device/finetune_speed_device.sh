#!/usr/bin/env bash
# On one H100 (issues 5 and 23): benchmarks/finetune_speed.py, all sides in one run, Qwen2-7B shape at 4096
# tokens (seeds' recipe, TRL SFTTrainer padding-free and padded, gpuval bf16, gpuval FP8 frozen base, gpuval
# with PEFT's own q/k/v), then benchmarks/fp8_loss.py (fp8-base against bf16 over 200 steps, at 2,048 tokens
# a step to fit the time left: fp8_loss_device.sh alone runs 4,096), so that one device call of at most
# 600 s makes both files.
# Carry .whl (pydantic, liger-kernel, trl, datasets, dill, multiprocess); the device image is expected to have
# datasets' other needs (pyarrow, pandas, xxhash): the first lines of the log say whether it does.
# Writes under $OUT: finetune-speed.json, finetune-speed-log.txt, fp8-loss.json, fp8-loss-log.txt, and with
# --profile VARIANT[,VARIANT...]: profile-VARIANT/{trace.json.gz,operators.txt} each (the seeds', Unsloth's and
# gpuval's sides alike). Arguments go to finetune_speed.py.
# FP8_LOSS=0 leaves the loss benchmark out; a run short of time stops it at the call's 600 s (both JSON files
# are rewritten after every variant or run, so what finished is kept).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
exec > >(tee "$OUT/finetune-speed-log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python3 - <<'PY'
import importlib
for name in ("trl", "datasets", "pyarrow", "pandas", "xxhash", "liger_kernel", "pydantic"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '?')}")
    except Exception as exc:  # noqa: BLE001
        print(f"{name} MISSING: {exc}")
PY
python3 benchmarks/finetune_speed.py --output "$OUT/finetune-speed.json" --steps 6 --warmup 2 \
  --variant-timeout 150 "$@"
rc=$?
gzip -f "$OUT"/profile-*/trace.json 2>/dev/null  # a 7B step's trace is tens of MB
left=$((585 - SECONDS))
if [ "${FP8_LOSS:-1}" = 0 ]; then
  echo "=== fp8 loss benchmark left out (FP8_LOSS=0)"
elif [ "$left" -lt 90 ]; then
  echo "=== fp8 loss benchmark not started: ${left} s left of the call; run tools/device/fp8_loss_device.sh"
  rc=1
else
  echo "=== fp8 loss benchmark, ${left} s left"
  timeout "$left" bash "$(dirname "$0")/fp8_loss_device.sh" --seq-len 2048 --run-timeout $(((left - 20) / 2)) \
    || rc=1
fi
exit $rc

# shellcheck shell=bash
# Sourced by the device scripts: installs carried wheels (.whl/, see the device tool's README) into
# /tmp/site and puts them and gpuval's source on PYTHONPATH; $OUT defaults for runs outside the tool.
OUT=${OUT:-/tmp/gpuval-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1
# FlashAttention-4, where its chunks were carried in this call or earlier calls on this machine (fa4_env.sh)
source "$(dirname "${BASH_SOURCE[0]}")/fa4_env.sh"
# Unsloth, where its chunks were carried (unsloth_env.sh; benchmarks/finetune_speed_unsloth.py)
source "$(dirname "${BASH_SOURCE[0]}")/unsloth_env.sh"

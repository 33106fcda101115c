#!/usr/bin/env bash
# Pretrain the bundled tiny model on a device GPU (python tools/tiny_model.py --device cuda ARGS), then
# score the base's copying of held-out values (tools/research/tiny_base_copy.py). Writes under $OUT:
# model.safetensors, config.json, generation_config.json, tokenizer.json, base_copy.json (held-out values),
# base_copy_renamed.json (the same with made-up function and parameter names), log.txt.
# TINY_TMP (default /tmp/tiny) is the working folder, so that two runs can share one GPU.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
exec > >(tee "$OUT/log.txt") 2>&1
T=${TINY_TMP:-/tmp/tiny}
rm -rf "$T"
python3 tools/tiny_model.py --output "$T" --device cuda "$@" || exit 1
cp "$T"/model.safetensors "$T"/config.json "$T"/generation_config.json "$T"/tokenizer.json "$OUT/"
python3 "$(dirname "$0")/../research/tiny_base_copy.py" --model "$T" --records 300 --show 5 --json "$OUT/base_copy.json"
python3 "$(dirname "$0")/../research/tiny_base_copy.py" --model "$T" --records 300 --show 5 --renamed --json "$OUT/base_copy_renamed.json"

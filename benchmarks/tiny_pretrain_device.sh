#!/usr/bin/env bash
# Pretrain the bundled tiny model on a device GPU (python -m gpuval.finetune.tiny --device cuda), then ask
# the base, in Glaive's own text format, for the call of records whose argument values it never saw.
# Writes under $OUT: model.safetensors, config.json, generation_config.json, tokenizer.json, log.txt.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
exec > >(tee "$OUT/log.txt") 2>&1
T=/tmp/tiny
rm -rf "$T"
python3 -m gpuval.finetune.tiny --output "$T" --device cuda "$@" || exit 1
cp "$T"/model.safetensors "$T"/config.json "$T"/generation_config.json "$T"/tokenizer.json "$OUT/"
python3 - "$T" <<'PY'
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from gpuval.finetune.synth import synth_records
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).to("cuda").eval()
ok = n = 0
for record in synth_records(200, 99, values="holdout"):
    at = record["chat"].find("<functioncall>")
    if at < 0:
        continue
    ids = tok(record["system"] + "\n\n" + record["chat"][:at], add_special_tokens=False, return_tensors="pt")
    out = model.generate(ids["input_ids"].cuda(), max_new_tokens=80, do_sample=False, pad_token_id=0)
    text = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    want = record["chat"][at:].split("<|endoftext|>")[0].strip()
    n += 1
    ok += want in text  # the call, after any text the reply starts with
    if n <= 3:
        print("GEN ", repr(text[:150]), "\nWANT", repr(want[:150]))
print(f"base, Glaive format, held-out values: {ok}/{n} calls exact")
PY

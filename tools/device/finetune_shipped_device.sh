#!/usr/bin/env bash
# On one H100 (issue 23's must-show): the shipped configs/finetune/qwen2-7b-lora.yaml as a user runs it
# (`gpuval finetune train`, Qwen2-7B shape with random weights, the tiny tokenizer for ids), beside
# `gpuval bench train` on the same machine in the same call, then the seeds' exact recipe
# (qwen2-7b-lora-seeds.yaml) for the ratio. Writes under $OUT: shipped.json and seeds.json
# (train_summary.json of each run), bench-train.json, env.json, log.txt.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
STEPS=${STEPS:-12}
W=/tmp/gpuval-shipped
rm -rf "$W" && mkdir -p "$W"
exec > >(tee "$OUT/log.txt") 2>&1
python3 - "$OUT/env.json" <<'PY'
import json, sys, datetime, torch, transformers, peft
try:
    import liger_kernel, importlib.metadata as md
    liger = md.version("liger-kernel")
except Exception as exc:  # noqa: BLE001
    liger = f"missing: {exc}"
json.dump({"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name(0), "total_memory": torch.cuda.get_device_properties(0).total_memory,
           "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
           "peft": peft.__version__, "liger_kernel": liger}, open(sys.argv[1], "w"), indent=2)
print(open(sys.argv[1]).read())
PY
python3 -m gpuval finetune synth --n 1500 --values train --output "$W/glaive.jsonl"
python3 -m gpuval finetune prepare --input "$W/glaive.jsonl" --output "$W/data"
run() {  # NAME CONFIG: STEPS steps of that config, as shipped but for the steps and the data
  local name=$1 config=$2 start rc
  echo "=== $name: gpuval finetune train --config $config"
  start=$(date +%s.%N)
  timeout 280 python3 -m gpuval finetune train --config "$config" --set model=qwen2-7b-shape \
    --set tokenizer=tiny --set data.train="$W/data/train.jsonl" --set data.eval=null \
    --set output="$W/$name" --set train.max_steps="$STEPS" --set train.optim.warmup_steps=2 \
    --set train.save.every_steps=0 --set train.log.every_steps=1
  rc=$?
  echo "=== $name exit=$rc wall_s=$(python3 -c "import time; print(round(time.time()-$start,1))")"
  [ -f "$W/$name/train_summary.json" ] && cp "$W/$name/train_summary.json" "$OUT/$name.json"
}
run shipped configs/finetune/qwen2-7b-lora.yaml
echo "=== gpuval bench train"
timeout 200 python3 -m gpuval bench train --output "$OUT/bench-train.json"
echo "=== bench exit=$?"
run seeds configs/finetune/qwen2-7b-lora-seeds.yaml

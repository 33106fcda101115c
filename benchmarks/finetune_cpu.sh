#!/usr/bin/env bash
# Issue 4's CPU must-show: `gpuval finetune run --config configs/finetune/tiny-cpu.yaml` end to end on this
# machine's CPU, timed. Writes under OUT (default benchmarks/results/DATE-cpu-finetune): eval.json,
# train_summary.json, stats.json, run.json (command, wall time, CPU, versions), log.txt.
set -uo pipefail
OUT=${OUT:-benchmarks/results/$(date -u +%F)-cpu-finetune}
RUN=${RUN:-/tmp/gpuval-tiny-cpu}
mkdir -p "$OUT"
rm -rf "$RUN"
start=$(date +%s.%N)
python3 -m gpuval finetune run --config configs/finetune/tiny-cpu.yaml --output "$RUN" 2>&1 | tee "$OUT/log.txt"
rc=${PIPESTATUS[0]}
end=$(date +%s.%N)
cp "$RUN/eval.json" "$RUN/train_summary.json" "$OUT/" 2>/dev/null
cp "$RUN/data/stats.json" "$OUT/" 2>/dev/null
python3 - "$OUT/run.json" "$rc" "$start" "$end" <<'PY'
import datetime, json, os, platform, sys
import torch, transformers, peft
path, rc, start, end = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
json.dump({"command": "gpuval finetune run --config configs/finetune/tiny-cpu.yaml", "exit_code": rc,
           "wall_s": round(end - start, 1), "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "peft": peft.__version__}, open(path, "w"), indent=2)
print(open(path).read())
PY
exit "$rc"

#!/usr/bin/env bash
# Issue 18's evidence in one device call: gpuval's matmul against an independent back-to-back loop,
# and the fault matrix's GPU rows (another program multiplying or holding memory on the GPU, CUDA
# hidden by CUDA_VISIBLE_DEVICES), each with its verdict, exit code and seconds to verdict.
# Usage on a device machine (one GPU): bash tools/device/fault_matrix_device.sh PROFILE
#   PHASES="timing faults" (default both). Files under $OUT (8 at most come back): env.json,
#   matmul.json, reference.json, membw.json, matmul-hog.json, fault-matrix.json, kmsg-nvrm.txt, log.txt.
set -uo pipefail
PROFILE=${1:?profile}
PHASES=${PHASES:-"timing faults"}
source "$(dirname "$0")/device_env.sh"
RUNS=/tmp/gpuval-runs
mkdir -p "$RUNS"
exec > >(tee "$OUT/log.txt") 2>&1
export GPUVAL_HISTORY=none
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
SETS=(--set expect.gpu_count="$GPUS")
[ "$GPUS" = 1 ] && SETS+=(--set expect.nvlinks_per_gpu=null)

python3 - "$OUT/env.json" <<'PY'
import json, sys, datetime, torch, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
        "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)}
json.dump(info, open(sys.argv[1], "w"), indent=2)
print(info)
PY
# The driver's kernel-log lines (GPU initialisation, any XID) as this machine wrote them.
dmesg 2>/dev/null | grep -iE 'nvrm|nvidia' | tail -n 200 >"$OUT/kmsg-nvrm.txt"

hog_pid=""
start_hog() {  # start_hog ARGS...: another program on GPU 0, waits until it says ready
  python3 tools/device/gpu_hog.py "$@" >"$RUNS/hog.txt" 2>&1 &
  hog_pid=$!
  for _ in $(seq 1 120); do grep -q ready "$RUNS/hog.txt" && return 0; sleep 0.5; done
  echo "hog did not start"; cat "$RUNS/hog.txt"; return 1
}
stop_hog() { [ -n "$hog_pid" ] && kill "$hog_pid" 2>/dev/null; wait "$hog_pid" 2>/dev/null; hog_pid=""; }
trap stop_hog EXIT

row() {  # row NAME HOW -- COMMAND...: run it under a 120 s limit, record exit code, wall time, verdict
  local name=$1 how=$2; shift 3
  local start end rc
  rm -rf "${RUNS:?}/${name:?}"
  start=$(date +%s.%N)
  timeout 120 "$@" --output "$RUNS/$name" >"$RUNS/$name.out" 2>&1
  rc=$?
  end=$(date +%s.%N)
  tail -n 25 "$RUNS/$name.out"
  python3 tools/device/fault_row.py --name "$name" --how "$how" --exit "$rc" \
    --wall "$(python3 -c "print(round($end-$start,2))")" --result "$RUNS/$name/result.json" \
    --output-text "$RUNS/$name.out" --command "$*" >>"$RUNS/rows.jsonl"
}

if [[ " $PHASES " == *" timing "* ]]; then
  python3 -m gpuval bench matmul --output "$OUT/matmul.json"
  python3 tools/reference/reference.py --output "$OUT/reference.json"
  python3 -m gpuval bench membw --output "$OUT/membw.json"
  start_hog --compute && python3 -m gpuval bench matmul --quick --output "$OUT/matmul-hog.json"
  stop_hog
  python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def best(path):
    return json.load(open(f"{out}/{path}"))["measurements"][0]["metrics"].get("bf16_tflops")
ref = json.load(open(f"{out}/reference.json"))["matmul"]["bf16_best_tflops"]
mine, hog = best("matmul.json"), best("matmul-hog.json")
print(f"bf16 best: gpuval {mine:.1f}, reference {ref:.1f} ({mine / ref * 100:.1f}%), with a hog {hog:.1f}")
PY
fi

if [[ " $PHASES " == *" faults "* ]]; then
  rm -f "$RUNS/rows.jsonl"
  # A profile of the matmul checks alone, for a shared node that allows other programs on the GPU.
  python3 - "$PROFILE" "$RUNS/matmul-only.yaml" <<'PY'
import sys, yaml
from gpuval.config import load_profile
data = load_profile(sys.argv[1]).model_dump(mode="json", exclude_none=True)
data["name"] = f"{data['name']}-matmul-only"
data["checks"] = {k: v for k, v in data["checks"].items() if k.startswith("matmul.")}
data["benchmarks"] = {}
yaml.safe_dump(data, open(sys.argv[2], "w"))
PY
  row clean-quick "nothing injected (control)" -- \
    python3 -m gpuval accept --profile "$PROFILE" "${SETS[@]}" --quick
  start_hog --compute
  row compute-hog "another process multiplies bf16 8192^3 on the GPU" -- \
    python3 -m gpuval accept --profile "$PROFILE" "${SETS[@]}" --quick
  row compute-hog-shared "the same, on a node that allows other programs (health.foreign_processes=warn)" -- \
    python3 -m gpuval accept --profile "$RUNS/matmul-only.yaml" "${SETS[@]}" --quick \
    --set health.foreign_processes=warn
  stop_hog
  start_hog --memory-gib 70
  row memory-hog "another process holds 70 GiB of the GPU" -- \
    python3 -m gpuval accept --profile "$PROFILE" "${SETS[@]}" --quick
  stop_hog
  row cuda-hidden-health "CUDA_VISIBLE_DEVICES= (CUDA sees no GPU, NVML sees them)" -- \
    env CUDA_VISIBLE_DEVICES= python3 -m gpuval health --profile "$PROFILE" "${SETS[@]}"
  row cuda-hidden-accept "CUDA_VISIBLE_DEVICES= (CUDA sees no GPU, NVML sees them)" -- \
    env CUDA_VISIBLE_DEVICES= python3 -m gpuval accept --profile "$PROFILE" "${SETS[@]}" --quick
  row cuda-hidden-auto "CUDA_VISIBLE_DEVICES=, no --profile given" -- \
    env CUDA_VISIBLE_DEVICES= python3 -m gpuval accept --quick "${SETS[@]}"
  python3 - "$RUNS/rows.jsonl" "$OUT/fault-matrix.json" "$OUT/env.json" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
json.dump({"env": json.load(open(sys.argv[3])), "rows": rows}, open(sys.argv[2], "w"), indent=2)
for r in rows:
    print(f"{r['name']:20} exit={r['exit_code']} verdict={r['verdict']} wall={r['wall_s']} s  "
          f"{'; '.join(c['name'] + '=' + c['status'] for c in r['not_passed'][:4])}")
PY
fi

#!/usr/bin/env bash
# One device session, everything gpuval can show on one machine, each with the environment recorded.
# Usage on a device machine: bash tools/device/device_run.sh PROFILE
# Writes under $OUT (at most 8 files come back): env.json, discover.json, health.json, nvml.json,
# monitor.json, accept-quick.json, accept-standard.json, reference.json, log.txt: run with
# TIERS=quick (or REFERENCE=0) to stay within eight. junit files stay in /tmp/gpuval-runs.
set -uo pipefail
PROFILE=${1:?profile}
TIERS=${TIERS:-"quick standard"}
source "$(dirname "$0")/device_env.sh"
RUNS=/tmp/gpuval-runs
mkdir -p "$RUNS"
exec > >(tee "$OUT/log.txt") 2>&1

GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
# A lone GPU passed through to a VM has no NVLink; the profiles expect an HGX node's 18 per GPU.
SETS=(--set expect.gpu_count="$GPUS")
[ "$GPUS" = 1 ] && SETS+=(--set expect.nvlinks_per_gpu=null)
python3 - "$OUT/env.json" <<'PY'
import json, sys, datetime, os, torch, pynvml
pynvml.nvmlInit()
info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())), "driver": pynvml.nvmlSystemGetDriverVersion(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_SYMM", "NVSHMEM_"))},
        "power_limit_w": [], "max_sm_clock_mhz": []}
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    info["power_limit_w"].append(pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000)
    info["max_sm_clock_mhz"].append(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))
json.dump(info, open(sys.argv[1], "w"), indent=2)
print(info)
PY

timed() {  # timed NAME COMMAND...: run it, print and keep its exit code and wall time
  local name=$1; shift
  local start end rc
  start=$(date +%s.%N); "$@"; rc=$?; end=$(date +%s.%N)
  echo "TIMED $name exit=$rc wall_s=$(python3 -c "print(round($end-$start,2))")"
  echo "$name $rc $(python3 -c "print(round($end-$start,2))")" >> "$RUNS/timings.txt"
}

timed discover python3 -m gpuval discover --output "$OUT/discover.json"
timed health python3 -m gpuval health --profile "$PROFILE" "${SETS[@]}" --output "$RUNS/health"
cp "$RUNS/health/result.json" "$OUT/health.json"
python3 tools/record_nvml.py --output "$OUT/nvml.json"
# The monitor's own NVML queries (PCIe throughput, NVLink field values) on real GPUs.
python3 -m gpuval monitor --once --json --interval 1 > "$OUT/monitor.json"
for tier in $TIERS; do
  flag=""; [ "$tier" = quick ] && flag="--quick"
  timed "accept-$tier" python3 -m gpuval accept --profile "$PROFILE" "${SETS[@]}" $flag \
    --output "$RUNS/$tier"
  cp "$RUNS/$tier/result.json" "$OUT/accept-$tier.json"
done
# Wall times (start-up included) into the files they describe.
python3 - "$RUNS/timings.txt" "$OUT" <<'PY'
import json, sys
out = sys.argv[2]
for line in open(sys.argv[1]):
    name, rc, wall = line.split()
    path = {"health": f"{out}/health.json", "accept-quick": f"{out}/accept-quick.json",
            "accept-standard": f"{out}/accept-standard.json"}.get(name)
    if path:
        data = json.load(open(path))
        data["inventory"]["wall_s_including_startup"] = float(wall)
        data["inventory"]["exit_code"] = int(rc)
        json.dump(data, open(path, "w"), indent=2)
PY
if [ "${REFERENCE:-1}" = 1 ]; then
  python3 tools/reference/reference.py --output "$OUT/reference.json"
fi

#!/usr/bin/env bash
# One device session: gpuval accept (quick and standard tiers) and the independent ceilings, with the
# environment recorded. Usage on a device machine: bash benchmarks/device_run.sh PROFILE
# Writes under $OUT: env.json, quick/result.json, quick/junit.xml, standard/result.json,
# standard/junit.xml, reference.json, log.txt.
set -uo pipefail
PROFILE=${1:?profile}
TIERS=${TIERS:-"quick standard"}
OUT=${OUT:-/tmp/gpuval-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/log.txt") 2>&1

GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
python3 - "$OUT/env.json" <<'PY'
import json, sys, datetime, os, torch, pynvml
pynvml.nvmlInit()
info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())), "driver": pynvml.nvmlSystemGetDriverVersion(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_SYMM", "NVSHMEM_"))},
        "power_limit_w": [], "enforced_power_limit_w": [], "max_sm_clock_mhz": [], "max_mem_clock_mhz": []}
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    info["power_limit_w"].append(pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000)
    info["enforced_power_limit_w"].append(pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000)
    info["max_sm_clock_mhz"].append(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))
    info["max_mem_clock_mhz"].append(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM))
json.dump(info, open(sys.argv[1], "w"), indent=2)
print(info)
PY
for tier in $TIERS; do
  flag=""; [ "$tier" = quick ] && flag="--quick"
  start=$(date +%s.%N)
  python3 -m gpuval accept --profile "$PROFILE" --set expect.gpu_count="$GPUS" $flag --output "$OUT/$tier"
  rc=$?
  end=$(date +%s.%N)
  echo "TIER $tier exit=$rc wall_s=$(python3 -c "print(round($end-$start,1))")"
  python3 - "$OUT/$tier/result.json" "$rc" "$(python3 -c "print(round($end-$start,1))")" <<'PY'
import json, sys
path, rc, wall = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
data = json.load(open(path))
data["inventory"]["wall_s_including_startup"] = wall
data["inventory"]["exit_code"] = rc
json.dump(data, open(path, "w"), indent=2)
PY
done
if [ "${REFERENCE:-1}" = 1 ]; then
  python3 benchmarks/reference.py --output "$OUT/reference.json"
fi
if [ "$GPUS" -ge 2 ]; then
  python3 -m gpuval bench p2p --output "$OUT/p2p.json"
fi

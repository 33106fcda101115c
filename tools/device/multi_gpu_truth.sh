#!/usr/bin/env bash
# Issue 34's evidence on a lent multi-GPU machine, on the device image's torch and gpuval as committed:
#   standard  N_STANDARD clean `accept` runs (standard tier) on every GPU of the machine
#   quick1    clean `accept --quick` runs on a machine of one GPU, up to N_QUICK in all (QUICK_BUDGET_S a call)
#   sigstop   on every GPU: rank 1 stopped (SIGSTOP) FAULT_AT_S seconds into accept --quick
#   faults    on every GPU: rank 1 killed (SIGKILL), another program that starts multiplying on GPU 0
#             mid-run; each fault row with its exit code, verdict and seconds from the fault to the verdict
#   matrix    the fault matrix's one-GPU rows (tools/device/fault_matrix_device.sh's faults phase)
# Usage on a device machine: PHASES="standard sigstop" bash tools/device/multi_gpu_truth.sh [PROFILE]
# (the profile by the GPUs' name when none is given). Each phase appends to what earlier calls left in $RUNS.
# Files under $OUT: env.json, runs.json (every clean run's verdict and every check's value), faults.json,
# fault-matrix-1gpu.json, standard-1.json (the first standard run's result.json), log.txt.
set -uo pipefail
PROFILE=${1:-}
[ -n "$PROFILE" ] || PROFILE=$(python3 -c 'import torch; print("h200-sxm" if "H200" in torch.cuda.get_device_name(0) else "h100-sxm")')
PHASES=${PHASES:-"standard faults"}
N_STANDARD=${N_STANDARD:-5}
N_QUICK=${N_QUICK:-10}
FAULT_AT_S=${FAULT_AT_S:-15}
source "$(dirname "$0")/device_env.sh"
RUNS=/tmp/gpuval-runs
mkdir -p "$RUNS"
exec > >(tee -a "$OUT/log.txt") 2>&1
export GPUVAL_HISTORY=none
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
echo "phases: $PHASES on $GPUS GPUs, profile $PROFILE, gpuval ${GPUVAL_COMMIT:-unknown}"

python3 - "$OUT/env.json" <<'PY'
import datetime, json, os, sys, torch, pynvml
pynvml.nvmlInit()
info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpuval_commit": os.environ.get("GPUVAL_COMMIT", ""), "torch": torch.__version__,
        "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL", "TORCH_SYMM"))}}
json.dump(info, open(sys.argv[1], "w"), indent=2)
print(info)
PY

clean() {  # clean KIND INDEX GPUS_USED COMMAND...: one clean run, its verdict and checks into runs.jsonl
  local kind=$1 index=$2 used=$3; shift 3
  local out="$RUNS/$kind-$index" start end rc
  rm -rf "$out"
  start=$(date +%s.%N)
  timeout 590 "$@" --output "$out" >"$out.txt" 2>&1
  rc=$?
  end=$(date +%s.%N)
  tail -n 4 "$out.txt"
  python3 - "$kind" "$index" "$used" "$rc" "$start" "$end" "$out" "$*" >>"$RUNS/runs.jsonl" <<'PY'
import json, os, sys
kind, index, used, rc, start, end, out, command = sys.argv[1:]
row = {"kind": kind, "index": int(index), "gpus": int(used), "exit_code": int(rc),
       "wall_s": round(float(end) - float(start), 2), "command": command, "verdict": None}
path = os.path.join(out, "result.json")
if os.path.isfile(path):
    data = json.load(open(path))
    row.update(verdict=data["verdict"], duration_s=data["duration_s"], world=data["world"],
               checks=[{k: c.get(k) for k in ("name", "scope", "status", "value", "threshold", "detail")}
                       for c in data["checks"]])
print(json.dumps(row))
PY
  echo "RUN $kind-$index exit=$rc wall=$(python3 -c "print(round($end-$start,1))")"
}

pid_of_rank() {  # pid_of_rank RANK: the worker gpuval's launcher registered for that rank
  cat /tmp/gpuval-exit-*/pid-"$1" 2>/dev/null | head -n 1
}

fault() {  # fault NAME HOW ACTION -- COMMAND...: run it, do ACTION after FAULT_AT_S s, time to verdict
  local name=$1 how=$2 action=$3; shift 4
  local out="$RUNS/$name" start injected end rc pid=""
  rm -rf "$out"
  start=$(date +%s.%N)
  timeout -s KILL 400 "$@" --output "$out" >"$out.txt" 2>&1 &  # 137: gpuval itself hung
  local job=$!
  sleep "$FAULT_AT_S"
  case $action in
    stop1) pid=$(pid_of_rank 1); kill -STOP "$pid" ;;
    kill1) pid=$(pid_of_rank 1); kill -KILL "$pid" ;;
    hog) python3 tools/device/gpu_hog.py --compute >"$RUNS/hog.txt" 2>&1 & pid=$! ;;
  esac
  injected=$(date +%s.%N)
  echo "FAULT $name: $action pid=$pid at $(python3 -c "print(round($injected-$start,1))") s"
  wait "$job"; rc=$?
  end=$(date +%s.%N)
  [ "$action" = hog ] && kill "$pid" 2>/dev/null
  [ "$action" = stop1 ] && kill -KILL "$pid" 2>/dev/null  # never leave a stopped rank behind
  tail -n 6 "$out.txt"
  python3 tools/device/fault_row.py --name "$name" --how "$how" --exit "$rc" \
    --wall "$(python3 -c "print(round($end-$start,2))")" --result "$out/result.json" \
    --output-text "$out.txt" --command "$*" >"$RUNS/row.json"
  python3 - "$RUNS/row.json" "$pid" "$(python3 -c "print(round($end-$injected,2))")" \
    "$(python3 -c "print(round($injected-$start,2))")" >>"$RUNS/faults.jsonl" <<'PY'
import json, sys
row = json.load(open(sys.argv[1]))
row.update(fault_pid=sys.argv[2], seconds_from_fault_to_verdict=float(sys.argv[3]),
           fault_at_s=float(sys.argv[4]))
print(json.dumps(row))
PY
  echo "FAULT $name exit=$rc, $(python3 -c "print(round($end-$injected,1))") s from the fault to the verdict"
}

summarise() {  # runs.json and faults.json from what ran so far (after each phase: a call cut short keeps them)
python3 - "$RUNS" "$OUT" <<'PY'
import json, os, sys
runs_dir, out = sys.argv[1:]
def lines(name):
    path = os.path.join(runs_dir, name)
    return [json.loads(line) for line in open(path)] if os.path.isfile(path) else []
runs, faults = lines("runs.jsonl"), lines("faults.jsonl")
summary = {}
for run in runs:
    key = f"{run['kind']} ({run['gpus']} GPU)"
    entry = summary.setdefault(key, {"runs": 0, "verdicts": {}, "not_pass": []})
    entry["runs"] += 1
    entry["verdicts"][str(run["verdict"])] = entry["verdicts"].get(str(run["verdict"]), 0) + 1
    entry["not_pass"] += [f"{run['index']}: {c['name']} {c['scope']} {c['status']} {c['value']}"
                          for c in run.get("checks", []) if c["status"] not in ("PASS", "SKIP")]
if runs:
    json.dump({"summary": summary, "runs": runs}, open(os.path.join(out, "runs.json"), "w"), indent=1)
if faults:
    json.dump({"rows": faults}, open(os.path.join(out, "faults.json"), "w"), indent=1)
print(json.dumps(summary, indent=1))
for f in faults:
    print(f"FAULTROW {f['name']}: exit {f['exit_code']} verdict {f['verdict']} "
          f"{f['seconds_from_fault_to_verdict']} s from fault; {f['output_tail'][-1:]}")
PY
}

ALL=(--profile "$PROFILE" --set expect.gpu_count="$GPUS")
ONE=(--profile "$PROFILE" --set expect.gpu_count=1 --set expect.nvlinks_per_gpu=null)

if [[ " $PHASES " == *" standard "* ]]; then
  phase_start=$(date +%s)
  for i in $(seq 1 "$N_STANDARD"); do
    [ $(( $(date +%s) - phase_start )) -lt "${STANDARD_BUDGET_S:-100000}" ] || break
    clean standard "$i" "$GPUS" python3 -m gpuval accept "${ALL[@]}"
  done
  cp "$RUNS/standard-1/result.json" "$OUT/standard-1.json" 2>/dev/null
  summarise
fi
if [[ " $PHASES " == *" quick1 "* ]]; then
  # On a machine of one GPU: CUDA_VISIBLE_DEVICES=0 on a larger one hides GPUs NVML still lists, which
  # gpuval rightly FAILs (cuda.visible). No new run starts once QUICK_BUDGET_S have passed in the phase.
  first=$(( $(find "$RUNS" -maxdepth 1 -name 'quick1-*.txt' | wc -l) + 1 ))
  phase_start=$(date +%s)
  for i in $(seq "$first" "$N_QUICK"); do
    [ $(( $(date +%s) - phase_start )) -lt "${QUICK_BUDGET_S:-100000}" ] || break
    clean quick1 "$i" 1 python3 -m gpuval accept "${ONE[@]}" --quick
  done
  summarise
fi
if [[ " $PHASES " == *" sigstop "* ]]; then
  fault sigstop-rank1 "rank 1 stopped with SIGSTOP ${FAULT_AT_S} s into accept --quick" stop1 -- \
    python3 -m gpuval accept "${ALL[@]}" --quick
  summarise
fi
if [[ " $PHASES " == *" faults "* ]]; then
  fault sigkill-rank1 "rank 1 killed with SIGKILL ${FAULT_AT_S} s into accept --quick" kill1 -- \
    python3 -m gpuval accept "${ALL[@]}" --quick
  fault job-mid-run "another program starts multiplying on GPU 0 ${FAULT_AT_S} s into accept --quick" hog -- \
    python3 -m gpuval accept "${ALL[@]}" --quick
  summarise
fi
if [[ " $PHASES " == *" matrix "* ]]; then
  OUT="$RUNS/matrix" PHASES=faults bash tools/device/fault_matrix_device.sh "$PROFILE" >/dev/null 2>&1
  cp "$RUNS/matrix/fault-matrix.json" "$OUT/fault-matrix-1gpu.json" 2>/dev/null
  python3 - "$OUT/fault-matrix-1gpu.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(f"MATRIX {r['name']:20} exit={r['exit_code']} verdict={r['verdict']} wall={r['wall_s']} s")
PY
fi


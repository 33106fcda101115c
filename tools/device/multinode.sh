#!/usr/bin/env bash
# Issue 51: N nodes of one lent host, as NCCL sees hosts without InfiniBand. One torchrun per "node", each
# with its share of the GPUs (CUDA_VISIBLE_DEVICES), its own GPUVAL_NODE_NAME, and NCCL's shared-memory and
# peer-to-peer paths off (NCCL_SHM_DISABLE=1, NCCL_P2P_DISABLE=1, NCCL_IB_DISABLE=1), so that the nodes talk
# through NCCL's socket transport on loopback. torchrun's static rendezvous on 127.0.0.1 joins them: the
# same engine a cluster uses (torch.distributed.run), nothing of gpuval's own.
#   NODES=2 PHASES="accept subnode stop kill" bash tools/device/multinode.sh [PROFILE]
# Phases:
#   accept   `gpuval accept` (standard tier) across the nodes: verdict and every check (N_ACCEPT runs)
#   subnode  `gpuval accept` self-launched on the first half of the GPUs (CUDA_VISIBLE_DEVICES, no cgroups)
#   stop     node 1's ranks stopped (SIGSTOP) FAULT_AT_S seconds in: node 0's exit code, line, seconds
#   kill     node 1's ranks killed (SIGKILL) FAULT_AT_S seconds in: the same
# On a machine without GPUs (CPU=1) each node gets one gloo rank instead: the orchestration's dry run.
# Writes $OUT/runs.jsonl (one row a run or fault), $OUT/log.txt, $OUT/env.json.
set -uo pipefail
NODES=${NODES:-2}
PHASES=${PHASES:-"accept subnode stop kill"}
N_ACCEPT=${N_ACCEPT:-1}
FAULT_AT_S=${FAULT_AT_S:-20}
CPU=${CPU:-0}
source "$(dirname "$0")/device_env.sh"
exec > >(tee -a "$OUT/log.txt") 2>&1
export GPUVAL_HISTORY=none
if [ "$CPU" = 1 ]; then
  GPUS=0 PER_NODE=1 PROFILE=${1:-cpu} EXPECT=0
else
  GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
  PER_NODE=$((GPUS / NODES))
  PROFILE=${1:-$(python3 -c 'import torch; print("h200-sxm" if "H200" in torch.cuda.get_device_name(0) else "h100-sxm")')}
  [ "$PER_NODE" -ge 1 ] || { echo "multinode: $GPUS GPUs cannot make $NODES nodes" >&2; exit 2; }
  EXPECT=$PER_NODE
fi
echo "multinode: $NODES nodes x $PER_NODE ranks ($GPUS GPUs), profile $PROFILE, phases: $PHASES"
python3 - "$OUT/env.json" "$CPU" <<'PY'
import datetime, json, os, sys, torch
info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
json.dump(info, open(sys.argv[1], "w"), indent=2)
print(info)
PY

share() {  # share NODE: the CUDA_VISIBLE_DEVICES of that node's GPUs
  seq -s, $(($1 * PER_NODE)) $(($1 * PER_NODE + PER_NODE - 1))
}

start_nodes() {  # start_nodes DIR PORT ARGS...: one torchrun per node in the background; pids in DIR/pids
  local dir=$1 port=$2 node; shift 2
  mkdir -p "$dir"; : >"$dir/pids"
  for node in $(seq 0 $((NODES - 1))); do
    (
      export GPUVAL_NODE_NAME="node$node" NCCL_SHM_DISABLE=1 NCCL_P2P_DISABLE=1 NCCL_IB_DISABLE=1 \
        NCCL_SOCKET_IFNAME=lo GLOO_SOCKET_IFNAME=lo
      if [ "$CPU" = 1 ]; then export CUDA_VISIBLE_DEVICES=""; else CUDA_VISIBLE_DEVICES=$(share "$node"); export CUDA_VISIBLE_DEVICES; fi
      exec setsid python3 -m torch.distributed.run --nnodes="$NODES" --nproc-per-node="$PER_NODE" \
        --node-rank="$node" --master-addr=127.0.0.1 --master-port="$port" \
        -m gpuval accept --profile "$PROFILE" --set "expect.gpu_count=$EXPECT" --output "$dir/out" "$@" \
        >"$dir/node$node.txt" 2>&1
    ) &
    echo "$!" >>"$dir/pids"
  done
}

wait_nodes() {  # wait_nodes DIR: every node's torchrun ended; returns node 0's exit code (its rank 0 writes
  # the verdict). Not a bare `wait`: it would also wait for the log's tee (a process substitution).
  local pid rc=""
  while read -r pid; do
    wait "$pid"
    rc=${rc:-$?}
  done <"$1/pids"
  return "$rc"
}

row() {  # row KIND DIR RC SECONDS [FAULT_TO_END_S]: one line of runs.jsonl from node 0's output
  python3 - "$@" >>"$OUT/runs.jsonl" <<'PY'
import json, os, sys
kind, folder, rc, seconds = sys.argv[1:5]
row = {"kind": kind, "exit_code": int(rc), "wall_s": round(float(seconds), 1)}
if len(sys.argv) > 5:
    row["fault_to_end_s"] = round(float(sys.argv[5]), 1)
text = open(os.path.join(folder, "node0.txt"), errors="replace").read() if os.path.exists(os.path.join(folder, "node0.txt")) else ""
row["gpuval_lines"] = [line for line in text.splitlines() if line.startswith("gpuval:")]
path = os.path.join(folder, "out", "result.json")
if os.path.isfile(path):
    data = json.load(open(path))
    row.update(verdict=data["verdict"], world=data["world"], join_s=data["inventory"].get("join_s"),
               checks=[{k: c.get(k) for k in ("name", "scope", "status", "value", "threshold", "detail")}
                       for c in data["checks"]])
print(json.dumps(row))
print(kind, rc, row.get("verdict"), row["gpuval_lines"][-1:] , file=sys.stderr)
PY
}

node_ranks() {  # node_ranks NODE: pids of that node's gpuval ranks (their GPUVAL_NODE_NAME)
  local pid
  for pid in $(pgrep -f "gpuval accept"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "GPUVAL_NODE_NAME=node$1" &&
      tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q "^RANK="; then
      echo "$pid"
    fi
  done
}

port=29611
for phase in $PHASES; do
  case $phase in
    accept)
      for i in $(seq 1 "$N_ACCEPT"); do
        dir=/tmp/multinode/accept-$i; rm -rf "$dir"; began=$(date +%s.%N)
        start_nodes "$dir" $((port++))
        wait_nodes "$dir"; rc=$?
        row "accept" "$dir" "$rc" "$(echo "$(date +%s.%N) - $began" | bc)"
      done
      ;;
    subnode)
      dir=/tmp/multinode/subnode; rm -rf "$dir"; mkdir -p "$dir"; began=$(date +%s.%N)
      half=""
      [ "$CPU" = 1 ] || half=$(seq -s, 0 $((GPUS / 2 - 1)))
      CUDA_VISIBLE_DEVICES=$half timeout 590 python3 -m gpuval accept --profile "$PROFILE" \
        --set "expect.gpu_count=$((EXPECT == 0 ? 0 : GPUS / 2))" --output "$dir/out" >"$dir/node0.txt" 2>&1
      row "subnode" "$dir" "$?" "$(echo "$(date +%s.%N) - $began" | bc)"
      ;;
    stop | kill)
      signal=$([ "$phase" = stop ] && echo STOP || echo KILL)
      dir=/tmp/multinode/$phase; rm -rf "$dir"; began=$(date +%s.%N)
      start_nodes "$dir" $((port++)) --quick
      sleep "$FAULT_AT_S"
      victims=$(node_ranks 1)
      echo "$phase: node1's ranks: ${victims:-none found}"
      faulted=$(date +%s.%N)
      # shellcheck disable=SC2086  # one pid a word
      [ -n "$victims" ] && kill -s "$signal" $victims
      first=$(head -n 1 "$dir/pids")
      timeout 300 tail --pid="$first" -f /dev/null
      wait "$first"; rc=$?  # node 0's exit code: its rank 0 writes the verdict
      ended=$(date +%s.%N)
      row "$phase" "$dir" "$rc" "$(echo "$ended - $began" | bc)" "$(echo "$ended - $faulted" | bc)"
      sleep 40  # node 1's launcher: its store (on node 0) is gone; torchrun stops its workers in ~30 s
      left=$(pgrep -f "gpuval accept" | wc -l)
      echo "$phase: gpuval processes left 40 s after node 0 ended: $left" | tee -a "$dir/left.txt"
      pkill -KILL -f "gpuval accept" 2>/dev/null
      wait_nodes "$dir"
      ;;
    *) echo "multinode: unknown phase $phase" >&2; exit 2 ;;
  esac
done

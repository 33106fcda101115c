#!/usr/bin/env bash
# nccl_reference with one process per local GPU (nccl-tests' MPI layout, and torch's): the same arguments
# as nccl_reference; rank 0 prints. Usage: nccl_reference_mp.sh BINARY OP MIN_BYTES MAX_BYTES [...]
set -uo pipefail
BINARY=$1; shift
GPUS=$(nvidia-smi -L | wc -l)
ID_FILE=$(mktemp -u /tmp/nccl-id.XXXXXX)
pids=()
for rank in $(seq 0 $((GPUS - 1))); do
  NCCL_REF_NRANKS=$GPUS NCCL_REF_RANK=$rank NCCL_REF_ID_FILE=$ID_FILE "$BINARY" "$@" &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
rm -f "$ID_FILE"
exit $rc

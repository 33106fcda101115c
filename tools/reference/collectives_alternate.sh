#!/usr/bin/env bash
# On a multi-GPU device machine: raw NCCL (nccl_reference.cu, the nccl-tests way) and gpuval's collectives,
# alternated ROUNDS times on the same machine, so machine-to-machine and minute-to-minute drift cannot pass
# for a gap between the two. REF_MODE=mp (default) runs the reference one process per GPU, as torch and
# nccl-tests under MPI do; REF_MODE=sp one process driving every GPU (nccl-tests' -g N). Writes under $OUT: nccl-N.jsonl and gpuval-N.json per round, alternate.json
# (per op and size: busbw of each round, median ratio gpuval/NCCL), alternate-log.txt.
set -uo pipefail
source "$(dirname "$0")/../device/device_env.sh"
ROUNDS=${ROUNDS:-3}
exec > >(tee "$OUT/alternate-log.txt") 2>&1
NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
nvcc -O2 -std=c++17 -arch=sm_90 -I"$NCCL_DIR/include" tools/reference/nccl_reference.cu -o /tmp/nccl_reference \
  -L"$NCCL_DIR/lib" -l:libnccl.so.2 || exit 1
for round in $(seq 1 "$ROUNDS"); do
  for op in all_reduce all_gather reduce_scatter alltoall broadcast sendrecv; do
    if [ "${REF_MODE:-mp}" = mp ]; then
      LD_LIBRARY_PATH="$NCCL_DIR/lib:${LD_LIBRARY_PATH:-}" timeout 90 tools/reference/nccl_reference_mp.sh \
        /tmp/nccl_reference "$op" 1048576 4294967296 2 20 5 5 || exit 1
    else
      LD_LIBRARY_PATH="$NCCL_DIR/lib:${LD_LIBRARY_PATH:-}" timeout 90 /tmp/nccl_reference "$op" 1048576 \
        4294967296 2 20 5 5 || exit 1
    fi
  done > "$OUT/nccl-$round.jsonl"
  python3 -m gpuval bench collectives --output "$OUT/gpuval-$round.json" > /dev/null || exit 1
  echo "round $round done"
done
python3 tools/reference/compare_collectives.py --rounds "$OUT" --output "$OUT/alternate.json"

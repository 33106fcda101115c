#!/usr/bin/env bash
# On a multi-GPU device machine: gpuval's collectives (CUDA-graph and eager timing) against raw NCCL driven
# from C++ the way nccl-tests drives it (nccl_reference.cu), same sizes, same formulas, one run.
# Writes under $OUT: nccl_reference.jsonl, gpuval_graph.json, gpuval_eager.json (EAGER=0 skips it),
# compare.json, collectives_log.txt.
set -uo pipefail
source "$(dirname "$0")/../device/device_env.sh"
exec > >(tee "$OUT/collectives_log.txt") 2>&1
NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
nvcc -O2 -std=c++17 -arch=sm_90 -I"$NCCL_DIR/include" tools/reference/nccl_reference.cu -o /tmp/nccl_reference \
  -L"$NCCL_DIR/lib" -l:libnccl.so.2 || exit 1
for op in all_reduce all_gather reduce_scatter alltoall broadcast sendrecv; do
  LD_LIBRARY_PATH="$NCCL_DIR/lib:${LD_LIBRARY_PATH:-}" timeout 90 /tmp/nccl_reference "$op" 1048576 4294967296 2 20 5 5 || exit 1
done > "$OUT/nccl_reference.jsonl"
python3 -m gpuval bench collectives --output "$OUT/gpuval_graph.json" > /dev/null
EAGER_FILE=()
if [ "${EAGER:-1}" = 1 ]; then
  python3 -m gpuval bench collectives --set cuda_graph=false --output "$OUT/gpuval_eager.json" > /dev/null
  EAGER_FILE=("$OUT/gpuval_eager.json")
fi
python3 tools/reference/compare_collectives.py "$OUT/nccl_reference.jsonl" "$OUT/gpuval_graph.json" \
  "${EAGER_FILE[@]}" --output "$OUT/compare.json"

#!/usr/bin/env bash
cd /work/main
for spec in "native 2" "avx2 0"; do
  set -- $spec; path=$1; seed=$2; env=()
  [ "$path" = avx2 ] && env=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2)
  rm -rf /tmp/mb4/$path-$seed
  start=$(date +%s)
  env "${env[@]}" .venv/bin/python -m gpuval finetune run --config configs/finetune/tiny-cpu.yaml --output /tmp/mb4/$path-$seed \
    --set train.seed=$seed --set train.micro_batch_size=4 --set train.max_steps=300 --set train.optim.lr=4e-3 > /tmp/mb4/log-$path-$seed.txt 2>&1
  echo "$path $seed rc=$? wall=$(( $(date +%s) - start ))" >> /tmp/mb4/done.txt
done

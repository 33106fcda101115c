#!/usr/bin/env bash
# Packs FlashAttention-4 and its CuTe DSL for the device machines (Python 3.12, CUDA 13) into the chunks
# tools/device/fa4_env.sh joins there: .fa4/N/fa4.tar.xz.N-of-M, at most CHUNK_MIB each (the working
# tree travels with every call, and a call carries 64 MiB in all). Needs the package index: run it here,
# not on the device. Versions: FA4_VERSION, CUTLASS_DSL_VERSION. What the packages need beyond these
# (torch, triton, cuda-bindings, protobuf, einops, typing-extensions) the device image has.
set -euo pipefail
cd "$(dirname "$0")/../.."
FA4_VERSION=${FA4_VERSION:-4.0.0b36}
CUTLASS_DSL_VERSION=${CUTLASS_DSL_VERSION:-4.8.1}
CHUNK_MIB=${CHUNK_MIB:-24}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip=(python3 -m pip)
[ -x .venv/bin/pip ] && pip=(.venv/bin/pip)
"${pip[@]}" download -q --pre --no-deps --dest "$work/wheels" --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --only-binary=:all: \
  "flash-attn-4==$FA4_VERSION" "nvidia-cutlass-dsl==$CUTLASS_DSL_VERSION" \
  "nvidia-cutlass-dsl-libs-base==$CUTLASS_DSL_VERSION" "nvidia-cutlass-dsl-libs-core==$CUTLASS_DSL_VERSION" \
  "nvidia-cutlass-dsl-libs-cu13==$CUTLASS_DSL_VERSION" \
  "apache-tvm-ffi<0.2,>=0.1.11" torch-c-dlpack-ext "quack-kernels>=0.5.3"
"${pip[@]}" install -q --no-deps --no-compile --target "$work/site" --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --only-binary=:all: "$work"/wheels/*.whl
tar -C "$work/site" -cf - . | xz -6 -T0 > "$work/fa4.tar.xz"
(cd "$work" && sha256sum fa4.tar.xz > fa4.tar.xz.sha256)
rm -rf .fa4
(cd "$work" && split -b "${CHUNK_MIB}M" -d -a 2 fa4.tar.xz chunk.)
total=$(find "$work" -maxdepth 1 -name 'chunk.*' | wc -l)
i=0
for chunk in "$work"/chunk.*; do
  i=$((i + 1))
  mkdir -p ".fa4/$i"
  mv "$chunk" ".fa4/$i/fa4.tar.xz.$i-of-$total"
  cp "$work/fa4.tar.xz.sha256" ".fa4/$i/"
done
du -sh .fa4/*

#!/usr/bin/env bash
# Packs FlashAttention-4 and its CuTe DSL for the device machines (Python 3.12, CUDA 13) into the two carry
# parts tools/device/fa4_env.sh unpacks: .fa4/p1/ir.so.xz and .fa4/p2/rest.tar.xz. Needs the package index
# (run it here, not on the device). Versions: FA4_VERSION, CUTLASS_DSL_VERSION.
set -euo pipefail
cd "$(dirname "$0")/../.."
FA4_VERSION=${FA4_VERSION:-4.0.0b36}
CUTLASS_DSL_VERSION=${CUTLASS_DSL_VERSION:-4.8.1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip=(python3 -m pip)
[ -x .venv/bin/pip ] && pip=(.venv/bin/pip)
"${pip[@]}" download -q --pre --no-deps --dest "$work/wheels" --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --only-binary=:all: \
  "flash-attn-4==$FA4_VERSION" "nvidia-cutlass-dsl==$CUTLASS_DSL_VERSION" \
  "nvidia-cutlass-dsl-libs-base==$CUTLASS_DSL_VERSION" "nvidia-cutlass-dsl-libs-cu13==$CUTLASS_DSL_VERSION" \
  "apache-tvm-ffi<0.2,>=0.1.11" torch-c-dlpack-ext "quack-kernels>=0.5.3"
"${pip[@]}" install -q --no-deps --no-compile --target "$work/site" --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --only-binary=:all: "$work"/wheels/*.whl
ir=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
mkdir -p .fa4/p1 .fa4/p2
xz -6 -T0 -c "$work/site/$ir" > .fa4/p1/ir.so.xz
tar -C "$work/site" --exclude="./$ir" -cf - . | xz -6 -T0 > .fa4/p2/rest.tar.xz
ls -l .fa4/p1/ir.so.xz .fa4/p2/rest.tar.xz

# shellcheck shell=bash
# Sourced by device scripts that use FlashAttention-4 (the flash-attn-4 package: flash_attn.cute, Hopper
# and Blackwell kernels written in NVIDIA's CuTe DSL and compiled at first use, so no CUDA build runs).
#
# Its CuTe DSL compiler (nvidia-cutlass-dsl-libs-cu13) is larger than one call's carry (64 MiB), so it
# travels in two parts, made here by tools/device/fa4_pack.sh:
#   .fa4/p1/ir.so.xz      the DSL's MLIR module alone (~50 MiB)
#   .fa4/p2/rest.tar.xz   everything else, installed with --target for Python 3.12 (~18 MiB)
# Carry .fa4/p1 in one call and .fa4/p2 in the next, on the same warm machine (this file unpacks each part
# to /tmp when it sees it; /tmp outlives a call on a warm machine). When both are in place the site lands
# in /tmp/fa4site and goes on PYTHONPATH; FA4_READY=1 says so.
FA4_READY=0
if [ -f .fa4/p1/ir.so.xz ] && [ ! -f /tmp/fa4-ir.so ]; then
  xz -d -T0 -c .fa4/p1/ir.so.xz > /tmp/fa4-ir.so.part && mv /tmp/fa4-ir.so.part /tmp/fa4-ir.so
  echo "fa4: compiler module unpacked ($(du -m /tmp/fa4-ir.so | cut -f1) MiB)"
fi
if [ -f .fa4/p2/rest.tar.xz ] && [ ! -d /tmp/fa4site/flash_attn ]; then
  mkdir -p /tmp/fa4site && tar -C /tmp/fa4site -xJf .fa4/p2/rest.tar.xz && echo "fa4: site unpacked"
fi
_fa4_ir=/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
if [ -d /tmp/fa4site/flash_attn ] && [ -f /tmp/fa4-ir.so ] && [ ! -f "$_fa4_ir" ]; then
  cp /tmp/fa4-ir.so "$_fa4_ir"
fi
if [ -f "$_fa4_ir" ]; then
  # the DSL's .pth puts dsl_packages on sys.path, but .pth files run only in site directories
  export PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
  FA4_READY=1
else
  echo "fa4: not installed (carry .fa4/p1 and .fa4/p2 in two calls on one warm machine: tools/device/fa4_env.sh)"
fi
unset _fa4_ir

# shellcheck shell=bash
# Sourced by device scripts that use FlashAttention-4 (the flash-attn-4 package: flash_attn.cute, Hopper
# and Blackwell kernels written in NVIDIA's CuTe DSL and compiled at first use, so no CUDA build runs).
#
# With its CuTe DSL compiler (nvidia-cutlass-dsl-libs-cu13) it is larger than what one call may carry
# beside the working tree (64 MiB in all), so tools/device/fa4_pack.sh makes one xz tarball (a site
# directory installed for Python 3.12) cut into chunks, one folder each:
#   .fa4/1/fa4.tar.xz.1-of-3  .fa4/2/fa4.tar.xz.2-of-3  ...   each folder also holds fa4.tar.xz.sha256
# Carry one folder per call, in calls on the same warm machine: this file keeps each chunk it sees in
# /tmp/fa4-chunks (/tmp outlives a call on a warm machine), and once all are there and the checksum
# matches, unpacks the site to /tmp/fa4site and puts it on PYTHONPATH (the log says so).
mkdir -p /tmp/fa4-chunks
for _fa4_chunk in .fa4/*/fa4.tar.xz.*-of-*; do
  [ -f "$_fa4_chunk" ] || continue
  cp "$_fa4_chunk" "$(dirname "$_fa4_chunk")/fa4.tar.xz.sha256" /tmp/fa4-chunks/
  echo "fa4: chunk $(basename "$_fa4_chunk") kept"
done
if [ ! -d /tmp/fa4site/flash_attn ] && [ -f /tmp/fa4-chunks/fa4.tar.xz.sha256 ]; then
  _fa4_total=$(find /tmp/fa4-chunks -name 'fa4.tar.xz.1-of-*' | sed 's/.*-of-//')
  _fa4_have=$(find /tmp/fa4-chunks -name 'fa4.tar.xz.*-of-*' | wc -l)
  if [ -n "$_fa4_total" ] && [ "$_fa4_have" -eq "$_fa4_total" ]; then
    for i in $(seq 1 "$_fa4_total"); do cat "/tmp/fa4-chunks/fa4.tar.xz.$i-of-$_fa4_total"; done \
      > /tmp/fa4-chunks/fa4.tar.xz
    if (cd /tmp/fa4-chunks && sha256sum -c --quiet fa4.tar.xz.sha256); then
      mkdir -p /tmp/fa4site.part && tar -C /tmp/fa4site.part -xJf /tmp/fa4-chunks/fa4.tar.xz \
        && mv /tmp/fa4site.part /tmp/fa4site && echo "fa4: site unpacked to /tmp/fa4site"
    else
      echo "fa4: the joined chunks do not match fa4.tar.xz.sha256: carry them again"
    fi
    rm -f /tmp/fa4-chunks/fa4.tar.xz
  else
    echo "fa4: ${_fa4_have} of ${_fa4_total:-?} chunks here so far"
  fi
fi
if [ -d /tmp/fa4site/flash_attn ]; then
  # the DSL's .pth puts dsl_packages on sys.path, but .pth files run only in site directories
  export PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
  echo "fa4: /tmp/fa4site on PYTHONPATH"
fi
unset _fa4_chunk _fa4_total _fa4_have

# shellcheck shell=bash
# Sourced by device scripts that use Unsloth (benchmarks/finetune_speed_unsloth.py): unsloth, unsloth_zoo
# and bitsandbytes (CUDA 13 library only), which the device image lacks and cannot fetch.
#
# tools/device/unsloth_pack.sh makes one xz tarball (a site directory installed for Python 3.12) cut into
# chunks, one folder each:
#   .unsloth/1/unsloth.tar.xz.1-of-2  .unsloth/2/unsloth.tar.xz.2-of-2  ...   each folder also holds
#   unsloth.tar.xz.sha256
# Carry the folders (all in one call, or one a call on the same warm machine): this file keeps each chunk
# it sees in /tmp/unsloth-chunks (/tmp outlives a call on a warm machine), and once all are there and the
# checksum matches, unpacks the site to /tmp/unslothsite and puts it on PYTHONPATH (the log says so).
# Unsloth also imports trl and datasets, which calls carry as .whl (device_env.sh installs those).
# Unsloth writes the modules it compiles to UNSLOTH_COMPILE_LOCATION, by default a folder in the working
# directory; here it defaults to /tmp/unsloth_compiled_cache, out of the working tree.
mkdir -p /tmp/unsloth-chunks
for _unsloth_chunk in .unsloth/*/unsloth.tar.xz.*-of-*; do
  [ -f "$_unsloth_chunk" ] || continue
  cp "$_unsloth_chunk" "$(dirname "$_unsloth_chunk")/unsloth.tar.xz.sha256" /tmp/unsloth-chunks/
  echo "unsloth: chunk $(basename "$_unsloth_chunk") kept"
done
if [ ! -d /tmp/unslothsite/unsloth ] && [ -f /tmp/unsloth-chunks/unsloth.tar.xz.sha256 ]; then
  _unsloth_total=$(find /tmp/unsloth-chunks -name 'unsloth.tar.xz.1-of-*' | sed 's/.*-of-//')
  _unsloth_have=$(find /tmp/unsloth-chunks -name 'unsloth.tar.xz.*-of-*' | wc -l)
  if [ -n "$_unsloth_total" ] && [ "$_unsloth_have" -eq "$_unsloth_total" ]; then
    for i in $(seq 1 "$_unsloth_total"); do
      cat "/tmp/unsloth-chunks/unsloth.tar.xz.$i-of-$_unsloth_total"
    done > /tmp/unsloth-chunks/unsloth.tar.xz
    if (cd /tmp/unsloth-chunks && sha256sum -c --quiet unsloth.tar.xz.sha256); then
      rm -rf /tmp/unslothsite.part && mkdir -p /tmp/unslothsite.part \
        && tar -C /tmp/unslothsite.part -xJf /tmp/unsloth-chunks/unsloth.tar.xz \
        && mv /tmp/unslothsite.part /tmp/unslothsite && echo "unsloth: site unpacked to /tmp/unslothsite"
    else
      echo "unsloth: the joined chunks do not match unsloth.tar.xz.sha256: carry them again"
    fi
    rm -f /tmp/unsloth-chunks/unsloth.tar.xz
  else
    echo "unsloth: ${_unsloth_have} of ${_unsloth_total:-?} chunks here so far"
  fi
fi
if [ -d /tmp/unslothsite/unsloth ]; then
  export PYTHONPATH=/tmp/unslothsite${PYTHONPATH:+:$PYTHONPATH}
  export UNSLOTH_COMPILE_LOCATION=${UNSLOTH_COMPILE_LOCATION:-/tmp/unsloth_compiled_cache}
  echo "unsloth: /tmp/unslothsite on PYTHONPATH"
fi
unset _unsloth_chunk _unsloth_total _unsloth_have

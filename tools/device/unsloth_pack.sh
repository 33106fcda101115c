#!/usr/bin/env bash
# Packs Unsloth for the device machines (Python 3.12, torch 2.11 with CUDA 13) into the chunks
# tools/device/unsloth_env.sh joins there: .unsloth/N/unsloth.tar.xz.N-of-M, at most CHUNK_MIB each (the
# working tree travels with every call, and a call carries 64 MiB in all). Needs the package index: run it
# here, not on the device. Versions: UNSLOTH_VERSION, UNSLOTH_ZOO_VERSION, BNB_VERSION, BNB_CUDA;
# UNSLOTH_PACK_EXTRA adds requirements (space-separated, e.g. "xformers==0.0.35"), installed with
# --no-deps like the rest.
#
# What goes in: unsloth and unsloth_zoo (pure Python), and bitsandbytes with two of its libraries: the CPU
# one and the CUDA one it loads for torch.version.cuda 13.0 (libbitsandbytes_cuda130.so; the other CUDA,
# ROCm and XPU ones are deleted). Unsloth imports bitsandbytes inside try blocks and runs 16-bit LoRA
# without it, but every ordinary install has it, so it is carried to keep Unsloth on its usual path.
# Left out, each imported by Unsloth only inside a try block or only on a path a 16-bit LoRA run does not
# take: xformers (attention falls back to torch SDPA), cut_cross_entropy (unsloth_zoo turns it off on
# torch >= 2.8), torchao (QAT / FP8 only), msgspec (vLLM only), tyro, hf_transfer, diffusers (CLI, hub
# downloads). Also removed: the Studio app and the CLI that the unsloth wheel ships beside the library
# (studio/, unsloth_cli/: 83 MB, never imported by `unsloth`).
# The rest of what `from unsloth import FastLanguageModel` imports the device image has, but for trl and
# datasets (with dill, multiprocess, pydantic): device calls carry those as .whl (finetune_speed_device.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
UNSLOTH_VERSION=${UNSLOTH_VERSION:-2026.10.9}
UNSLOTH_ZOO_VERSION=${UNSLOTH_ZOO_VERSION:-2026.10.9}
BNB_VERSION=${BNB_VERSION:-0.50.2}
BNB_CUDA=${BNB_CUDA:-130}  # the one CUDA library of bitsandbytes kept: torch 2.11's CUDA, 13.0
CHUNK_MIB=${CHUNK_MIB:-24}
read -r -a extra <<< "${UNSLOTH_PACK_EXTRA:-}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip=(python3 -m pip)
[ -x .venv/bin/pip ] && pip=(.venv/bin/pip)
platforms=(--python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --only-binary=:all:)
"${pip[@]}" download -q --no-deps --dest "$work/wheels" "${platforms[@]}" \
  "unsloth==$UNSLOTH_VERSION" "unsloth_zoo==$UNSLOTH_ZOO_VERSION" "bitsandbytes==$BNB_VERSION" \
  ${extra[@]+"${extra[@]}"}
"${pip[@]}" install -q --no-deps --no-compile --target "$work/site" "${platforms[@]}" "$work"/wheels/*.whl
site=$work/site
rm -rf "${site:?}/studio" "${site:?}/unsloth_cli" "${site:?}/bin"
find "$site/bitsandbytes" -maxdepth 1 -name 'libbitsandbytes_*.so' \
  ! -name "libbitsandbytes_cuda$BNB_CUDA.so" ! -name 'libbitsandbytes_cpu.so' -delete
find "$site" -name __pycache__ -type d -prune -exec rm -rf {} +
(cd "$site" && find . -maxdepth 1 -name '*.dist-info' | sed 's|^\./||' | sort)
tar -C "$site" -cf - . | xz -6 -T0 > "$work/unsloth.tar.xz"
(cd "$work" && sha256sum unsloth.tar.xz > unsloth.tar.xz.sha256)
rm -rf .unsloth
(cd "$work" && split -b "${CHUNK_MIB}M" -d -a 2 unsloth.tar.xz chunk.)
total=$(find "$work" -maxdepth 1 -name 'chunk.*' | wc -l)
i=0
for chunk in "$work"/chunk.*; do
  i=$((i + 1))
  mkdir -p ".unsloth/$i"
  mv "$chunk" ".unsloth/$i/unsloth.tar.xz.$i-of-$total"
  cp "$work/unsloth.tar.xz.sha256" ".unsloth/$i/"
done
du -sh "$site" .unsloth/*

#!/usr/bin/env bash
# Issue 35's scaling evidence, on a device machine of several GPUs: the round-2 step (`gpuval bench train`'s
# GPU defaults: Qwen2-7B shape with random weights, LoRA r64 q/k/v/o, dropout 0.05, packed Glaive-length
# documents in 4,096-token rows, micro-batch 3, compiled layers, the fused loss, split products and the rest
# of the parts as `auto` decides them for each parallel mode) on one GPU and under torchrun on 2 and on
# every local GPU, with DDP, FSDP2 and DeepSpeed ZeRO-3; each run's per-GPU tokens/s against the one-GPU
# run of the same call. Then the shipped recipe (configs/finetune/qwen2-7b-lora.yaml) through
# `gpuval finetune train --nproc N` and through torchrun.
#
#   PHASE=wide bash tools/device/finetune_scaling_device.sh    # 1 GPU, then every local GPU: ddp, fsdp,
#                                                              # deepspeed, the ZeRO-3 experiments, fp8 ddp
#   PHASE=two  bash tools/device/finetune_scaling_device.sh    # 1 GPU, then 2 GPUs: ddp, fsdp, deepspeed;
#                                                              # the shipped recipe on every local GPU
#   PHASE=sharding bash tools/device/finetune_scaling_device.sh  # train.sharding's FSDP2 choices, ZeRO-3
#                                                              # prefetching a whole layer
#   PHASE=fsdpqkv bash tools/device/finetune_scaling_device.sh   # FSDP2 with and without fused q/k/v
#   PHASE=zero3 bash tools/device/finetune_scaling_device.sh     # ZeRO-3: frozen MLPs fetched whole, the
#                                                              # adapter kept whole, prefetch, DeepCompile
#   PHASE=lora bash tools/device/finetune_scaling_device.sh      # ZeRO-3: LoRA layers kept whole as one
#                                                              # module, twice each
#   PHASE=overlap bash tools/device/finetune_scaling_device.sh   # and ZeRO-3's fetches overlapped
#   PHASE=whole bash tools/device/finetune_scaling_device.sh     # zero3.json as shipped against PEFT's
#                                                              # modules, twice each
#   PHASE=unhook bash tools/device/finetune_scaling_device.sh    # ZeRO-3: hooks only where a module owns
#                                                              # a partitioned weight, against all hooked
#   PHASE=keep bash tools/device/finetune_scaling_device.sh      # ZeRO-3 keeping gathered weights until
#                                                              # their backward; compiled layers
#   PHASE=lean bash tools/device/finetune_scaling_device.sh      # ZeRO-3's optimizer step gathering again
#                                                              # only the trainable weights kept whole,
#                                                              # against DeepSpeed's step; and on 2 GPUs
#   PHASE=prefetch bash tools/device/finetune_scaling_device.sh  # ZeRO-3 with the lean step, prefetching one
#                                                              # or two MLPs ahead, twice each
#   PHASE=leanplus bash tools/device/finetune_scaling_device.sh  # ZeRO-3 as shipped, twice, against the
#                                                              # frozen MLPs whole and one MLP prefetched
#   PHASE=overlap2 bash tools/device/finetune_scaling_device.sh  # ZeRO-3 as shipped against its fetches on
#                                                              # a stream of their own, twice each
#   PHASE=epilogue bash tools/device/finetune_scaling_device.sh  # ZeRO-3 as shipped against DeepSpeed's
#                                                              # gradient epilogue, twice each
#   PHASE=four bash tools/device/finetune_scaling_device.sh      # ZeRO-3 as shipped against the fused
#                                                              # epilogue and one MLP prefetched (4 GPUs)
#   PHASE=zcompile bash tools/device/finetune_scaling_device.sh  # ZeRO-3 as shipped against its attention
#                                                              # compiled (sharding.zero3_compile_whole)
#   RUNS="1gpu ddp-4" ... runs those names only (see `runs_for` below)
#
# Carry .whl (pydantic, liger-kernel, deepspeed built with DS_BUILD_OPS=0, hjson); GPUVAL_COMMIT=SHA names the
# code in env.json (the device copy's git metadata can be stale). Writes under $OUT:
# PHASE/<run>.json (gpuval.bench/v1 of bench train, or train_summary.json of the shipped recipe),
# PHASE/log.txt, PHASE/env.json and PHASE/scaling.json (every run's tokens/s/GPU, its retention against the
# one-GPU run of the same precision in this call, peak memory, what each part decided).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
PHASE=${PHASE:-wide}
STEPS=${STEPS:-6}
UNTIMED=${UNTIMED:-3}
SHIPPED_STEPS=${SHIPPED_STEPS:-8}
CALL_S=${CALL_S:-590}  # the device call's limit: a run is not started with less than RUN_MIN_S left
RUN_MIN_S=${RUN_MIN_S:-75}
GPUS=${GPUS:-$(python3 -c "import torch; print(torch.cuda.device_count())")}
D="$OUT/$PHASE"
W=/tmp/gpuval-scaling-$PHASE
mkdir -p "$D" "$W"
exec > >(tee "$D/log.txt") 2>&1
COMMON=(--set steps="$STEPS" --set untimed_steps="$UNTIMED" --set lora.dropout=0.05)
# ZeRO-3 with eager layers (`auto`'s choice under deepspeed): compiled under ZeRO-3's parameter hooks the
# step ran at 27 % of one GPU on 4xH200 (results/2026-11-27-h200x4-finetune-scaling/)
ZERO3=(--set parallel=deepspeed --set deepspeed_config=configs/finetune/deepspeed/zero3.json --set step.compile=false)

runs_for() {  # the runs of a phase: NAME GPUS [bench train --set arguments...], one per line
  case "$1" in
    wide)  # in order of need: the call may end before the last ones (CALL_S)
      echo "1gpu 1"
      echo "ddp-$GPUS $GPUS --set parallel=ddp"
      echo "fsdp-$GPUS $GPUS --set parallel=fsdp"
      echo "deepspeed-$GPUS $GPUS ${ZERO3[*]}"
      echo "1gpu-fp8 1 --set step.precision=fp8-base"
      echo "ddp-fp8-$GPUS $GPUS --set parallel=ddp --set step.precision=fp8-base"
      # experiments: ZeRO-3 tuned (configs/finetune/deepspeed/zero3-optimized.json); ZeRO-3 compiled;
      # FSDP2 without split products (what auto's split products give under fsdp)
      echo "deepspeed-optimized-$GPUS $GPUS ${ZERO3[*]} --set deepspeed_config=configs/finetune/deepspeed/zero3-optimized.json"
      echo "deepspeed-compiled-$GPUS $GPUS ${ZERO3[*]} --set step.compile=true"
      echo "fsdp-whole-products-$GPUS $GPUS --set parallel=fsdp --set step.split_products=false"
      ;;
    sharding)  # train.sharding (finetune/parallel/sharding.py): FSDP2 keeping gathered weights (auto) against
      # resharding; ZeRO-3 with a prefetch bucket that holds a whole decoder layer (233 M parameters)
      echo "1gpu 1"
      echo "fsdp-$GPUS $GPUS --set parallel=fsdp"
      echo "fsdp-reshard-$GPUS $GPUS --set parallel=fsdp --set sharding.fsdp_reshard_after_forward=true"
      echo "ddp-$GPUS $GPUS --set parallel=ddp"
      echo "deepspeed-prefetch-$GPUS $GPUS ${ZERO3[*]} --set deepspeed_config=$W/zero3-prefetch.json"
      echo "fsdp-2 2 --set parallel=fsdp"
      echo "deepspeed-$GPUS $GPUS ${ZERO3[*]}"
      ;;
    fsdpqkv)  # FSDP2 with fused q/k/v (auto since its product became a module FSDP2 shards) against without
      echo "1gpu 1"
      echo "fsdp-$GPUS $GPUS --set parallel=fsdp"
      echo "fsdp-unfused-$GPUS $GPUS --set parallel=fsdp --set step.fuse_qkv=false"
      echo "ddp-$GPUS $GPUS --set parallel=ddp"
      echo "fsdp-2 2 --set parallel=fsdp"
      echo "ddp-2 2 --set parallel=ddp"
      ;;
    zero3)  # zero3.json keeps weights under 13 M elements whole on every rank (the adapter's, and Qwen2-7B's
      # q, k, v and o: persistence threshold). Runs named deepspeed-4/-2 were made while
      # train.sharding.zero3_frozen_leaves' auto was on (each layer's frozen MLP fetched whole; auto is off
      # since 2026-11-27, results/2026-11-27-h200x4-finetune-zero3/); against: weights under 2 M kept (the
      # adapter, k, v); the MLP module by module; on 2 GPUs; DeepCompile.
      echo "1gpu 1"
      echo "deepspeed-$GPUS $GPUS ${ZERO3[*]}"
      echo "deepspeed-persist2m-$GPUS $GPUS ${ZERO3[*]} --set deepspeed_config=$W/zero3-persist.json"
      echo "deepspeed-noleaves-$GPUS $GPUS ${ZERO3[*]} --set sharding.zero3_frozen_leaves=false"
      echo "deepspeed-2 2 ${ZERO3[*]}"
      echo "deepspeed-deepcompile-$GPUS $GPUS ${ZERO3[*]} --set deepspeed_config=$W/zero3-deepcompile.json"
      ;;
    lora)  # ZeRO-3 running each LoRA layer it keeps whole as one module (sharding.zero3_whole_lora) against
      # PEFT's five modules, with and without the frozen MLPs fetched whole; twice each, interleaved
      echo "1gpu 1"
      for round in 1 2; do
        echo "deepspeed-$GPUS-r$round $GPUS ${ZERO3[*]}"
        echo "deepspeed-whole-$GPUS-r$round $GPUS ${ZERO3[*]} --set sharding.zero3_whole_lora=true"
        echo "deepspeed-whole-leaves-$GPUS-r$round $GPUS ${ZERO3[*]} --set sharding.zero3_whole_lora=true --set sharding.zero3_frozen_leaves=true"
      done
      ;;
    whole)  # zero3.json as shipped (LoRA layers kept whole run as one module: auto) against PEFT's modules
      # (zero3_whole_lora=false), interleaved, twice each; then with the frozen MLPs fetched whole
      echo "1gpu 1"
      for round in 1 2; do
        echo "deepspeed-$GPUS-r$round $GPUS ${ZERO3[*]}"
        echo "deepspeed-peft-$GPUS-r$round $GPUS ${ZERO3[*]} --set sharding.zero3_whole_lora=false"
      done
      echo "deepspeed-leaves-$GPUS $GPUS ${ZERO3[*]} --set sharding.zero3_frozen_leaves=true"
      ;;
    overlap)  # LoRA layers run whole (above), with ZeRO-3's fetches on a stream of their own (overlap_comm),
      # with and without the frozen MLPs fetched whole; twice each, interleaved
      local whole="${ZERO3[*]} --set sharding.zero3_whole_lora=true"
      echo "1gpu 1"
      for round in 1 2; do
        echo "deepspeed-whole-$GPUS-r$round $GPUS $whole"
        echo "deepspeed-whole-overlap-$GPUS-r$round $GPUS $whole --set deepspeed_config=$W/zero3-overlap.json"
        echo "deepspeed-whole-leaves-overlap-$GPUS-r$round $GPUS $whole --set deepspeed_config=$W/zero3-overlap.json --set sharding.zero3_frozen_leaves=true"
      done
      ;;
    unhook)  # zero3.json as shipped (DeepSpeed's hooks only on modules that own a partitioned weight: auto)
      # against every module hooked (zero3_unhook_whole=false), and with the frozen MLPs fetched whole;
      # interleaved, twice each
      echo "1gpu 1"
      for round in 1 2; do
        echo "deepspeed-$GPUS-r$round $GPUS ${ZERO3[*]}"
        echo "deepspeed-hooked-$GPUS-r$round $GPUS ${ZERO3[*]} --set sharding.zero3_unhook_whole=false"
        echo "deepspeed-leaves-$GPUS-r$round $GPUS ${ZERO3[*]} --set sharding.zero3_frozen_leaves=true"
      done
      ;;
    keep)  # with hooks only where there is something to fetch (zero3_unhook_whole): ZeRO-3 keeping each
      # gathered weight from its forward to its backward (reuse distance and live parameters above the
      # model's 7.6 G elements: one all-gather of the base per step instead of two, FSDP2's
      # reshard_after_forward=false), with the frozen MLPs fetched whole, and with compiled layers (graph
      # breaks only at the hooked modules now)
      echo "1gpu 1"
      echo "deepspeed-$GPUS $GPUS ${ZERO3[*]}"
      echo "deepspeed-keep-$GPUS $GPUS ${ZERO3[*]} --set deepspeed_config=$W/zero3-keep.json"
      echo "deepspeed-keep-leaves-$GPUS $GPUS ${ZERO3[*]} --set deepspeed_config=$W/zero3-keep.json --set sharding.zero3_frozen_leaves=true"
      echo "deepspeed-compiled-leaves-$GPUS $GPUS ${ZERO3[*]} --set step.compile=true --set sharding.zero3_frozen_leaves=true"
      echo "deepspeed-keep-compiled-leaves-$GPUS $GPUS ${ZERO3[*]} --set deepspeed_config=$W/zero3-keep.json --set step.compile=true --set sharding.zero3_frozen_leaves=true"
      echo "deepspeed-keep-$GPUS-r2 $GPUS ${ZERO3[*]} --set deepspeed_config=$W/zero3-keep.json"
      echo "deepspeed-$GPUS-r2 $GPUS ${ZERO3[*]}"
      ;;
    lean)  # zero3.json as shipped (the optimizer step gathers again only the trainable weights kept whole,
      # by one all-gather: sharding.zero3_lean_step's auto) against DeepSpeed's step (every weight kept
      # whole released and gathered again, one all-gather each); interleaved, twice each; then 2 GPUs
      echo "1gpu 1"
      for round in 1 2; do
        echo "deepspeed-$GPUS-r$round $GPUS ${ZERO3[*]}"
        echo "deepspeed-stock-step-$GPUS-r$round $GPUS ${ZERO3[*]} --set sharding.zero3_lean_step=false"
      done
      [ "$GPUS" -gt 2 ] && echo "deepspeed-2 2 ${ZERO3[*]}"
      ;;
    prefetch)  # with the lean step: zero3.json's prefetch bucket (50 M elements: less than one of an MLP's
      # three weights, 68 M) against one holding a whole MLP (210 M: the next layer's MLP fetched while
      # this layer's attention runs) and 500 M (the sharding phase's); interleaved, twice each
      echo "1gpu 1"
      for round in 1 2; do
        echo "deepspeed-$GPUS-r$round $GPUS ${ZERO3[*]}"
        echo "deepspeed-prefetch-mlp-$GPUS-r$round $GPUS ${ZERO3[*]} --set deepspeed_config=$W/zero3-prefetch-mlp.json"
        echo "deepspeed-prefetch-$GPUS-r$round $GPUS ${ZERO3[*]} --set deepspeed_config=$W/zero3-prefetch.json"
      done
      ;;
    overlap2)  # with the lean step: ZeRO-3's fetches on a stream of their own (overlap_comm; zero3.json's
      # all-gathers otherwise wait for the compute queued before them), interleaved with zero3.json
      echo "1gpu 1"
      echo "deepspeed-$GPUS-r1 $GPUS ${ZERO3[*]}"
      echo "deepspeed-overlap-$GPUS-r1 $GPUS ${ZERO3[*]} --set deepspeed_config=$W/zero3-overlap.json"
      echo "deepspeed-$GPUS-r2 $GPUS ${ZERO3[*]}"
      echo "deepspeed-overlap-$GPUS-r2 $GPUS ${ZERO3[*]} --set deepspeed_config=$W/zero3-overlap.json"
      ;;
    epilogue)  # ZeRO-3 with the gradient bucket reduced by gpuval's fused epilogue (auto at cdd9d42, where
      # this phase ran; off since) against DeepSpeed's epilogue (zero3_fused_epilogue=false), twice each
      echo "1gpu 1"
      for round in 1 2; do
        echo "deepspeed-$GPUS-r$round $GPUS ${ZERO3[*]}"
        echo "deepspeed-ds-epilogue-$GPUS-r$round $GPUS ${ZERO3[*]} --set sharding.zero3_fused_epilogue=false"
      done
      ;;
    four)  # ZeRO-3 as shipped, twice, against the gradient bucket reduced by gpuval's fused epilogue (twice)
      # and one MLP prefetched ahead; interleaved
      echo "1gpu 1"
      echo "deepspeed-$GPUS-r1 $GPUS ${ZERO3[*]}"
      echo "deepspeed-epilogue-$GPUS-r1 $GPUS ${ZERO3[*]} --set sharding.zero3_fused_epilogue=true"
      echo "deepspeed-prefetch-mlp-$GPUS $GPUS ${ZERO3[*]} --set deepspeed_config=$W/zero3-prefetch-mlp.json"
      echo "deepspeed-$GPUS-r2 $GPUS ${ZERO3[*]}"
      echo "deepspeed-epilogue-$GPUS-r2 $GPUS ${ZERO3[*]} --set sharding.zero3_fused_epilogue=true"
      ;;
    leanplus)  # with the lean step (the host's step work gone), what is left of the hooks' host work: the
      # frozen MLPs fetched whole (30 hooked modules instead of 86), one MLP prefetched ahead, both
      echo "1gpu 1"
      echo "deepspeed-$GPUS-r1 $GPUS ${ZERO3[*]}"
      echo "deepspeed-leaves-$GPUS $GPUS ${ZERO3[*]} --set sharding.zero3_frozen_leaves=true"
      echo "deepspeed-prefetch-mlp-$GPUS $GPUS ${ZERO3[*]} --set deepspeed_config=$W/zero3-prefetch-mlp.json"
      echo "deepspeed-leaves-prefetch-mlp-$GPUS $GPUS ${ZERO3[*]} --set sharding.zero3_frozen_leaves=true --set deepspeed_config=$W/zero3-prefetch-mlp.json"
      echo "deepspeed-$GPUS-r2 $GPUS ${ZERO3[*]}"
      ;;
    zcompile)  # ZeRO-3 with each decoder layer's submodules whose weights are all kept whole compiled (the
      # attention and norms; the layer and its MLP eager for DeepSpeed's hooks) against as shipped
      echo "1gpu 1"
      echo "deepspeed-$GPUS $GPUS ${ZERO3[*]}"
      echo "deepspeed-compiled-whole-$GPUS $GPUS ${ZERO3[*]} --set sharding.zero3_compile_whole=true"
      ;;
    deepcompile)  # DeepSpeed's DeepCompile on zero3.json: the step as auto makes it, then with torch's
      # kernels (no Liger, no fused loss); a crash's traceback is kept (bench run's save_traceback)
      echo "deepspeed-deepcompile-torch-$GPUS $GPUS ${ZERO3[*]} --set step.kernels=torch --set deepspeed_config=$W/zero3-deepcompile.json"
      echo "deepspeed-deepcompile-$GPUS $GPUS ${ZERO3[*]} --set deepspeed_config=$W/zero3-deepcompile.json"
      echo "1gpu 1"
      ;;
    two)
      echo "1gpu 1"
      echo "ddp-2 2 --set parallel=ddp"
      echo "fsdp-2 2 --set parallel=fsdp"
      echo "deepspeed-2 2 ${ZERO3[*]}"
      [ "$GPUS" -gt 2 ] && echo "deepspeed-$GPUS $GPUS ${ZERO3[*]}"
      echo "shipped-nproc-$GPUS $GPUS"
      echo "shipped-torchrun-$GPUS $GPUS"
      [ "$GPUS" -gt 2 ] && echo "deepspeed-optimized-$GPUS $GPUS ${ZERO3[*]} --set deepspeed_config=configs/finetune/deepspeed/zero3-optimized.json"
      ;;
  esac
}

python3 - "$D/env.json" <<'PY'
import datetime, importlib.metadata as md, json, os, subprocess, sys, torch
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
json.dump({"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
           "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
           "commit": os.environ.get("GPUVAL_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or None,
           **{name: version(name) for name in ("transformers", "peft", "liger-kernel", "deepspeed", "flash-attn-4")}},
          open(sys.argv[1], "w"), indent=2)
print(open(sys.argv[1]).read())
PY
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm --format=csv

visible() {  # the first N GPUs
  python3 -c "print(','.join(str(i) for i in range($1)))"
}
timed() {  # NAME COMMAND...: run it, say its exit code and wall seconds
  local name=$1 start rc
  shift
  echo "=== $name: $*"
  start=$(date +%s.%N)
  "$@"
  rc=$?
  echo "=== $name exit=$rc wall_s=$(python3 -c "import time; print(round(time.time()-$start,1))")"
}

# ZeRO-3 prefetching one MLP ahead (the prefetch phase)
python3 - "$W/zero3-prefetch-mlp.json" <<'PY'
import json, sys
config = json.load(open("configs/finetune/deepspeed/zero3.json"))
config["zero_optimization"].update(stage3_prefetch_bucket_size=210_000_000)
json.dump(config, open(sys.argv[1], "w"), indent=2)
PY
# ZeRO-3 with prefetching of a whole decoder layer ahead (the sharding phase)
python3 - "$W/zero3-prefetch.json" <<'PY'
import json, sys
config = json.load(open("configs/finetune/deepspeed/zero3.json"))
config["zero_optimization"].update(stage3_prefetch_bucket_size=500_000_000, stage3_max_live_parameters=3_000_000_000)
json.dump(config, open(sys.argv[1], "w"), indent=2)
PY
# the zero3 phase's DeepSpeed configs: zero3.json with every weight under 2 M elements kept whole on every
# rank (LoRA's matrices, 229 k each, and the k/v projections, 1.8 M: 0.2 GB over 28 layers), alone and with
# a layer-sized prefetch; and with DeepCompile
python3 - "$W" <<'PY'
import json, sys
base = json.load(open("configs/finetune/deepspeed/zero3.json"))
def write(name, compile_section=None, **zero):
    config = json.loads(json.dumps(base))
    config["zero_optimization"].update(zero)
    if compile_section:
        config["compile"] = compile_section
    json.dump(config, open(f"{sys.argv[1]}/{name}.json", "w"), indent=2)
write("zero3-persist", stage3_param_persistence_threshold=2_000_000)
write("zero3-persist-prefetch", stage3_param_persistence_threshold=2_000_000,
      stage3_prefetch_bucket_size=500_000_000, stage3_max_live_parameters=3_000_000_000)
write("zero3-deepcompile", {"deepcompile": True})
write("zero3-overlap", overlap_comm=True)
write("zero3-keep", stage3_max_reuse_distance=20_000_000_000, stage3_max_live_parameters=20_000_000_000)
PY

if [ "$PHASE" = two ]; then  # the shipped recipe's data (synthetic Glaive records, prepared)
  python3 -m gpuval finetune synth --n 1500 --values train --output "$W/glaive.jsonl" >/dev/null
  python3 -m gpuval finetune prepare --input "$W/glaive.jsonl" --output "$W/data" >/dev/null
fi
SHIPPED=(--config configs/finetune/qwen2-7b-lora.yaml --set model=qwen2-7b-shape --set tokenizer=tiny
  --set data.train="$W/data/train.jsonl" --set data.eval=null --set train.max_steps="$SHIPPED_STEPS"
  --set train.optim.warmup_steps=2 --set train.save.every_steps=0 --set train.log.every_steps=1)

while read -r name n args; do
  [ -n "${RUNS:-}" ] && [[ " $RUNS " != *" $name "* ]] && continue
  [ "$n" -gt "$GPUS" ] && { echo "=== $name: needs $n GPUs, $GPUS here"; continue; }
  [ $((CALL_S - SECONDS)) -lt "$RUN_MIN_S" ] && { echo "=== $name: not started, $((CALL_S - SECONDS)) s left"; continue; }
  limit=150
  # compiling the whole model: what is left; DeepSpeed's JIT build of its op cannot parse the image's
  # arch list ("9.0a": "invalid literal for int() with base 10: '0a'"), so name the GPUs' own
  [[ $name == *deepcompile* ]] && limit=$(( CALL_S - SECONDS - 15 < 200 ? CALL_S - SECONDS - 15 : 200 )) \
    && export TORCH_CUDA_ARCH_LIST=9.0
  read -r -a extra <<<"${args:-}"
  if [[ $name == shipped-nproc-* ]]; then  # the shipped recipe as a user runs it: gpuval's own launcher
    timed "$name" timeout 150 python3 -m gpuval finetune train "${SHIPPED[@]}" --set output="$W/$name" \
      --nproc "$n" </dev/null
    cp "$W/$name/train_summary.json" "$D/$name.json" 2>/dev/null
  elif [[ $name == shipped-torchrun-* ]]; then  # and under torchrun
    timed "$name" timeout 150 torchrun --standalone --nproc_per_node="$n" -m gpuval finetune train \
      "${SHIPPED[@]}" --set output="$W/$name" </dev/null
    cp "$W/$name/train_summary.json" "$D/$name.json" 2>/dev/null
  elif [ "$n" = 1 ]; then
    timed "$name" env CUDA_VISIBLE_DEVICES=0 timeout "$limit" python3 -m gpuval bench train "${COMMON[@]}" \
      "${extra[@]}" --output "$D/$name.json" </dev/null  # stdin: the loop's list of runs
  else
    timed "$name" env CUDA_VISIBLE_DEVICES="$(visible "$n")" timeout "$limit" torchrun --standalone \
      --nproc_per_node="$n" -m gpuval bench train "${COMMON[@]}" "${extra[@]}" --output "$D/$name.json" \
      </dev/null
  fi
done < <(runs_for "$PHASE")

# tracebacks of this call's crashed runs (bench run's save_traceback): a machine kept warm between calls
# still holds an earlier call's, which are older than this call's env.json
find /tmp -maxdepth 1 -name 'gpuval-error-*.log' -newer "$D/env.json" -exec cp {} "$D/" \;
python3 tools/device/scaling_table.py "$D" | tee "$D/table.txt"
# one archive: the device tool brings back eight files at most
tar -czf "$OUT/$PHASE.tgz" -C "$OUT" "$PHASE" && find "$D" -type f ! -name table.txt -delete

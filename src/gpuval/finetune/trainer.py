"""The LoRA fine-tune loop: one function, read top to bottom (after karpathy/nanoGPT's train.py).

Runs as one process or under torchrun (gloo on CPU, NCCL on GPU). Every rank packs the whole training file
the same way and reads its own slice of each step's global batch, so the data order depends only on the
seed and the step — which is also all that resuming needs (checkpoint.py saves, finds and loads
checkpoints).

Across ranks (`train.parallel`), see parallel.py: `ddp` replicates the frozen base and all-reduces adapter
gradients; `fsdp` shards the base and the adapters per decoder layer with FSDP2 (`fully_shard`);
`deepspeed` hands the model to a DeepSpeed ZeRO engine configured by a JSON file.

Loss normalisation: a step's loss is Σ(per-token cross-entropy) / (label tokens of every micro-batch of the
step on every rank). The label-token count is all-reduced once per step, before the micro-batches; each
micro-batch back-propagates its summed loss divided by that count and multiplied by the world size, since
DDP and FSDP average gradients over ranks. So 2 ranks × k accumulation steps give the same gradients as
1 rank × 2k, and a long document weighs the same whichever micro-batch it lands in.

The step's batches (batches.py) are prepared and copied to the device while the GPU still runs the step
before, and each micro-batch's loss is divided by the step's label-token count as a device tensor: no
micro-batch waits for the host. The model the loop runs is built by step/build.py: the step's parts (fused
q/k/v, FP8 frozen base, split products, the sharding switches, checkpointing, compile, …; `train.step`,
`train.sharding`), each with one contract (parts.py, docs/step-parts.md), decided and applied in one
declared order; the run's first line says what each part resolved to and why.

Per step it logs loss, lr, grad norm, tokens/s per GPU and MFU (flops.py; GPU only) to the console and,
on rank 0, to TensorBoard under OUTPUT/tensorboard.
"""

from __future__ import annotations

import gc
import json
import random
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function

from gpuval.atomic import write_text_atomic
from gpuval.deadline import phase, step_expected_s
from gpuval.errors import UsageError
from gpuval.finetune.checkpoint import (
    FINAL_ADAPTER,
    load_checkpoint,
    resume_checkpoint,
    save_adapter_atomic,
    save_checkpoint,
)
from gpuval.finetune.config import FinetuneConfig
from gpuval.finetune.data.batches import step_batches_for
from gpuval.finetune.data.packing import pack_with_stats
from gpuval.finetune.data.prepare import read_jsonl
from gpuval.finetune.flops import peak_flops
from gpuval.finetune.model import load_tokenizer
from gpuval.finetune.parallel.modes import deepspeed_config
from gpuval.finetune.pending import PendingStep, StepLog
from gpuval.finetune.step.build import build_step, decide_parts, details_line, part_reports, step_context
from gpuval.finetune.template import encode
from gpuval.runtime import Runtime

TENSORBOARD = "tensorboard"
PROFILE = "profile"  # train.log.profile_steps: trace.json and operators.txt
# The step's phases, as ranges in the profile (tools/device/trace_summary.py charges idle time to them)
FORWARD, BACKWARD, OPTIMIZER_STEP = "gpuval: forward", "gpuval: backward", "gpuval: optimizer step"
PROFILE_AFTER = 2  # steps before profiling starts: allocator, kernel autotuning, compilation
SUMMARY_JSON = "train_summary.json"  # the summary train() returns: per-step log, throughput, memory
# how the step ran besides its parts' reports ("sharding": how the parallel mode moved the weights, the
# phrases of ctx.weight_notes, else None)
STEP_KEYS = ("sharding",)
# The summary's keys besides what the step's parts report (summary_keys()).
BASE_SUMMARY_KEYS = (
    "schema",
    "model",
    "device",
    "torch",
    "steps",
    "final_step",
    "resumed_from",
    "adapter",
    "world_size",
    "parallel",
    *STEP_KEYS,
    "global_batch_packs",
    "tokens_per_step",
    "packs",
    "packing_efficiency",
    "trainable_params",
    "peak_memory_gib",
)


def summary_keys() -> tuple[str, ...]:
    """Every key of train()'s summary: the base keys, then each part's declared reports (step.PARTS)."""
    return BASE_SUMMARY_KEYS + part_reports()


def step_summary_keys() -> tuple[str, ...]:
    """The summary keys that say how the step ran, after `auto` (bench train's params)."""
    return STEP_KEYS + part_reports()


def train(
    cfg: FinetuneConfig,
    runtime: Runtime,
    resume: bool = False,
    stop_after_step: int | None = None,
    save_adapter: bool = True,
    quiet: bool = False,
    max_packs: int | None = None,
) -> dict[str, Any]:
    """Train LoRA adapters as `cfg` says; returns a summary with the per-step log (keys: summary_keys()).

    `resume`: continue from the newest checkpoint under `cfg.output` (none there: a UsageError).
    `stop_after_step`: return after that step without saving the final adapter, as a killed run would
    (for tests of resuming). `save_adapter=False`: no final adapter (`gpuval bench train`); `quiet`: no
    console output. `max_packs`: train on the first N packs only, so every step sees the same data and its
    loss must fall (`gpuval bench train` passes one global batch).
    """
    t = cfg.train
    world, rank = runtime.world_size, runtime.rank
    device = runtime.device
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[cfg.dtype]
    output = Path(cfg.output)
    log = print if runtime.is_main and not quiet else _quiet

    # -- data: encode and pack the whole file, identically on every rank ---------------------------------
    tokenizer = load_tokenizer(cfg.tokenizer_source)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    packed = pack_with_stats(_encoded(cfg.data.train, tokenizer, cfg.data.max_seq_len), cfg.data.max_seq_len)
    packs = packed.packs[:max_packs]
    if not packs:
        raise UsageError(f"training data '{cfg.data.train}': no conversation with an assistant token")
    global_batch = t.global_batch(world)  # packed sequences per optimizer step
    tokens_per_step = global_batch * cfg.data.max_seq_len  # token slots (upper bound; packing fills most)

    # -- the step: its parts decided (before minutes of loading), then the model built (step/build.py) -
    torch.manual_seed(t.seed)  # the same LoRA init on every rank
    random.seed(t.seed)
    if t.parallel == "deepspeed":  # a missing or broken JSON is found before minutes of model loading
        deepspeed_config(cfg, world, dtype, runtime.on_gpu)
    ctx = step_context(cfg, runtime)
    log(decide_parts(ctx, runtime.is_main))
    max_token_id = max(max(p.input_ids) for p in packs)
    built = build_step(cfg, runtime, ctx, dtype, tokenizer, max_token_id, log)
    parallel, reports = built.parallel, built.reports
    # bf16 autocast on GPU only: CPU autocast is slow and the tests compare float32 runs bit-for-bit.
    autocast_on = runtime.on_gpu and dtype == torch.bfloat16
    mask_dtype = torch.bfloat16 if autocast_on else dtype

    step = 0  # optimizer steps done
    resumed_from = None
    if resume:
        checkpoint = resume_checkpoint(output)
        step = load_checkpoint(checkpoint, parallel, rank, world)
        resumed_from = str(checkpoint)

    log("gpuval finetune: effective config")
    log(json.dumps(cfg.model_dump(), indent=2))
    log(
        f"world {world} ({runtime.backend}, {device.type}, {t.parallel}) | packs {len(packs)} of "
        f"{packed.max_seq_len} tokens, {packed.efficiency:.0%} filled, {packed.dropped} dropped, "
        f"{packed.cut} cut | global batch {global_batch} packs = {tokens_per_step:,} token slots per step | "
        f"trainable params {built.trainable_count:,} | precision {reports['precision']}"
        + details_line(ctx)
        + "".join(f" | {note}" for note in ctx.weight_notes)
        + (f" | resumed at step {step} from {resumed_from}" if resumed_from else "")
    )

    # Made only now: bad data, a model that does not load or a refused checkpoint leave no event file behind.
    writer = _tensorboard(output) if t.log.tensorboard and runtime.is_main else None

    # -- the loop -------------------------------------------------------------------------------------------
    last_step = t.max_steps if stop_after_step is None else min(stop_after_step, t.max_steps)
    peak = peak_flops(torch.cuda.get_device_name(device)) if autocast_on else None
    record = StepLog(
        world,
        built.model.config,
        built.trainable_count,
        packs,
        peak,
        writer,
        t.log.every_steps,
        last_step,
        t.max_steps,
        log,
    )
    parallel.module.train()
    profiler = None
    step_batches = step_batches_for(
        packs,
        t.seed,
        rank,
        world,
        t.micro_batch_size,
        global_batch,
        cfg.data.max_seq_len,
        pad_id,
        device,
        varlen=ctx.layout.varlen,
        fixed_longest=ctx.compiled,
        whole_rows=ctx.layout.whole_rows,
        mask_dtype=mask_dtype,
    )
    loss_head, last_mlp = built.loss_head, built.last_mlp
    upcoming = step_batches(step) if step < last_step else None
    pending: PendingStep | None = None  # the last step's numbers, still on their way to the host
    step_seconds: list[float] = []  # host seconds of each step so far: the next step's deadline
    while upcoming is not None:
        with phase(f"train step {step + 1}", step_expected_s(step_seconds)):
            if t.log.profile_steps and step == PROFILE_AFTER and runtime.is_main:
                profiler = start_profiler(runtime.on_gpu, t.log.profile_stack)
            started = time.perf_counter()
            if runtime.on_gpu:  # GPU time of the step from CUDA events; the host clock on a CPU
                events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                events[0].record()
            current = upcoming
            # The loss denominator stays on the device: dividing by it makes no micro-batch wait for the host.
            label_tokens_on_device = current.counts[0].clamp(min=1).float()
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            for index, batch in enumerate(current.batches):
                batch = dict(batch)
                rows, targets = batch.pop("loss_rows"), batch.pop("loss_targets")
                # One row (packed documents flattened for varlen attention) and the head inside the model:
                # transformers applies it to the labelled positions alone (logits_to_keep takes indices).
                keep = loss_head.fused is None and batch["input_ids"].shape[0] == 1
                if keep:
                    batch["logits_to_keep"] = rows
                if last_mlp is not None:  # only the labelled rows' final hidden states are read below
                    last_mlp.use(rows)
                # Gradients are reduced across ranks only on the last micro-batch of the step.
                with parallel.accumulating(last=index == len(current.batches) - 1):
                    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast_on)
                    with autocast, record_function(FORWARD):
                        # logits, or the final hidden states when the loss head is fused (loss_head.py)
                        model_out = parallel.module(**batch).logits
                        token_losses_sum = loss_head(model_out, None if keep else rows, targets)
                    with record_function(BACKWARD):
                        # × world: the gradient reduction divides the summed gradients by the world size.
                        parallel.backward(token_losses_sum * world / label_tokens_on_device)
                if last_mlp is not None:
                    last_mlp.use(None)
                loss_sum += token_losses_sum.detach().double()
                if pending is not None:
                    # The last step is read only now, with this step's first micro-batch queued behind it:
                    # the GPU never waits while the host reads, logs and launches (every rank reads the same
                    # reduced numbers here, so on divergence every rank stops at the same point).
                    record.finish(pending)
                    pending = None
            # The next step's batches, made and copied while the GPU still runs this one.
            upcoming = step_batches(step + 1) if step + 1 < last_step else None

            lr = parallel.lr()
            with record_function(OPTIMIZER_STEP):
                grad_norm = parallel.step(t.optim.grad_clip)
            step += 1
            # The step's loss and this rank's count of adapter tensors no longer finite, in one reduction:
            # every rank sees the same two numbers, so every rank stops at the same step (none waits in a
            # collective).
            reduced = torch.stack([loss_sum, parallel.nonfinite_weights().to(loss_sum)])
            if profiler is not None and step == PROFILE_AFTER + t.log.profile_steps:
                stop_profiler(profiler, output / PROFILE, runtime.on_gpu)
                profiler = None
            dist.all_reduce(reduced)
            numbers = torch.cat([reduced, torch.as_tensor(grad_norm).to(reduced).reshape(1), current.counts])
            pending = PendingStep(
                step, lr, numbers, current.pack_indices, events if runtime.on_gpu else None, started
            )
        step_seconds.append(time.perf_counter() - started)
        if t.save.every_steps and step % t.save.every_steps == 0:
            record.finish(pending)  # a checkpoint is written only for a step known to be finite
            pending = None
            save_checkpoint(output, step, step * global_batch, parallel, runtime, t.save.keep_last, tokenizer)
    if pending is not None:
        record.finish(pending)

    if writer is not None:
        writer.close()
    adapter_dir = None
    if save_adapter and (stop_after_step is None or stop_after_step >= t.max_steps):
        adapter_dir = output / FINAL_ADAPTER
        weights = parallel.adapter_state()  # a collective: every rank takes part
        if runtime.is_main:
            save_adapter_atomic(parallel.peft_model, weights, adapter_dir, tokenizer)  # servable as it is
        runtime.barrier()
        log(f"adapter saved to {adapter_dir} (PEFT format, with the tokenizer and its tool chat template)")
    # Free the wrapped model (DDP's reducer, FSDP's hooks) while the process group still exists: left to
    # the garbage collector, it can be torn down after the caller destroys the group.
    trainable_count = built.trainable_count
    sharding = " | ".join(ctx.weight_notes) or None
    del parallel, built, loss_head, last_mlp, ctx
    gc.collect()
    summary = {
        "schema": "gpuval.finetune.train/v1",
        "model": cfg.model,
        "device": torch.cuda.get_device_name(device) if runtime.on_gpu else "cpu",
        "torch": torch.__version__,
        "steps": record.history,
        "final_step": step,
        "resumed_from": resumed_from,
        "adapter": str(adapter_dir) if adapter_dir else None,
        "world_size": world,
        "parallel": t.parallel,
        "sharding": sharding,
        **reports,  # each part's: activation checkpointing, compile, the kernels
        "global_batch_packs": global_batch,
        "tokens_per_step": tokens_per_step,
        "packs": len(packs),
        "packing_efficiency": packed.efficiency,
        "trainable_params": trainable_count,
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if runtime.on_gpu else None,
    }
    if runtime.is_main:
        write_text_atomic(output / SUMMARY_JSON, json.dumps(summary, indent=2) + "\n")
    return summary


def start_profiler(on_gpu: bool, with_stack: bool) -> Any:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    profiler = profile(activities=activities, with_stack=with_stack)
    profiler.__enter__()
    return profiler


def stop_profiler(profiler: Any, folder: Path, on_gpu: bool) -> None:
    """A Chrome/Perfetto trace of the profiled steps and a table of the operators by device time."""
    if on_gpu:
        torch.cuda.synchronize()
    profiler.__exit__(None, None, None)
    folder.mkdir(parents=True, exist_ok=True)
    profiler.export_chrome_trace(str(folder / "trace.json"))
    sort_by = "self_cuda_time_total" if on_gpu else "self_cpu_time_total"
    table = profiler.key_averages().table(sort_by=sort_by, row_limit=40, max_name_column_width=70)
    write_text_atomic(folder / "operators.txt", table + "\n")


def _encoded(path: str, tokenizer: Any, max_seq_len: int) -> list[Any]:
    return [encode(example, tokenizer, max_seq_len) for _line, example in read_jsonl(path, "training data")]


def _tensorboard(output: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UsageError(
            "train.log.tensorboard is on but the tensorboard package is missing: "
            "pip install tensorboard, or --set train.log.tensorboard=false"
        ) from None
    return SummaryWriter(log_dir=str(output / TENSORBOARD))


def _quiet(*_args: Any, **_kwargs: Any) -> None:
    pass

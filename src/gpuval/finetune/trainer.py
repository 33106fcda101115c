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
micro-batch waits for the host. On a GPU the base may run in FP8 (`train.precision`, fp8.py), q/k/v as one
product (`train.fuse_qkv`, fused_qkv.py) and the MLP's gate and up as one (`train.fuse_gate_up`,
fused_mlp.py).

Per step it logs loss, lr, grad norm, tokens/s per GPU and MFU (flops.py; GPU only) to the console and,
on rank 0, to TensorBoard under OUTPUT/tensorboard.
"""

from __future__ import annotations

import gc
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpuval.atomic import write_text_atomic
from gpuval.deadline import phase, step_expected_s
from gpuval.errors import RunError, UsageError
from gpuval.finetune.batches import step_batches_for
from gpuval.finetune.checkpoint import (
    FINAL_ADAPTER,
    load_checkpoint,
    resume_checkpoint,
    save_adapter_atomic,
    save_checkpoint,
)
from gpuval.finetune.config import FinetuneConfig
from gpuval.finetune.data import read_jsonl
from gpuval.finetune.flops import lora_flops_per_token, mfu, peak_flops
from gpuval.finetune.fp8 import (
    convert_frozen_linears,
    excluded_linears,
    resolve_exclude,
    resolve_precision,
)
from gpuval.finetune.fused_mlp import fuse_gate_up, products_in_fp8, resolve_fuse_gate_up
from gpuval.finetune.fused_qkv import fuse_qkv, resolve_fuse_qkv
from gpuval.finetune.kernels import (
    LastMlpRows,
    LossHead,
    apply_liger,
    missing_liger_note,
    resolve_attention,
    resolve_kernels,
    resolve_row_kernel,
    resolve_varlen_kernel,
    use_varlen_attention,
)
from gpuval.finetune.memory import choose_checkpointing, estimate_step_memory
from gpuval.finetune.model import apply_lora, load_model, load_tokenizer, token_ids
from gpuval.finetune.packed_dropout import resolve_dropout_kernel, use_packed_dropout
from gpuval.finetune.packing import pack_with_stats, packs_s_eff
from gpuval.finetune.parallel import decoder_layers, deepspeed_config, make_parallel
from gpuval.finetune.pending import PendingStep
from gpuval.finetune.split_products import resolve_split_products, split_products
from gpuval.finetune.template import encode
from gpuval.runtime import Runtime

TENSORBOARD = "tensorboard"
PROFILE = "profile"  # train.profile_steps: trace.json and operators.txt
PROFILE_AFTER = 2  # steps before profiling starts: allocator, kernel autotuning, compilation
SUMMARY_JSON = "train_summary.json"  # the summary train() returns: per-step log, throughput, memory


def train(
    cfg: FinetuneConfig,
    runtime: Runtime,
    resume: bool = False,
    stop_after_step: int | None = None,
    save_adapter: bool = True,
    quiet: bool = False,
    max_packs: int | None = None,
) -> dict[str, Any]:
    """Train LoRA adapters as `cfg` says; returns a summary with the per-step log.

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
    per_rank = t.micro_batch_size * t.grad_accum_steps  # packed sequences per rank per step
    global_batch = per_rank * world  # packed sequences per optimizer step
    tokens_per_step = global_batch * cfg.data.max_seq_len  # token slots (upper bound; packing fills most)

    # -- model: frozen base + LoRA adapters (same init on every rank: seeded here) -----------------------
    torch.manual_seed(t.seed)
    random.seed(t.seed)
    if t.parallel == "deepspeed":  # a missing or broken JSON is found before minutes of model loading
        deepspeed_config(cfg, world, dtype, runtime.on_gpu)
    gpu_name = torch.cuda.get_device_name(device) if runtime.on_gpu else None
    capability = torch.cuda.get_device_capability(device) if runtime.on_gpu else None
    precision = resolve_precision(
        t.precision,
        cfg.dtype,
        t.parallel,
        gpu_name,
        capability,
        t.fp8_fast_accum,
        t.fp8_input_grad,
        t.fp8_exclude,
    )
    fuse = resolve_fuse_qkv(t.fuse_qkv, runtime.on_gpu, t.parallel, cfg.lora.target_modules)
    fuse_mlp = resolve_fuse_gate_up(t.fuse_gate_up, runtime.on_gpu, t.parallel)
    attention = resolve_attention(t.attention, runtime.on_gpu)
    row_kernel = resolve_row_kernel(t.row_kernel, runtime.on_gpu)
    varlen_kernel = resolve_varlen_kernel(t.varlen_kernel, runtime.on_gpu)
    compiled = t.compile if t.compile != "auto" else (runtime.on_gpu and t.parallel != "deepspeed")
    kernels = resolve_kernels(t.kernels, runtime.on_gpu, compiled, t.loss_kernel)
    if (note := missing_liger_note(t.kernels, runtime.on_gpu, kernels, compiled)) and runtime.is_main:
        print(note, file=sys.stderr)  # said even when quiet (bench train): it costs speed
    # The fused loss takes the output head out of the model; only where the head is whole on every rank.
    fusable = kernels.startswith("liger") and t.parallel == "ddp" and not cfg.lora.trainable_tokens
    if t.loss_kernel != "auto" and not fusable:  # a choice that would be silently ignored
        raise UsageError(
            f"train.loss_kernel={t.loss_kernel} chooses the fused loss's kernel, and this run has no fused "
            f"loss (it needs train.kernels liger or liger-loss, here {kernels}, train.parallel ddp and no "
            "lora.trainable_tokens): set train.loss_kernel=auto"
        )
    model = load_model(cfg.model, dtype, device=device)
    model.config.use_cache = False
    if kernels == "liger":
        apply_liger(model)
    if attention == "varlen":
        use_varlen_attention(model, row_kernel, varlen_kernel)
    if max(max(p.input_ids) for p in packs) >= model.config.vocab_size:
        raise UsageError(
            f"tokenizer '{cfg.tokenizer_source}' makes ids beyond model '{cfg.model}''s vocabulary "
            f"({model.config.vocab_size}): pair the model with its own tokenizer"
        )
    model = apply_lora(
        model,
        cfg.lora.rank,
        cfg.lora.alpha,
        cfg.lora.dropout,
        cfg.lora.target_modules,
        token_ids(tokenizer, cfg.lora.trainable_tokens),
    )
    checkpointing, checkpointing_why = _checkpointing(cfg, model, runtime, dtype, fusable)
    log(f"activation checkpointing: {'on' if checkpointing else 'off'} ({checkpointing_why})")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(device)
    # After the move (the concatenated and FP8 weights are made on the device), before compiling.
    fp8 = precision == "fp8-base"
    layers = decoder_layers(model)  # the fusions below replace modules inside them, never the layers
    fp8_options = {
        "fast_accum": t.fp8_fast_accum,
        "input_grad_fp8": t.fp8_input_grad,
        "exclude": excluded_linears(layers, resolve_exclude(t.fp8_exclude)) if fp8 else frozenset(),
    }
    dropout_kernel = resolve_dropout_kernel(t.dropout_kernel, runtime.on_gpu, compiled)
    packed_dropouts = use_packed_dropout(layers) if dropout_kernel == "packed" else 0  # before fuse_qkv
    fused_attention = fuse_qkv(model, fp8=fp8, **fp8_options) if fuse else 0
    if t.fuse_qkv is True and not fused_attention:
        raise UsageError(
            "train.fuse_qkv=true: no attention layer has one plain LoRA adapter on each of q_proj, k_proj "
            "and v_proj: set train.fuse_qkv=false"
        )
    # Before the FP8 conversion: the fused gate/up quantises its concatenated weight itself, and its parts
    # are no bare nn.Linear for convert_frozen_linears to quantise again.
    fused_mlps = fuse_gate_up(model, fp8=fp8, **fp8_options) if fuse_mlp else 0
    if t.fuse_gate_up is True and not fused_mlps:
        raise UsageError(
            "train.fuse_gate_up=true: no MLP has frozen gate_proj and up_proj without LoRA on them "
            "(lora.target_modules): set train.fuse_gate_up=false"
        )
    if fp8:
        convert_frozen_linears(layers, **fp8_options)
    fp8_linears = products_in_fp8(layers)
    loss_kernel = "liger" if t.loss_kernel == "liger" else "chunked"
    loss_head = LossHead.fuse(model.get_base_model(), loss_kernel) if fusable else LossHead.plain()
    split = resolve_split_products(
        t.split_products, runtime.on_gpu, compiled, t.parallel
    )  # before LastMlpRows
    split_linears = split_products(layers, model.config.hidden_size, t.split_products is True) if split else 0
    last_mlp = LastMlpRows.attach(layers) if t.last_mlp_rows == "labelled" else None
    if compiled:  # per decoder layer, before FSDP wraps them (as torchtitan does)
        for layer in layers:
            layer.compile()
    trainable_count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    parallel = make_parallel(t.parallel, model, cfg, runtime, dtype)
    # bf16 autocast on GPU only: CPU autocast is slow and the tests compare float32 runs bit-for-bit.
    autocast_on = runtime.on_gpu and dtype == torch.bfloat16
    mask_dtype = torch.bfloat16 if autocast_on else dtype
    peak = peak_flops(torch.cuda.get_device_name(device)) if autocast_on else None

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
        f"trainable params {trainable_count:,} | precision {precision}"
        + (
            f" ({fp8_linears} frozen linears in FP8, {len(fp8_options['exclude'])} kept in bf16 by "
            "train.fp8_exclude)"
            if fp8
            else ""
        )
        + (f" | q/k/v fused in {fused_attention} attention layers" if fused_attention else "")
        + (f" | gate/up fused in {fused_mlps} MLPs" if fused_mlps else "")
        + (f" | resumed at step {step} from {resumed_from}" if resumed_from else "")
    )

    # Made only now: bad data, a model that does not load or a refused checkpoint leave no event file behind.
    writer = _tensorboard(output) if t.tensorboard and runtime.is_main else None

    # -- the loop -------------------------------------------------------------------------------------------
    history: list[dict[str, Any]] = []
    last_step = t.max_steps if stop_after_step is None else min(stop_after_step, t.max_steps)
    parallel.module.train()
    profiler = None
    step_batches = step_batches_for(
        packs,
        t.seed,
        rank,
        world,
        t.micro_batch_size,
        t.grad_accum_steps,
        cfg.data.max_seq_len,
        pad_id,
        device,
        varlen=attention == "varlen",
        fixed_longest=compiled,
        whole_rows=row_kernel != "varlen",
        mask_dtype=mask_dtype,
    )
    upcoming = step_batches(step) if step < last_step else None
    pending: PendingStep | None = None  # the last step's numbers, still on their way to the host
    model_config = model.config

    def finish(done: PendingStep) -> None:
        """Read a step's numbers (waiting for that step alone), stop on divergence, record and log it."""
        loss_sum, bad, grad_norm, label_tokens, real_tokens = done.values()
        loss = loss_sum / max(label_tokens, 1)
        if not math.isfinite(loss) or bad:
            problem = f"loss {loss:.6g}" + (
                f", {int(bad)} adapter tensor(s) with NaN/inf after the update" if bad else ""
            )
            raise RunError(
                f"training diverged at step {done.step}: {problem}; stopped without saving this step's "
                "adapter or checkpoint (lower train.lr, raise train.warmup_steps or check the data)"
            )
        elapsed_s = done.seconds()
        per_gpu = real_tokens / world / elapsed_s
        flops_per_token = lora_flops_per_token(
            model_config, trainable_count, packs_s_eff(packs[i] for i in done.pack_indices)
        )
        record = {
            "step": done.step,
            "loss": loss,
            "lr": done.lr,
            "grad_norm": grad_norm,
            "label_tokens": int(label_tokens),
            "tokens": int(real_tokens),
            "step_s": elapsed_s,
            "tokens_per_s": real_tokens / elapsed_s,
            "tokens_per_s_per_gpu": per_gpu,
            "flops_per_token": flops_per_token,
            "mfu": mfu(per_gpu, flops_per_token, peak),
        }
        history.append(record)
        if writer is not None:
            for key in ("loss", "lr", "grad_norm", "tokens_per_s_per_gpu", "mfu"):
                if record[key] is not None:
                    writer.add_scalar(f"train/{key}", record[key], done.step)
        if done.step % t.log_every_steps == 0 or done.step == last_step:
            log(
                f"step {done.step:5d}/{t.max_steps} | loss {loss:.4f} | lr {done.lr:.3e} | grad norm "
                f"{grad_norm:.3f} | {per_gpu:,.0f} tokens/s/GPU"
                + (f" | MFU {record['mfu']:.1%}" if record["mfu"] is not None else "")
            )

    step_seconds: list[float] = []  # host seconds of each step so far: the next step's deadline
    while upcoming is not None:
        with phase(f"train step {step + 1}", step_expected_s(step_seconds)):
            if t.profile_steps and step == PROFILE_AFTER and runtime.is_main:
                profiler = _start_profiler(runtime.on_gpu)
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
                    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast_on):
                        # logits, or the final hidden states when the loss head is fused (kernels.LossHead)
                        model_out = parallel.module(**batch).logits
                        token_losses_sum = loss_head(model_out, None if keep else rows, targets)
                    # × world: the gradient reduction divides the summed gradients by the world size.
                    parallel.backward(token_losses_sum * world / label_tokens_on_device)
                if last_mlp is not None:
                    last_mlp.use(None)
                loss_sum += token_losses_sum.detach().double()
                if pending is not None:
                    # The last step is read only now, with this step's first micro-batch queued behind it:
                    # the GPU never waits while the host reads, logs and launches (every rank reads the same
                    # reduced numbers here, so on divergence every rank stops at the same point).
                    finish(pending)
                    pending = None
            # The next step's batches, made and copied while the GPU still runs this one.
            upcoming = step_batches(step + 1) if step + 1 < last_step else None

            lr = parallel.lr()
            grad_norm = parallel.step(t.grad_clip)
            step += 1
            # The step's loss and this rank's count of adapter tensors no longer finite, in one reduction:
            # every rank sees the same two numbers, so every rank stops at the same step (none waits in a
            # collective).
            reduced = torch.stack([loss_sum, parallel.nonfinite_weights().to(loss_sum)])
            if profiler is not None and step == PROFILE_AFTER + t.profile_steps:
                _stop_profiler(profiler, output / PROFILE, runtime.on_gpu)
                profiler = None
            dist.all_reduce(reduced)
            numbers = torch.cat([reduced, torch.as_tensor(grad_norm).to(reduced).reshape(1), current.counts])
            pending = PendingStep(
                step, lr, numbers, current.pack_indices, events if runtime.on_gpu else None, started
            )
        step_seconds.append(time.perf_counter() - started)
        if t.save_every_steps and step % t.save_every_steps == 0:
            finish(pending)  # a checkpoint is written only for a step known to be finite
            pending = None
            save_checkpoint(output, step, step * global_batch, parallel, runtime, t.keep_last, tokenizer)
    if pending is not None:
        finish(pending)

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
    fused_loss = loss_head.fused is not None
    del parallel, model, loss_head
    gc.collect()
    summary = {
        "schema": "gpuval.finetune.train/v1",
        "model": cfg.model,
        "device": torch.cuda.get_device_name(device) if runtime.on_gpu else "cpu",
        "torch": torch.__version__,
        "steps": history,
        "final_step": step,
        "resumed_from": resumed_from,
        "adapter": str(adapter_dir) if adapter_dir else None,
        "world_size": world,
        "parallel": t.parallel,
        "attention": attention,
        "row_kernel": row_kernel,
        "varlen_kernel": varlen_kernel,
        "kernels": kernels,
        "fused_loss": fused_loss,
        "loss_kernel": loss_kernel if fused_loss else None,
        "activation_checkpointing": checkpointing,
        "compile": compiled,
        "precision": precision,
        "fused_qkv": fused_attention > 0,
        "last_mlp_rows": "labelled" if last_mlp is not None else "all",
        "fused_gate_up": fused_mlps > 0,
        "split_products": split_linears > 0,
        "dropout_kernel": "packed" if packed_dropouts else "torch",
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


def _start_profiler(on_gpu: bool) -> Any:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    profiler = profile(activities=activities)
    profiler.__enter__()
    return profiler


def _stop_profiler(profiler: Any, folder: Path, on_gpu: bool) -> None:
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
            "train.tensorboard is on but the tensorboard package is missing: "
            "pip install tensorboard, or --set train.tensorboard=false"
        ) from None
    return SummaryWriter(log_dir=str(output / TENSORBOARD))


def _quiet(*_args: Any, **_kwargs: Any) -> None:
    pass


def _checkpointing(
    cfg: FinetuneConfig, model: Any, runtime: Runtime, dtype: Any, fused: bool
) -> tuple[bool, str]:
    """Whether to recompute activations, and why: the config's choice, or for `auto` the step's memory
    estimate (finetune/memory.py) against this GPU's."""
    t = cfg.train
    if t.activation_checkpointing != "auto" or not runtime.on_gpu:
        return choose_checkpointing(t.activation_checkpointing, None, None)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    estimate = estimate_step_memory(
        model.config,
        base_parameters=sum(p.numel() for p in model.parameters()) - trainable,
        trainable_parameters=trainable,
        tokens_per_micro_batch=t.micro_batch_size * cfg.data.max_seq_len,
        dtype_bytes=torch.tensor([], dtype=dtype).element_size(),
        fused_loss=fused,
        weight_shards=runtime.world_size if t.parallel in ("fsdp", "deepspeed") else 1,
    )
    return choose_checkpointing(
        "auto", estimate, torch.cuda.get_device_properties(runtime.device).total_memory
    )

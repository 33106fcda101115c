"""The LoRA fine-tune loop: one function, read top to bottom (after karpathy/nanoGPT's train.py).

Runs as one process or under torchrun (DDP; gloo on CPU, NCCL on GPU). Every rank packs the whole training
file the same way and reads its own slice of each step's global batch, so the data order depends only on
the seed and the step — which is also all that resuming needs.

Loss normalisation: a step's loss is Σ(per-token cross-entropy) / (label tokens of every micro-batch of the
step on every rank). The label-token count is all-reduced once per step, before the micro-batches; each
micro-batch back-propagates its summed loss divided by that count and multiplied by the world size, since
DDP averages gradients over ranks. So 2 ranks × k accumulation steps give the same gradients as 1 rank ×
2k, and a long document weighs the same whichever micro-batch it lands in.

Not here yet: FSDP2 / DeepSpeed ZeRO-3, TensorBoard events, MFU in the progress line, evaluation loss.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpuval.errors import UsageError
from gpuval.finetune.config import FinetuneConfig
from gpuval.finetune.model import apply_lora, load_model, load_tokenizer
from gpuval.finetune.packing import collate, pack_with_stats
from gpuval.finetune.template import IGNORE_INDEX, encode
from gpuval.runtime import Runtime

CHECKPOINTS = "checkpoints"
CHECKPOINT_PREFIX = "step-"
FINAL_ADAPTER = "adapter"
TRAINER_STATE = "trainer_state.pt"  # optimizer, scheduler (rank 0 writes; identical on every rank)
STATE_JSON = "state.json"  # step, data position: readable without torch


def train(
    cfg: FinetuneConfig,
    runtime: Runtime,
    resume: bool = False,
    stop_after_step: int | None = None,
) -> dict[str, Any]:
    """Train LoRA adapters as `cfg` says; returns a summary with the per-step log.

    `resume`: continue from the newest checkpoint under `cfg.output` (none there: a UsageError).
    `stop_after_step`: return after that step without saving the final adapter, as a killed run would
    (for tests of resuming).
    """
    t = cfg.train
    world, rank = runtime.world_size, runtime.rank
    device = runtime.device
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[cfg.dtype]
    output = Path(cfg.output)
    log = print if runtime.is_main else _quiet

    # -- data: encode and pack the whole file, identically on every rank ---------------------------------
    tokenizer = load_tokenizer(cfg.model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    packed = pack_with_stats(_encoded(cfg.data.train, tokenizer, cfg.data.max_seq_len), cfg.data.max_seq_len)
    packs = packed.packs
    if not packs:
        raise UsageError(f"training data '{cfg.data.train}': no conversation with an assistant token")
    per_rank = t.micro_batch_size * t.grad_accum_steps  # packed sequences per rank per step
    global_batch = per_rank * world  # packed sequences per optimizer step
    tokens_per_step = global_batch * cfg.data.max_seq_len  # token slots (upper bound; packing fills most)

    # -- model: frozen base + LoRA adapters (same init on every rank: seeded here) -----------------------
    torch.manual_seed(t.seed)
    random.seed(t.seed)
    model = load_model(cfg.model, dtype)
    model.config.use_cache = False
    model = apply_lora(model, cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules)
    if t.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    trainable_count = sum(p.numel() for p in trainable)
    ddp_model: torch.nn.Module = model
    if world > 1:
        device_ids = [device.index] if runtime.on_gpu else None
        ddp_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    # bf16 autocast on GPU only: CPU autocast is slow and the tests compare float32 runs bit-for-bit.
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if runtime.on_gpu and dtype == torch.bfloat16 else None
    )
    mask_dtype = torch.bfloat16 if autocast is not None else dtype

    optimizer = torch.optim.AdamW(trainable, lr=t.lr, weight_decay=t.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, t.warmup_steps, t.max_steps)
    )

    step = 0  # optimizer steps done
    resumed_from = None
    if resume:
        checkpoint = latest_checkpoint(output)
        if checkpoint is None:
            raise UsageError(f"--resume: no checkpoint under '{output / CHECKPOINTS}'")
        step = load_checkpoint(checkpoint, model, optimizer, scheduler, rank)
        resumed_from = str(checkpoint)

    log("gpuval finetune: effective config")
    log(json.dumps(cfg.model_dump(), indent=2))
    log(
        f"world {world} ({runtime.backend}, {device.type}) | packs {len(packs)} of "
        f"{packed.max_seq_len} tokens, "
        f"{packed.efficiency:.0%} filled, {packed.dropped} dropped, {packed.cut} cut | global batch "
        f"{global_batch} packs = {tokens_per_step:,} token slots per step | trainable params "
        f"{trainable_count:,}" + (f" | resumed at step {step} from {resumed_from}" if resumed_from else "")
    )

    # -- the loop -------------------------------------------------------------------------------------------
    history: list[dict[str, Any]] = []
    last_step = t.max_steps if stop_after_step is None else min(stop_after_step, t.max_steps)
    ddp_model.train()
    while step < last_step:
        started = time.perf_counter()
        # This rank's packs of this step: a contiguous slice of the step's global batch.
        first = step * global_batch + rank * per_rank
        mine = [packs[i] for i in data_order(len(packs), t.seed, first, per_rank)]
        micro_batches = [mine[i : i + t.micro_batch_size] for i in range(0, per_rank, t.micro_batch_size)]
        # Padded to max_seq_len: one shape for every step (no per-shape kernel set-up on CPU or GPU).
        batches = [collate(mb, pad_id, cfg.data.max_seq_len, mask_dtype) for mb in micro_batches]
        # Label tokens of the whole step on every rank: the loss denominator (labels shift by one).
        counts = torch.tensor(
            [sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches), sum(map(len, mine))],
            dtype=torch.float64,
        )
        dist.all_reduce(counts)
        label_tokens, real_tokens = int(counts[0]), int(counts[1])

        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        for index, batch in enumerate(batches):
            batch = {key: value.to(device) for key, value in batch.items()}
            last_micro = index == len(batches) - 1
            # DDP all-reduces gradients only on the last micro-batch of the step.
            sync = nullcontext() if world == 1 or last_micro else ddp_model.no_sync()
            with sync:
                with autocast or nullcontext():
                    logits = ddp_model(
                        input_ids=batch["input_ids"],
                        attention_mask=batch["attention_mask"],
                        position_ids=batch["position_ids"],
                    ).logits
                token_losses_sum = F.cross_entropy(
                    logits[:, :-1].flatten(0, 1).float(),
                    batch["labels"][:, 1:].flatten(),
                    ignore_index=IGNORE_INDEX,
                    reduction="sum",
                )
                # × world: DDP divides the summed gradients by the world size.
                (token_losses_sum * world / max(label_tokens, 1)).backward()
            loss_sum += token_losses_sum.detach().double()

        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, t.grad_clip if t.grad_clip > 0 else math.inf)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1

        dist.all_reduce(loss_sum)
        loss = float(loss_sum) / max(label_tokens, 1)
        runtime.synchronize()
        elapsed_s = time.perf_counter() - started
        record = {
            "step": step,
            "loss": loss,
            "lr": lr,
            "grad_norm": float(grad_norm),
            "label_tokens": label_tokens,
            "tokens": real_tokens,
            "tokens_per_s": real_tokens / elapsed_s,
        }
        history.append(record)
        if step % t.log_every_steps == 0 or step == last_step:
            log(
                f"step {step:5d}/{t.max_steps} | loss {loss:.4f} | lr {lr:.3e} | grad norm "
                f"{record['grad_norm']:.3f} | {record['tokens_per_s']:,.0f} tokens/s"
            )
        if t.save_every_steps and step % t.save_every_steps == 0:
            save_checkpoint(
                output, step, step * global_batch, model, optimizer, scheduler, runtime, t.keep_last
            )

    adapter_dir = None
    if stop_after_step is None or stop_after_step >= t.max_steps:
        adapter_dir = output / FINAL_ADAPTER
        if runtime.is_main:
            _save_adapter_atomic(model, adapter_dir)
        runtime.barrier()
        log(f"adapter saved to {adapter_dir} (PEFT format)")
    return {
        "steps": history,
        "final_step": step,
        "resumed_from": resumed_from,
        "adapter": str(adapter_dir) if adapter_dir else None,
        "world_size": world,
        "global_batch_packs": global_batch,
        "tokens_per_step": tokens_per_step,
        "packs": len(packs),
        "packing_efficiency": packed.efficiency,
        "trainable_params": trainable_count,
    }


def lr_factor(step: int, warmup_steps: int, max_steps: int) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based): linear warm-up, then cosine to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def data_order(count: int, seed: int, start: int, length: int) -> list[int]:
    """Pack indices `start .. start+length` of an endless stream of epochs, each a seeded permutation of
    `count` packs (epoch e uses seed + e). A position in the stream is all a checkpoint needs to store."""
    indices: list[int] = []
    epoch_cache: dict[int, list[int]] = {}
    for position in range(start, start + length):
        epoch, offset = divmod(position, count)
        if epoch not in epoch_cache:
            generator = torch.Generator().manual_seed(seed + epoch)
            epoch_cache[epoch] = torch.randperm(count, generator=generator).tolist()
        indices.append(epoch_cache[epoch][offset])
    return indices


def _encoded(path: str, tokenizer: Any, max_seq_len: int) -> list[Any]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"training data '{path}': cannot read it ({exc.strerror or exc})") from None
    docs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            example = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"training data '{path}' line {number}: not JSON ({exc.msg})") from None
        docs.append(encode(example, tokenizer, max_seq_len))
    return docs


# -- checkpoints ------------------------------------------------------------------------------------------


def checkpoint_dirs(output: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a temp folder left by a killed save is not one)."""
    root = output / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]))


def latest_checkpoint(output: Path) -> Path | None:
    found = checkpoint_dirs(output)
    return found[-1] if found else None


def save_checkpoint(
    output: Path,
    step: int,
    data_position: int,
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    runtime: Runtime,
    keep_last: int,
) -> Path:
    """Adapter, optimizer, scheduler, every rank's RNG states and the data position, into a temp folder
    renamed into place once complete, so a kill mid-save never leaves a checkpoint that looks whole."""
    root = output / CHECKPOINTS
    final = root / f"{CHECKPOINT_PREFIX}{step:08d}"
    temp = root / f".tmp-{CHECKPOINT_PREFIX}{step:08d}"
    if runtime.is_main:
        shutil.rmtree(temp, ignore_errors=True)
        temp.mkdir(parents=True)
        model.save_pretrained(temp / FINAL_ADAPTER)
        torch.save(
            {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, temp / TRAINER_STATE
        )
        # data_order is a pure function of (seed, position): the position is all the data state there is.
        state = {"step": step, "data_position_packs": data_position, "world_size": runtime.world_size}
        (temp / STATE_JSON).write_text(json.dumps(state) + "\n", encoding="utf-8")
    runtime.barrier()
    torch.save(_rng_state(), temp / f"rng-rank{runtime.rank}.pt")  # dropout draws differ per rank
    runtime.barrier()
    if runtime.is_main:
        os.replace(temp, final)
        for old in checkpoint_dirs(output)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    runtime.barrier()
    return final


def load_checkpoint(
    checkpoint: Path, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any, rank: int
) -> int:
    """Restore what save_checkpoint wrote; returns the step to continue after."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    adapter_weights = load_file(str(checkpoint / FINAL_ADAPTER / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, adapter_weights)
    if getattr(result, "unexpected_keys", None):
        raise UsageError(f"checkpoint '{checkpoint}': adapter does not fit this model/config")
    trainer_state = torch.load(checkpoint / TRAINER_STATE, weights_only=False)
    optimizer.load_state_dict(trainer_state["optimizer"])
    scheduler.load_state_dict(trainer_state["scheduler"])
    rng_file = checkpoint / f"rng-rank{rank}.pt"
    if not rng_file.is_file():
        raise UsageError(
            f"checkpoint '{checkpoint}' has no RNG state for rank {rank}: resume with the same world size"
        )
    _set_rng_state(torch.load(rng_file, weights_only=False))
    return int(json.loads((checkpoint / STATE_JSON).read_text(encoding="utf-8"))["step"])


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])


def _save_adapter_atomic(model: Any, target: Path) -> None:
    temp = target.with_name(f".tmp-{target.name}")
    shutil.rmtree(temp, ignore_errors=True)
    model.save_pretrained(temp)
    if target.exists():
        shutil.rmtree(target)
    os.replace(temp, target)


def _quiet(*_args: Any, **_kwargs: Any) -> None:
    pass

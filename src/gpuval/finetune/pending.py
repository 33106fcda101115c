"""A finished optimizer step's numbers on their way to the host, and the run's per-step record (trainer.py).

Reading a CUDA tensor on the host (`.item()`, `float()`, `.tolist()`) waits for everything the GPU was given
before it, and while the host then logs and launches the next kernels the GPU idles: about 7 ms a step at
the step boundary in the 2026-11-26 profile (benchmarks/results/2026-11-26-h100x1-finetune-profile-final/).
The trainer instead copies a step's numbers to pinned host memory behind the step's work and reads them
once the next step's first micro-batch is queued, waiting for that copy alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from gpuval.errors import RunError
from gpuval.finetune.data.packing import packs_s_eff
from gpuval.finetune.flops import lora_flops_per_token, mfu


class PendingStep:
    """One optimizer step's numbers (loss sum, non-finite adapter tensors, grad norm, label and real tokens),
    copied to the host behind the step's work without waiting for it; `values()` waits for that copy alone
    (a CUDA event), not for what the GPU was given after it."""

    def __init__(
        self,
        step: int,
        lr: float,
        numbers: torch.Tensor,
        pack_indices: list[int],
        events: Any,
        started: float,
    ) -> None:
        """`numbers` on the step's device; `events`: the step's start and end CUDA events (the end is
        recorded here, behind the copy), None on a CPU, where `started` is the host clock's start."""
        self.step, self.lr, self.pack_indices = step, lr, pack_indices
        self.events = events if numbers.is_cuda else None
        if self.events is not None:
            self.host = torch.empty(numbers.shape, dtype=numbers.dtype, pin_memory=True)
            self.host.copy_(numbers, non_blocking=True)
            self.events[1].record()  # the step's end, and the moment the copy is done
        else:
            self.host = numbers.clone()
            self.host_seconds = time.perf_counter() - started

    def values(self) -> list[float]:
        if self.events is not None:
            self.events[1].synchronize()
        return [float(v) for v in self.host.tolist()]

    def seconds(self) -> float:
        if self.events is not None:
            return self.events[0].elapsed_time(self.events[1]) / 1e3
        return self.host_seconds


class StepLog:
    """The per-step record of a run: `finish(pending)` reads a step's numbers (waiting for that step alone),
    stops on divergence, and records and logs it (console every `every_steps` and at the last step;
    TensorBoard when a writer is given)."""

    def __init__(
        self,
        world: int,
        model_config: Any,
        trainable_count: int,
        packs: list[Any],
        peak_flops_per_s: float | None,
        writer: Any,
        every_steps: int,
        last_step: int,
        max_steps: int,
        log: Callable[[str], None],
    ) -> None:
        self.world, self.model_config, self.trainable_count = world, model_config, trainable_count
        self.packs, self.peak, self.writer = packs, peak_flops_per_s, writer
        self.every_steps, self.last_step, self.max_steps, self.log = every_steps, last_step, max_steps, log
        self.history: list[dict[str, Any]] = []

    def finish(self, done: PendingStep) -> None:
        loss_sum, bad, grad_norm, label_tokens, real_tokens = done.values()
        loss = loss_sum / max(label_tokens, 1)
        if not math.isfinite(loss) or bad:
            problem = f"loss {loss:.6g}" + (
                f", {int(bad)} adapter tensor(s) with NaN/inf after the update" if bad else ""
            )
            raise RunError(
                f"training diverged at step {done.step}: {problem}; stopped without saving this step's "
                "adapter or checkpoint (lower train.optim.lr, raise train.optim.warmup_steps or check the "
                "data)"
            )
        elapsed_s = done.seconds()
        per_gpu = real_tokens / self.world / elapsed_s
        flops_per_token = lora_flops_per_token(
            self.model_config, self.trainable_count, packs_s_eff(self.packs[i] for i in done.pack_indices)
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
            "mfu": mfu(per_gpu, flops_per_token, self.peak),
        }
        self.history.append(record)
        if self.writer is not None:
            for key in ("loss", "lr", "grad_norm", "tokens_per_s_per_gpu", "mfu"):
                if record[key] is not None:
                    self.writer.add_scalar(f"train/{key}", record[key], done.step)
        if done.step % self.every_steps == 0 or done.step == self.last_step:
            self.log(
                f"step {done.step:5d}/{self.max_steps} | loss {loss:.4f} | lr {done.lr:.3e} | grad norm "
                f"{grad_norm:.3f} | {per_gpu:,.0f} tokens/s/GPU"
                + (f" | MFU {record['mfu']:.1%}" if record["mfu"] is not None else "")
            )

"""A finished optimizer step's numbers on their way to the host (trainer.py).

Reading a CUDA tensor on the host (`.item()`, `float()`, `.tolist()`) waits for everything the GPU was given
before it, and while the host then logs and launches the next kernels the GPU idles: about 7 ms a step at
the step boundary in the 2026-11-26 profile (benchmarks/results/2026-11-26-h100x1-finetune-profile-final/).
The trainer instead copies a step's numbers to pinned host memory behind the step's work and reads them
once the next step's first micro-batch is queued, waiting for that copy alone.
"""

from __future__ import annotations

import time
from typing import Any

import torch


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

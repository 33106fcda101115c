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

    def __init__(self, step: int, lr: float, host: torch.Tensor, ready: Any, pack_indices: list[int]) -> None:
        self.step, self.lr, self.host, self.ready, self.pack_indices = step, lr, host, ready, pack_indices
        self.timing: Any = None
        self.ended = 0.0

    @classmethod
    def start(
        cls, step: int, lr: float, numbers: torch.Tensor, pack_indices: list[int], events: Any, started: float
    ) -> PendingStep:
        if numbers.is_cuda:
            host = torch.empty(numbers.shape, dtype=numbers.dtype, pin_memory=True)
            host.copy_(numbers, non_blocking=True)
            events[1].record()  # the step's end, and the moment the copy is done
            pending = cls(step, lr, host, events[1], pack_indices)
            pending.timing = events
        else:
            pending = cls(step, lr, numbers.clone(), None, pack_indices)
            pending.timing = started
            pending.ended = time.perf_counter()
        return pending

    def values(self) -> list[float]:
        if self.ready is not None:
            self.ready.synchronize()
        return [float(v) for v in self.host.tolist()]

    def seconds(self) -> float:
        if self.ready is not None:
            return self.timing[0].elapsed_time(self.timing[1]) / 1e3
        return self.ended - self.timing

"""AdamW over the trainable (adapter) parameters and its learning-rate schedule: linear warm-up, then
cosine decay to 0 — the `cosine` scheduler of transformers' Trainer (get_cosine_schedule_with_warmup), step
for step: warm-up step s (0-based) gets s / warmup_steps of the peak, so the first step's is 0 and the
peak comes at step warmup_steps (tests/finetune/test_finetune_equivalence.py trains with both and
compares)."""

from __future__ import annotations

import math
from typing import Any

import torch


def lr_factor(step: int, warmup_steps: int, max_steps: int) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based): linear warm-up from 0, then cosine
    to 0 (transformers' get_cosine_schedule_with_warmup; past max_steps it stays 0)."""
    if step < warmup_steps:
        return step / warmup_steps
    decay_steps = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer_and_schedule(params: list[torch.nn.Parameter], train: Any) -> tuple[Any, Any]:
    """AdamW (fused on CUDA: one kernel for every adapter tensor) and the LambdaLR schedule, as `train.optim`
    (lr, warm-up, weight decay) and `train.max_steps` say."""
    settings = train.optim
    fused = all(p.is_cuda for p in params) and bool(params)
    optimizer = torch.optim.AdamW(
        params, lr=settings.lr, weight_decay=settings.weight_decay, fused=fused or None
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, settings.warmup_steps, train.max_steps)
    )
    return optimizer, scheduler

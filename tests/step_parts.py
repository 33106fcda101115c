"""The tests' way to ask a step part for its decision (finetune/parts.py) without a model or a config
file: a StepContext from keyword settings."""

from __future__ import annotations

from typing import Any

from gpuval.finetune.config import ExperimentalSettings, LoraSettings, ShardingSettings, StepSettings
from gpuval.finetune.parts import Decision, Part, StepContext


def context(
    on_gpu: bool = False,
    parallel: str = "ddp",
    compiled: bool = False,
    dtype: str = "bfloat16",
    gpu: tuple[str, tuple[int, int]] | None = None,
    lora: dict[str, Any] | None = None,
    experimental: dict[str, Any] | None = None,
    decisions: dict[str, Decision] | None = None,
    tied_head: bool = False,
    sharding: dict[str, Any] | None = None,
    zero_stage: int | None = None,
    **step: Any,
) -> StepContext:
    """`step`: train.step settings by name (fp8={...} for its section); `gpu`: (name, capability);
    `sharding`: train.sharding settings by name; `zero_stage`: the DeepSpeed JSON's ZeRO stage."""
    return StepContext(
        step=StepSettings(**step),
        experimental=ExperimentalSettings(**(experimental or {})),
        lora=LoraSettings(**(lora or {})),
        parallel=parallel,
        on_gpu=on_gpu,
        compiled=compiled,
        dtype=dtype,
        gpu_name=gpu[0] if gpu else None,
        capability=gpu[1] if gpu else None,
        decisions=dict(decisions or {}),
        tied_head=tied_head,
        sharding=ShardingSettings(**(sharding or {})),
        zero_stage=zero_stage,
    )


def decide(part: Part, **settings: Any) -> Decision:
    """`part`'s decision in a context made from `settings` (see `context`)."""
    return part.decide(context(**settings))

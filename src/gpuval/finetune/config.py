"""The fine-tune config: strict YAML (an unknown key is an error naming it), with --set overrides.

    model: tiny                      # a local folder, a hub name, or `tiny` (the bundled model)
    dtype: bfloat16                  # weights of the frozen base model; LoRA adapters stay float32
    lora: {rank: 64, alpha: 128, dropout: 0.05, target_modules: [q_proj, k_proj, v_proj, o_proj]}
    data: {train: DIR/train.jsonl, eval: DIR/eval.jsonl, max_seq_len: 4096}
    train: {micro_batch_size: 2, grad_accum_steps: 4, lr: 2.0e-5, ...}
    output: runs/qwen2-7b-lora

Validation and error messages are those of profiles (gpuval.config.validate_model, apply_sets).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from gpuval.config import apply_sets, read_yaml, validate_model


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSettings(_Strict):
    rank: StrictInt = Field(64, ge=1, description="LoRA rank r")
    alpha: float = Field(128.0, gt=0, description="LoRA alpha; the update is scaled by alpha / rank")
    dropout: float = Field(0.05, ge=0, lt=1, description="dropout on the adapter input")
    target_modules: list[str] | Literal["all-linear"] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj"], description="linear module names, or 'all-linear'"
    )


class DataSettings(_Strict):
    train: str = Field(description="prepared JSONL ({'tools', 'messages'} per line), see `finetune prepare`")
    eval: str | None = Field(None, description="prepared JSONL for evaluation; not read by training")
    max_seq_len: StrictInt = Field(4096, ge=8, description="tokens per packed sequence")


class TrainSettings(_Strict):
    micro_batch_size: StrictInt = Field(2, ge=1, description="packed sequences per forward pass per rank")
    grad_accum_steps: StrictInt = Field(4, ge=1, description="micro-batches per optimizer step per rank")
    lr: float = Field(2e-5, gt=0, description="peak learning rate, reached after warm-up")
    warmup_steps: StrictInt = Field(10, ge=0, description="optimizer steps of linear warm-up from 0")
    max_steps: StrictInt = Field(100, ge=1, description="optimizer steps; cosine decays to 0 by then")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    grad_clip: float = Field(1.0, ge=0, description="max global grad norm (L2); 0 turns clipping off")
    seed: StrictInt = Field(0, description="seeds LoRA init, data order and dropout")
    activation_checkpointing: bool = Field(False, description="recompute activations in backward")
    save_every_steps: StrictInt = Field(0, ge=0, description="checkpoint period in steps; 0: none")
    keep_last: StrictInt = Field(2, ge=1, description="checkpoints kept; older ones are deleted")
    log_every_steps: StrictInt = Field(1, ge=1, description="print a progress line every N steps")


class FinetuneConfig(_Strict):
    model: str = Field("tiny", description="model folder, hub name, or 'tiny'")
    dtype: Literal["bfloat16", "float32"] = Field("bfloat16", description="base model weight dtype")
    lora: LoraSettings = LoraSettings()
    data: DataSettings
    train: TrainSettings = TrainSettings()
    output: str = Field(description="run folder: checkpoints/ and adapter/ go here")


def load_finetune_config(path: str | Path, assignments: list[str] | None = None) -> FinetuneConfig:
    """Read, apply `--set key.path=value` overrides, validate; any problem is one UsageError line."""
    config_path = Path(path)
    data = read_yaml(config_path, kind="config")
    apply_sets(data, assignments or [], dotted_maps=())
    return validate_model(FinetuneConfig, data, f"config '{config_path}'")


def finetune_config_from_dict(data: dict[str, Any], source: str = "config") -> FinetuneConfig:
    return validate_model(FinetuneConfig, data, source)

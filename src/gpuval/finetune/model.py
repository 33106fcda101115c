"""Model and tokenizer loading (a path, a hub name, or the bundled tiny model) and PEFT LoRA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gpuval.errors import UsageError
from gpuval.finetune.tiny import TINY_MODEL_DIR

TINY_NAME = "tiny"  # `model: tiny` in a config means the bundled folder
TINY_INIT_SEED = 0  # the bundled model has no weights: every build from its config is the same
ALL_LINEAR = "all-linear"  # PEFT's shorthand for every linear layer but the output head
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json")


def resolve_model(path_or_name: str | Path) -> str:
    """A local folder, the bundled tiny folder for `tiny`, or a hub name; a missing path is a UsageError."""
    text = str(path_or_name)
    if text == TINY_NAME:
        return str(TINY_MODEL_DIR)
    path = Path(text).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise UsageError(f"model path '{text}' has no config.json")
        return str(path)
    # "Qwen/Qwen2-7B-Instruct" is a hub name; anything else that is not on disk was meant as a path.
    looks_like_path = path.is_absolute() or text.startswith((".", "~")) or text.count("/") != 1
    if looks_like_path:
        raise UsageError(f"model path '{text}' does not exist")
    return text


def has_weights(path: str) -> bool:
    folder = Path(path)
    return folder.is_dir() and any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS)


def load_tokenizer(path_or_name: str | Path) -> Any:
    from transformers import AutoTokenizer

    source = resolve_model(path_or_name)
    try:
        return AutoTokenizer.from_pretrained(source)
    except OSError as exc:
        raise UsageError(f"tokenizer '{path_or_name}': {_first_line(exc)}") from None


def load_model(path_or_name: str | Path, dtype: torch.dtype = torch.bfloat16) -> Any:
    """`AutoModelForCausalLM.from_pretrained` where there are weights; a folder with only config.json (the
    bundled tiny model) gets `from_config` weights drawn with a fixed seed, without touching global RNG."""
    from transformers import AutoConfig, AutoModelForCausalLM

    source = resolve_model(path_or_name)
    try:
        if Path(source).is_dir() and not has_weights(source):
            config = AutoConfig.from_pretrained(source)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(TINY_INIT_SEED)
                model = AutoModelForCausalLM.from_config(config)
            return model.to(dtype)
        return AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except OSError as exc:
        raise UsageError(f"model '{path_or_name}': {_first_line(exc)}") from None


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """Last name components of the model's nn.Linear modules (`q_proj`, ...): what LoRA can target."""
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if _is_linear(module)})


def apply_lora(
    model: torch.nn.Module,
    rank: int,
    alpha: float,
    dropout: float,
    target_modules: list[str] | str,
) -> Any:
    """PEFT LoRA adapters on `target_modules` (names or "all-linear"); only adapter weights train."""
    from peft import LoraConfig, get_peft_model

    targets: list[str] | str
    if target_modules == ALL_LINEAR:
        targets = ALL_LINEAR
    else:
        targets = [target_modules] if isinstance(target_modules, str) else list(target_modules)
        available = linear_module_names(model)
        for name in targets:
            if name not in available:
                raise UsageError(
                    f"LoRA target module '{name}' is not in the model; its linear modules are: "
                    + ", ".join(available)
                )
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def _is_linear(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Linear)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__

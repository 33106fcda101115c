"""Model and tokenizer loading (a path, a hub name, or the bundled tiny model) and PEFT LoRA."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuval.errors import UsageError, first_line

if TYPE_CHECKING:
    import torch

TINY_NAME = "tiny"  # `model: tiny` in a config means the bundled folder
TINY_MODEL_DIR = Path(__file__).parent / "tiny_model"  # built by tools/tiny_model.py
SHAPE_SUFFIX = "-shape"  # `model: qwen2-7b-shape`: shapes/qwen2-7b/config.json, random weights
SHAPES_DIR = Path(__file__).parent / "shapes"
TINY_INIT_SEED = 0  # a folder with only config.json (a shape) builds the same weights every time
ALL_LINEAR = "all-linear"  # PEFT's shorthand for every linear layer but the output head
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json")


def resolve_model(path_or_name: str | Path) -> str:
    """A local folder, the bundled tiny folder for `tiny`, or a hub name; a missing path is a UsageError."""
    text = str(path_or_name)
    if text == TINY_NAME:
        return str(TINY_MODEL_DIR)
    if text.endswith(SHAPE_SUFFIX) and "/" not in text:
        folder = SHAPES_DIR / text[: -len(SHAPE_SUFFIX)]
        if not (folder / "config.json").is_file():
            known = ", ".join(sorted(p.name + SHAPE_SUFFIX for p in SHAPES_DIR.iterdir() if p.is_dir()))
            raise UsageError(f"model shape '{text}' is not bundled; known shapes: {known}")
        return str(folder)
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
    if Path(source).is_dir() and not any((Path(source) / name).is_file() for name in TOKENIZER_FILES):
        raise UsageError(
            f"model '{path_or_name}' has no tokenizer files; set `tokenizer:` in the config "
            "(`tiny` for the bundled one, or a folder)"
        )
    try:
        return AutoTokenizer.from_pretrained(source)
    except OSError as exc:
        raise UsageError(f"tokenizer '{path_or_name}': {first_line(exc)}") from None


def load_model(
    path_or_name: str | Path, dtype: torch.dtype | None = None, device: torch.device | None = None
) -> Any:
    """`AutoModelForCausalLM.from_pretrained` where there are weights; a folder with only config.json (the
    shapes) gets `from_config` weights drawn with a fixed seed, without touching the
    global RNG. `device`: where a weightless model is built (a 7B shape is initialised on the GPU in
    seconds; on the CPU in minutes); loaded weights stay on the CPU for the caller to move."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = torch.bfloat16 if dtype is None else dtype  # bfloat16 unless the caller names one
    source = resolve_model(path_or_name)
    try:
        if Path(source).is_dir() and not has_weights(source):
            config = AutoConfig.from_pretrained(source)
            build_on = device or torch.device("cpu")
            rng_devices = [build_on.index or 0] if build_on.type == "cuda" else []
            with torch.random.fork_rng(devices=rng_devices, device_type=build_on.type), build_on:
                torch.manual_seed(TINY_INIT_SEED)
                if build_on.type == "cpu":
                    model = AutoModelForCausalLM.from_config(config).to(dtype)  # as the tiny tests expect
                else:
                    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
            return model
        return AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except OSError as exc:
        raise UsageError(f"model '{path_or_name}': {first_line(exc)}") from None


def ties_output_head(path_or_name: str | Path) -> bool:
    """Whether the model's output head shares the input embeddings' weight (`tie_word_embeddings` in its
    config.json): read before the weights load."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(resolve_model(path_or_name))
    except OSError as exc:
        raise UsageError(f"model '{path_or_name}': {first_line(exc)}") from None
    return bool(getattr(config, "tie_word_embeddings", False))


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """Last name components of the model's nn.Linear modules (`q_proj`, ...): what LoRA can target."""
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if _is_linear(module)})


def apply_lora(
    model: torch.nn.Module,
    rank: int,
    alpha: float,
    dropout: float,
    target_modules: list[str] | str,
    trainable_token_ids: list[int] | None = None,
) -> Any:
    """PEFT LoRA adapters on `target_modules` (names or "all-linear"); only adapter weights train, plus the
    embedding rows of `trainable_token_ids` (PEFT TrainableTokens; a tied output head follows them)."""
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
        trainable_token_indices=list(trainable_token_ids) if trainable_token_ids else None,
    )
    return get_peft_model(model, config)


def token_ids(tokenizer: Any, tokens: list[str]) -> list[int]:
    """Vocabulary ids of whole tokens, given as the token (`<tool_call>`) or as the text it stands for
    (`}}\n`, which byte-level BPE spells `}}Ċ`); text that is not exactly one token is a UsageError."""
    ids = []
    for token in tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if not (isinstance(token_id, int) and tokenizer.convert_ids_to_tokens(token_id) == token):
            encoded = tokenizer(token, add_special_tokens=False)["input_ids"]
            if len(encoded) != 1:
                raise UsageError(
                    f"lora.trainable_tokens: {token!r} is not a single token of the tokenizer "
                    f"({len(encoded)} tokens)"
                )
            token_id = encoded[0]
        ids.append(token_id)
    return ids


def _is_linear(module: torch.nn.Module) -> bool:
    import torch

    return isinstance(module, torch.nn.Linear)

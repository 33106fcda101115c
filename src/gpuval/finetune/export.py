"""`gpuval finetune export`: a trained adapter as a folder a server loads as it is.

Without merging, the adapter folder is copied whole: PEFT weights and config, the tokenizer and the chat
template training rendered with (checkpoint.save_tokenizer). Merged, the base model named by the adapter
gets the adapter folded into its weights (PEFT `merge_and_unload`) and is written as one plain model
folder: safetensors weights, config, tokenizer and that chat template, loadable with
`AutoModelForCausalLM.from_pretrained` and servable by vLLM without LoRA support.

Either way the result appears whole or not at all: written into a temp folder beside DIR, flushed, then
renamed to DIR.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from gpuval.atomic import fsync_dir, fsync_tree
from gpuval.errors import UsageError, first_line
from gpuval.finetune.checkpoint import FINAL_ADAPTER, save_tokenizer
from gpuval.finetune.model import TOKENIZER_FILES, load_model, load_tokenizer, resolve_model

ADAPTER_CONFIG = "adapter_config.json"  # what makes a folder a PEFT adapter
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # PEFT's file name; gpuval saves safetensors only
BASE_KEY = "base_model_name_or_path"  # where PEFT records the model the adapter was trained on
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def find_adapter(source: Path) -> Path:
    """`source` itself when it is a PEFT adapter folder, else a fine-tune run folder's OUTPUT/adapter."""
    if not source.exists():
        raise UsageError(
            f"export: '{source}' does not exist; pass a fine-tune run folder or its adapter folder"
        )
    for candidate in (source, source / FINAL_ADAPTER):
        if (candidate / ADAPTER_CONFIG).is_file():
            check_adapter_weights(candidate)
            return candidate
    raise UsageError(
        f"export: '{source}' is not a PEFT adapter folder (no {ADAPTER_CONFIG}) nor a fine-tune run folder "
        f"holding one in {FINAL_ADAPTER}/"
    )


def check_adapter_weights(adapter: Path) -> None:
    """The weights file is there and its header reads: a broken one is refused before a model loads."""
    from safetensors import safe_open

    path = adapter / ADAPTER_WEIGHTS
    if not path.is_file():
        raise UsageError(f"export: adapter folder '{adapter}' has no {ADAPTER_WEIGHTS}")
    try:
        with safe_open(str(path), framework="pt"):
            pass
    except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError: any unreadable file is refused
        raise UsageError(f"export: adapter weights '{path}' cannot be read ({first_line(exc)})") from None


def base_model_of(adapter: Path) -> str:
    """The base model recorded in the adapter's config (a folder or a hub name)."""
    from gpuval.inputs import decode_json, read_input_text  # the input gate: regular file, UTF-8, bounded

    path = adapter / ADAPTER_CONFIG
    try:
        config = decode_json(read_input_text(path, "adapter config"))
    except ValueError as exc:
        raise UsageError(f"export: adapter config '{path}' is not JSON ({exc})") from None
    base = config.get(BASE_KEY) if isinstance(config, dict) else None
    if not isinstance(base, str) or not base:
        raise UsageError(f"export: adapter config '{path}' names no base model ({BASE_KEY}); pass --base")
    return base


def check_target(target: Path, adapter: Path) -> None:
    """DIR must be new (or an empty folder), and not inside the adapter it is made from."""
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise UsageError(f"export: '{target}' already exists and is not an empty folder; choose a new DIR")
    if target.resolve().is_relative_to(adapter.resolve()):
        raise UsageError(
            f"export: '{target}' lies inside the adapter folder '{adapter}'; choose a DIR outside it"
        )


def export(
    source: Path, target: Path, merge: bool = False, dtype: str = "bfloat16", base: str | None = None
) -> tuple[Path, str]:
    """Write the servable adapter (with `merge`: the merged model) of `source` to the new folder `target`.

    `source`: an adapter folder or a fine-tune run folder. `base`: the base model (default: the one the
    adapter's config names). `dtype`: weight dtype of the merged model. Returns the adapter folder read and
    the base model.
    """
    if dtype not in DTYPES:
        raise UsageError(f"export: dtype '{dtype}' is not one of {', '.join(DTYPES)}")
    adapter = find_adapter(source)
    check_target(target, adapter)
    if base is None:
        base = base_model_of(adapter)
        try:
            resolve_model(base)  # a run folder moved to another machine names a base that is not there
        except UsageError as exc:
            raise UsageError(f"export: the base model of adapter '{adapter}': {exc}; pass --base") from None
    temp = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    shutil.rmtree(temp, ignore_errors=True)
    try:
        if merge:
            temp.mkdir(parents=True)
            write_merged(adapter, base, DTYPES[dtype], temp)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(adapter, temp)
            if not has_tokenizer(adapter):
                save_tokenizer(servable_tokenizer(adapter, base), temp)
        fsync_tree(temp)
        os.replace(temp, target)  # rename(2) replaces an empty folder, never a full one
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return adapter, base


def write_merged(adapter: Path, base: str, dtype: torch.dtype, folder: Path) -> None:
    """The base with the adapter merged into its weights, the tokenizer and training's chat template."""
    from peft import PeftModel

    tokenizer = servable_tokenizer(adapter, base)  # a base without tokenizer fails before the model loads
    model = load_model(base, dtype)  # gpuval's loader: a folder, a hub name, `tiny` or a shape
    try:
        merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    except Exception as exc:  # noqa: BLE001 - shapes or names that differ: PEFT raises many kinds
        raise UsageError(
            f"export: adapter '{adapter}' does not fit base model '{base}' ({first_line(exc)})"
        ) from None
    merged.save_pretrained(folder)  # safetensors, config, generation config
    save_tokenizer(tokenizer, folder)


def has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def servable_tokenizer(adapter: Path, base: str) -> Any:
    """The tokenizer saved with the adapter (gpuval writes it there); for an adapter without one (an older
    gpuval), the base's, which save_tokenizer gives the template training used with it."""
    if not has_tokenizer(adapter):
        return load_tokenizer(base)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(adapter))
    except (OSError, ValueError) as exc:
        raise UsageError(f"export: tokenizer in '{adapter}': {first_line(exc)}") from None

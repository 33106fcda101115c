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
import tempfile
from pathlib import Path
from typing import Any

from gpuval.atomic import fsync_dir, fsync_tree, missing_folders, remove_empty_folders
from gpuval.errors import UsageError, first_line
from gpuval.finetune.checkpoint import FINAL_ADAPTER, save_tokenizer
from gpuval.finetune.export.adapter import ADAPTER_CONFIG, BASE_KEY, Adapter, check_adapter, check_fits
from gpuval.finetune.model import TOKENIZER_FILES, load_model, load_tokenizer, resolve_model

DTYPES = ("bfloat16", "float32")  # torch's names: torch is imported only to merge


def find_adapter(source: Path) -> Adapter:
    """`source` itself when it is a PEFT adapter folder, else a fine-tune run folder's OUTPUT/adapter;
    checked (export/adapter.py) before anything loads."""
    if not source.exists():
        raise UsageError(
            f"export: '{source}' does not exist; pass a fine-tune run folder or its adapter folder"
        )
    for candidate in (source, source / FINAL_ADAPTER):
        if os.path.lexists(candidate / ADAPTER_CONFIG):  # a config that is no file is refused by the check
            return check_adapter(candidate, "export")
    raise UsageError(
        f"export: '{source}' is not a PEFT adapter folder (no {ADAPTER_CONFIG}) nor a fine-tune run folder "
        f"holding one in {FINAL_ADAPTER}/"
    )


def base_model_of(adapter: Adapter) -> str:
    """The base model recorded in the adapter's config (a folder or a hub name)."""
    base = adapter.config.get(BASE_KEY)
    if not base:
        path = adapter.folder / ADAPTER_CONFIG
        raise UsageError(f"export: adapter config '{path}' names no base model ({BASE_KEY}); pass --base")
    return base


def log_folder(adapter: Path) -> Path:
    """Where export's third_party.log goes: beside the adapter folder (in a run folder, the run's own log),
    or the temp folder where that is read-only."""
    folder = adapter.parent
    return folder if os.access(folder, os.W_OK) else Path(tempfile.gettempdir())


def check_target(target: Path, adapter: Path) -> None:
    """DIR must be new (or an empty folder), not inside the adapter it is made from, and not under a file."""
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise UsageError(f"export: '{target}' already exists and is not an empty folder; choose a new DIR")
    if target.resolve().is_relative_to(adapter.resolve()):
        raise UsageError(
            f"export: '{target}' lies inside the adapter folder '{adapter}'; choose a DIR outside it"
        )
    above = next(folder for folder in target.parents if os.path.lexists(folder))  # "." or "/" at the latest
    if not above.is_dir():
        raise UsageError(
            f"export: '{target}' lies under '{above}', which is not a folder; choose another DIR"
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
    checked = find_adapter(source)
    adapter = checked.folder
    check_target(target, adapter)
    if base is None:
        base = base_model_of(checked)
        try:
            resolve_model(base)  # a run folder moved to another machine names a base that is not there
        except UsageError as exc:
            raise UsageError(f"export: the base model of adapter '{adapter}': {exc}; pass --base") from None
    if merge:
        check_fits(checked, base, "export")
    temp = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    shutil.rmtree(temp, ignore_errors=True)
    made = missing_folders(target.parent)  # a failed export takes away the folders it made for DIR
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temp.mkdir()  # an unwritable place is refused here, before a model loads
        if merge:
            write_merged(adapter, base, dtype, temp)
        else:
            shutil.copytree(adapter, temp, dirs_exist_ok=True)
            if not has_tokenizer(adapter):
                save_tokenizer(servable_tokenizer(adapter, base), temp)
        fsync_tree(temp)
        os.replace(temp, target)  # rename(2) replaces an empty folder, never a full one
        fsync_dir(target.parent)
    except BaseException as exc:
        shutil.rmtree(temp, ignore_errors=True)
        remove_empty_folders(made)
        if isinstance(exc, OSError):  # the adapter's files were all checked readable: writing failed
            where = exc.filename if exc.filename is not None else target
            raise UsageError(
                f"export: cannot write '{where}' ({exc.strerror or first_line(exc)}); "
                "choose a DIR in a writable folder with room"
            ) from None
        raise
    return adapter, base


def write_merged(adapter: Path, base: str, dtype: str, folder: Path) -> None:
    """The base with the adapter merged into its weights (`dtype`: one of DTYPES), the tokenizer and
    training's chat template."""
    import torch
    from peft import PeftModel

    tokenizer = servable_tokenizer(adapter, base)  # a base without tokenizer fails before the model loads
    model = load_model(base, getattr(torch, dtype))  # a folder, a hub name, `tiny` or a shape
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

"""A LoRA adapter folder checked against what gpuval and PEFT write, before any model loads.

`finetune eval` and `finetune export` read adapter folders that may come from elsewhere: copied by hand,
cut short by a full disk, edited, or written by another tool. PEFT meets a broken one late and in its own
words (a KeyError for an unknown `peft_type`, a state-dict RuntimeError for a rank unlike the weights, a hub
download for missing weights), after seconds or minutes of loading the base. Here the folder is read the
way PEFT will read it, without torch tensors or a model, and anything PEFT would trip on is one UsageError
naming the file and the field:

- the folder holds only regular files and folders (a FIFO would block a copy, a dangling link fail it);
- adapter_config.json is a JSON object (strict UTF-8 without a byte-order mark) of a LoRA adapter: the
  fields PEFT's LoraConfig reads have its types, and `r` and `lora_alpha` are there, as PEFT writes them;
- adapter_model.safetensors is there and its header reads (the safetensors library checks that the sizes,
  offsets and file length agree, so a truncated or overwritten file is caught here);
- every tensor is floating point, every `lora_A` has its `lora_B` and the reverse, both have the rank that
  `r` (or `rank_pattern`) gives their module, and trainable tokens have one row per token index.

`check_fits` then places every tensor on the base model, built on the meta device from its config.json
(no weights read): a wrong base, or a tensor name changed to another, is refused in a second rather than
after the base has loaded. PEFT's own load stays the net under both: the callers turn its failure into one
line too.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuval.errors import UsageError, first_line

ADAPTER_CONFIG = "adapter_config.json"  # what makes a folder a PEFT adapter
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # PEFT's file name; gpuval saves safetensors only
PICKLED_WEIGHTS = "adapter_model.bin"  # older PEFT's: a pickle, which gpuval never loads
BASE_KEY = "base_model_name_or_path"  # where PEFT records the model the adapter was trained on
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}  # safetensors' names of the dtypes PEFT saves weights in
PEFT_PREFIX = "base_model.model."  # PEFT's prefix of every saved key of a LoRA adapter
TOKENS_DELTA = ".trainable_tokens_delta"  # the rows of LoRA's trainable tokens (trainable_token_indices)


@dataclass(frozen=True)
class Adapter:
    folder: Path
    config: dict[str, Any]
    tensors: dict[str, tuple[str, list[int]]]  # name -> (safetensors dtype, shape), read from the header


def check_adapter(folder: Path, command: str = "") -> Adapter:
    """The adapter in `folder`, checked as the module docstring says; `command` ("export") starts every
    refusal, as the command's other messages do."""
    try:
        check_entries(folder)
        config = read_config(folder / ADAPTER_CONFIG)
        tensors = read_header(folder)
        check_fields(config, folder / ADAPTER_CONFIG)
        check_tensors(config, tensors, folder)
    except UsageError as exc:
        if not command:
            raise
        raise UsageError(f"{command}: {exc}") from None
    return Adapter(folder, config, tensors)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def check_entries(folder: Path) -> None:
    """Every entry under `folder` is a regular file or a folder, directly or through a link."""

    def unreadable(exc: OSError) -> None:
        raise UsageError(f"adapter folder '{folder}' cannot be read ({exc.strerror or exc}); check the path")

    if not folder.is_dir():
        raise UsageError(f"adapter folder '{folder}' is not a folder; pass the folder training wrote")
    for root, dirs, files in os.walk(folder, onerror=unreadable):  # a linked folder is listed, not entered
        for name in dirs + files:
            path = Path(root, name)
            shown = path.relative_to(folder)
            try:
                mode = path.stat().st_mode  # through a link: what a copy or a load would open
            except OSError as exc:
                raise UsageError(
                    f"adapter folder '{folder}' holds '{shown}', a link to nothing ({exc.strerror or exc}); "
                    "remove it or copy in the file it stood for"
                ) from None
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise UsageError(
                    f"adapter folder '{folder}' holds '{shown}', which is {_kind(mode)}, not a file; "
                    "remove it"
                )


def read_config(path: Path) -> dict[str, Any]:
    """adapter_config.json through the input gate (a regular file of strict UTF-8, bounded), as a JSON
    object."""
    from gpuval.inputs import decode_json, read_input_text

    where = f"adapter config '{path}'"
    if not path.exists():
        raise UsageError(
            f"{where} is missing: this is no PEFT adapter folder; pass the folder training wrote"
        )
    text = read_input_text(path, "adapter config")
    if text.startswith("\ufeff"):
        raise UsageError(f"{where} starts with a byte-order mark; save it as UTF-8 without one")
    if not text.strip():
        raise UsageError(f"{where} is empty; copy in the {ADAPTER_CONFIG} that training wrote")
    try:
        config = decode_json(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{where} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            f"copy in the {ADAPTER_CONFIG} that training wrote"
        ) from None
    except ValueError as exc:
        raise UsageError(f"{where} is not JSON gpuval reads ({exc}); fix it there") from None
    if not isinstance(config, dict):
        raise UsageError(f"{where} holds {_shown(config)}, not a JSON object of LoRA settings")
    return config


def read_header(folder: Path) -> dict[str, tuple[str, list[int]]]:
    """Name -> (dtype, shape) of every tensor in the weights file, from its header alone."""
    from safetensors import safe_open

    path = folder / ADAPTER_WEIGHTS
    if not path.is_file():
        pickled = (folder / PICKLED_WEIGHTS).exists()
        raise UsageError(
            f"adapter folder '{folder}' has no {ADAPTER_WEIGHTS}"
            + (f" ({PICKLED_WEIGHTS} is a pickle, which gpuval does not load)" if pickled else "")
            + "; copy in the weights training wrote"
        )
    try:
        # numpy's side: the header alone is read, with no tensor made, and torch is not imported for it
        with safe_open(str(path), framework="numpy") as weights:
            tensors = {}
            for name in weights.keys():  # noqa: SIM118 - safe_open has keys(), no __iter__
                part = weights.get_slice(name)
                tensors[name] = (part.get_dtype(), list(part.get_shape()))
    except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError: any unreadable file is refused
        raise UsageError(
            f"adapter weights '{path}' cannot be read ({first_line(exc)}); copy in the file training wrote"
        ) from None
    if not tensors:
        raise UsageError(f"adapter weights '{path}' hold no tensor; copy in the file training wrote")
    return tensors


# --- adapter_config.json ----------------------------------------------------------------------------------


def _whole(least: int) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= least


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _maps_to(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, dict) and all(check(item) for item in value.values())


def _or_null(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _token_rows(value: Any) -> bool:
    return isinstance(value, list) and all(_whole(0)(item) for item in value)


# The fields of PEFT's LoraConfig that shape what PEFT builds, with the values it accepts; `r` and
# `lora_alpha` must be there (PEFT always writes them), the others may be left out.
FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "r": (_whole(1), "a whole number of at least 1 (the LoRA rank)"),
    "lora_alpha": (_number, "a finite number"),
    "target_modules": (
        _or_null(lambda v: isinstance(v, str) or (_names(v) and bool(v))),
        "a module name, a list of them, or null",
    ),
    "rank_pattern": (_or_null(_maps_to(_whole(1))), "an object of module patterns to ranks of at least 1"),
    "alpha_pattern": (_or_null(_maps_to(_number)), "an object of module patterns to finite numbers"),
    BASE_KEY: (_or_null(lambda v: isinstance(v, str)), "a model folder or hub name"),
    "task_type": (_or_null(lambda v: isinstance(v, str)), "a PEFT task type such as CAUSAL_LM"),
    "bias": (lambda v: v in ("none", "all", "lora_only"), '"none", "all" or "lora_only"'),
    "lora_dropout": (lambda v: _number(v) and 0 <= v <= 1, "a number from 0 to 1"),
    "fan_in_fan_out": (lambda v: isinstance(v, bool), "true or false"),
    "use_dora": (lambda v: isinstance(v, bool), "true or false"),
    "use_rslora": (lambda v: isinstance(v, bool), "true or false"),
    "inference_mode": (lambda v: isinstance(v, bool), "true or false"),
    "lora_bias": (lambda v: isinstance(v, bool), "true or false"),
    "modules_to_save": (_or_null(_names), "a list of module names, or null"),
    "layers_to_transform": (
        _or_null(lambda v: _whole(0)(v) or _token_rows(v)),
        "a layer index, a list of them, or null",
    ),
    "layers_pattern": (
        _or_null(lambda v: isinstance(v, str) or _names(v)),
        "a name, a list of them, or null",
    ),
    "trainable_token_indices": (
        _or_null(lambda v: _token_rows(v) or _maps_to(_token_rows)(v)),
        "a list of token ids, an object of module names to such lists, or null",
    ),
}
REQUIRED = ("r", "lora_alpha")


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def check_fields(config: dict[str, Any], path: Path) -> None:
    where = f"adapter config '{path}'"
    kind = config.get("peft_type")
    if kind != "LORA":
        found = "has no peft_type" if "peft_type" not in config else f"has peft_type {_shown(kind)}"
        raise UsageError(f'{where} {found}: gpuval reads LoRA adapters ("peft_type": "LORA") only')
    for field in REQUIRED:
        if field not in config:
            raise UsageError(f"{where} has no '{field}'; copy in the {ADAPTER_CONFIG} that training wrote")
    for field, (valid, expected) in FIELDS.items():
        if field in config and not valid(config[field]):
            raise UsageError(
                f"{where}: '{field}' is {_shown(config[field])}, expected {expected}; fix it there"
            )
    for pattern in config.get("rank_pattern") or {}:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise UsageError(
                f"{where}: rank_pattern key {_shown(pattern)} is not a regular expression ({exc}); "
                "fix it there"
            ) from None


# --- the weights against the config ---------------------------------------------------------------------


def rank_of(module: str, config: dict[str, Any]) -> int:
    """The rank PEFT gives `module` (a name as the base model's named_modules() gives it): the first
    `rank_pattern` key that matches its end, as peft.utils.other.get_pattern_key matches, else `r`."""
    patterns = config.get("rank_pattern") or {}
    for pattern, rank in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return rank
    return config["r"]


# LoRA's two factors, in each key form PEFT saves them: lora_A is (rank, in), lora_B is (out, rank).
PAIRS = ((".lora_A.weight", ".lora_B.weight"), (".lora_embedding_A", ".lora_embedding_B"))


def check_tensors(config: dict[str, Any], tensors: dict[str, tuple[str, list[int]]], folder: Path) -> None:
    where = f"adapter weights '{folder / ADAPTER_WEIGHTS}'"
    for name, (dtype, _shape) in tensors.items():
        if not name.startswith(PEFT_PREFIX):
            raise UsageError(
                f"{where}: tensor '{name}' does not start with '{PEFT_PREFIX}' as every tensor PEFT saves "
                "does; the file is damaged: copy in the one training wrote"
            )
        if dtype not in FLOAT_DTYPES:
            raise UsageError(
                f"{where}: tensor '{name}' is {dtype}, not floating point; retrain or copy it again"
            )
    for a_suffix, b_suffix in PAIRS:
        for name, (_dtype, shape) in tensors.items():
            for suffix, partner_suffix, axis in ((a_suffix, b_suffix, 0), (b_suffix, a_suffix, 1)):
                if not name.endswith(suffix):
                    continue
                stem = name.removesuffix(suffix)
                if stem + partner_suffix not in tensors:
                    raise UsageError(
                        f"{where}: tensor '{name}' has no '{stem + partner_suffix}' beside it; "
                        "the file is damaged: copy in the one training wrote"
                    )
                rank = rank_of(stem.removeprefix(PEFT_PREFIX), config)
                if len(shape) < 2 or shape[axis] != rank:
                    raise UsageError(
                        f"{where}: tensor '{name}' has shape {shape}, not rank {rank} as "
                        f"{ADAPTER_CONFIG} says; the config and the weights are of different adapters"
                    )
    check_token_rows(config.get("trainable_token_indices"), tensors, where)


def check_token_rows(indices: Any, tensors: dict[str, tuple[str, list[int]]], where: str) -> None:
    """Trainable-tokens deltas are there exactly when `trainable_token_indices` names token ids, each
    with a row per id of its module (PEFT would leave out a delta its config does not name, silently)."""
    deltas = {name: shape for name, (_dtype, shape) in tensors.items() if name.endswith(TOKENS_DELTA)}
    if bool(deltas) != bool(indices):
        held = "hold trainable-token rows" if deltas else f"hold no '*{TOKENS_DELTA}' tensor"
        named = "names none in" if deltas else "names some in"
        raise UsageError(
            f"{where} {held}, yet {ADAPTER_CONFIG} {named} trainable_token_indices; the config and the "
            "weights are of different adapters"
        )
    for name, shape in deltas.items():
        # a list is the input embeddings' ids (and a tied output head's); an object names each module
        rows = indices if isinstance(indices, list) else _rows_for(name, indices)
        if rows is not None and (len(shape) != 2 or shape[0] != len(rows)):
            raise UsageError(
                f"{where}: tensor '{name}' has shape {shape}, not {len(rows)} rows for the token ids "
                f"{ADAPTER_CONFIG} names; the config and the weights are of different adapters"
            )


def _rows_for(name: str, indices: dict[str, list[int]]) -> list[int] | None:
    module = name.removesuffix(TOKENS_DELTA).removesuffix(".token_adapter")
    return next((rows for key, rows in indices.items() if module.endswith(key)), None)


# --- the weights against the base model -----------------------------------------------------------------


def check_fits(adapter: Adapter, base: str, command: str = "") -> None:
    """Every tensor of `adapter` has a place of its width in the base model `base` (a folder, a hub name,
    `tiny` or a shape), found on the base built on the meta device from its config.json: no weight is
    read, so a wrong base is refused in a second, before the minutes its weights may take to load."""
    model = _meta_model(base)
    if model is None:
        return
    modules = dict(model.named_modules())
    for name, (_dtype, shape) in adapter.tensors.items():
        problem = _misfit(name.removeprefix(PEFT_PREFIX), shape, modules, model)
        if problem:
            start = f"{command}: " if command else ""
            raise UsageError(
                f"{start}adapter '{adapter.folder}' does not fit base model '{base}': tensor '{name}' "
                f"{problem}; use the base it was trained on"
            )


def _meta_model(base: str) -> Any:
    """The base model's modules without weights, or None where transformers cannot build it from its
    config alone (remote code, another kind of model): PEFT's load is then the only check."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gpuval.finetune.model import resolve_model

    source = resolve_model(base)  # a base that is not there: its own UsageError
    try:
        config = AutoConfig.from_pretrained(source)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - transformers raises many kinds; loading the model says it better
        return None


# Where each kind of LoRA tensor sits on its module, and which width of the module's weight (out, in) its
# shape repeats: lora_A is (rank, in), lora_B (out, rank); an embedding's A is (rank, vocabulary) and its
# B (width, rank), against a weight of (vocabulary, width); a trainable-tokens delta holds whole rows.
PLACES = (
    (".lora_A.weight", 1, 1),
    (".lora_B.weight", 0, 0),
    (".lora_B.bias", 0, 0),
    (".lora_embedding_A", 1, 0),
    (".lora_embedding_B", 0, 1),
    (".lora_magnitude_vector", 0, 0),
    (".token_adapter" + TOKENS_DELTA, 1, 1),
)


def _misfit(path: str, shape: list[int], modules: dict[str, Any], model: Any) -> str | None:
    for suffix, axis, weight_axis in PLACES:
        if not path.endswith(suffix):
            continue
        module = path.removesuffix(suffix)
        if module not in modules:
            return f"belongs to module '{module}', which the base model does not have"
        weight = getattr(modules[module], "weight", None)
        width = None if weight is None or weight.dim() < 2 else weight.shape[weight_axis]
        if width is not None and (len(shape) <= axis or shape[axis] != width):
            return f"has shape {shape}, where module '{module}' of the base model is {width} wide"
        return None
    try:  # a whole module PEFT saved (modules_to_save, a resized embedding): a parameter of the base
        expected = list(model.get_parameter(path).shape)
    except AttributeError:
        return "has no place in the base model"
    return None if expected == shape else f"has shape {shape}, where the base model's is {expected}"

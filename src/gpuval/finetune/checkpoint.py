"""Checkpoints of the fine-tune loop (trainer.py): save, find, resume and load them.

A checkpoint is a folder `OUTPUT/checkpoints/step-NNNNNNNN` holding the adapter (PEFT format), the
optimizer and scheduler state (how depends on `train.parallel`: parallel.py), every rank's RNG state as
JSON and the data position. Nothing in it is unpickled when resuming, and a save is atomic: written into a
temp folder, flushed, then renamed into place.

Every adapter folder gpuval writes (`OUTPUT/adapter` and each checkpoint's) also holds the tokenizer and, as
its chat template, the template training rendered with (save_tokenizer): a server reading that folder
shows the model its tools as training did.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuval.atomic import fsync_dir, fsync_tree
from gpuval.errors import UsageError
from gpuval.finetune.template import chat_template_for
from gpuval.runtime import Runtime

if TYPE_CHECKING:  # torch is imported where it is used: an export refused for bad input never loads it
    import torch

CHECKPOINTS = "checkpoints"
CHECKPOINT_PREFIX = "step-"
FINAL_ADAPTER = "adapter"
STATE_JSON = "state.json"  # step, data position: readable without torch
RNG_JSON = "rng-rank{rank}.json"  # every RNG state of one rank as plain JSON: nothing to unpickle
CHECKPOINT_NAME = re.compile(rf"{CHECKPOINT_PREFIX}(\d+)")


def checkpoint_dirs(output: Path) -> list[Path]:
    """Complete checkpoints (folders named step-NNNNNNNN), oldest first. A temp folder left by a killed save
    is not one, nor is anything else (never pruned either: gpuval deletes only what it wrote)."""
    root = output / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and CHECKPOINT_NAME.fullmatch(p.name)]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]))


def latest_checkpoint(output: Path) -> Path | None:
    found = checkpoint_dirs(output)
    return found[-1] if found else None


def resume_checkpoint(output: Path) -> Path:
    """The checkpoint --resume continues from; a foreign `step-*` entry beside them is a UsageError, since
    which checkpoint is newest is then unclear."""
    root = output / CHECKPOINTS
    if root.is_dir():
        for entry in sorted(root.iterdir()):
            if entry.name.startswith(CHECKPOINT_PREFIX) and not (
                entry.is_dir() and CHECKPOINT_NAME.fullmatch(entry.name)
            ):
                raise UsageError(
                    f"--resume: '{entry}' is not a gpuval checkpoint (expected a folder named "
                    f"{CHECKPOINT_PREFIX}NNNNNNNN): move or delete it, or start without --resume"
                )
    checkpoint = latest_checkpoint(output)
    if checkpoint is None:
        raise UsageError(f"--resume: no checkpoint under '{root}'")
    return checkpoint


def save_checkpoint(
    output: Path,
    step: int,
    data_position: int,
    parallel: Any,
    runtime: Runtime,
    keep_last: int,
    tokenizer: Any = None,
) -> Path:
    """Adapter (PEFT format), optimizer, scheduler, every rank's RNG state and the data position, into a
    temp folder renamed into place once complete and flushed to disk (every file and folder fsynced before
    the rename, the parent after), so neither a kill nor a power cut mid-save leaves a checkpoint that looks
    whole. No file of it needs unpickling to resume (load_checkpoint). What holds the optimizer state
    depends on `train.parallel` (parallel.py: save_state). `tokenizer`: saved beside the adapter
    (save_tokenizer), so a checkpoint's adapter can be served as it is."""
    root = output / CHECKPOINTS
    final = root / f"{CHECKPOINT_PREFIX}{step:08d}"
    temp = root / f".tmp-{CHECKPOINT_PREFIX}{step:08d}"
    if runtime.is_main:
        shutil.rmtree(temp, ignore_errors=True)
        temp.mkdir(parents=True)
        # data_order is a pure function of (seed, position): the position is all the data state there is.
        meta = {"step": step, "data_position_packs": data_position, "world_size": runtime.world_size}
        (temp / STATE_JSON).write_text(json.dumps(meta) + "\n", encoding="utf-8")
    runtime.barrier()
    parallel.save_state(temp, FINAL_ADAPTER)  # a collective
    if runtime.is_main and tokenizer is not None:
        save_tokenizer(tokenizer, temp / FINAL_ADAPTER)
    rng_file = temp / RNG_JSON.format(rank=runtime.rank)  # dropout draws differ per rank
    rng_file.write_text(json.dumps(_rng_state()) + "\n", encoding="utf-8")
    fsync_tree(temp)  # every rank: under DeepSpeed each writes files of its own
    runtime.barrier()
    if runtime.is_main:
        if final.exists():  # a step saved again (a resumed run): replace it whole
            shutil.rmtree(final)
        os.replace(temp, final)
        fsync_dir(root)
        for old in checkpoint_dirs(output)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    runtime.barrier()
    return final


def load_checkpoint(checkpoint: Path, parallel: Any, rank: int, world_size: int | None = None) -> int:
    """Restore what save_checkpoint wrote; returns the step to continue after. Nothing is unpickled: the
    step and RNG states are JSON, the trainer state tensors and plain values (parallel.py: load_state). A
    file that is missing, short or not what gpuval writes is a UsageError naming it."""
    state_file = checkpoint / STATE_JSON
    meta = _read_json(state_file, checkpoint)
    step = meta.get("step") if isinstance(meta, dict) else None
    saved_world = meta.get("world_size") if isinstance(meta, dict) else None
    if type(step) is not int or step < 0 or type(saved_world) is not int:
        raise _bad_checkpoint(state_file, checkpoint, "lacks an integer 'step' and 'world_size'")
    if step != int(checkpoint.name[len(CHECKPOINT_PREFIX) :]):
        raise _bad_checkpoint(state_file, checkpoint, f"says step {step}, its folder another")
    if world_size is not None and saved_world != world_size:
        raise UsageError(
            f"checkpoint '{checkpoint}' was written by {saved_world} ranks, this run has {world_size}: "
            "resume with the same world size, or start without --resume"
        )
    rng_file = checkpoint / RNG_JSON.format(rank=rank)
    if not rng_file.is_file():
        if (checkpoint / f"rng-rank{rank}.pt").exists():
            raise _bad_checkpoint(
                rng_file.with_suffix(".pt"), checkpoint, "is a pickle from an older gpuval, not loaded"
            )
        raise UsageError(
            f"checkpoint '{checkpoint}' has no RNG state for rank {rank} ({rng_file.name}): resume with the "
            "same world size, or start without --resume"
        )
    rng = _read_json(rng_file, checkpoint)
    try:
        parallel.load_state(checkpoint)
    except UsageError:
        raise
    except (KeyError, RuntimeError, ValueError, FileNotFoundError) as exc:
        raise UsageError(f"checkpoint '{checkpoint}' does not fit this model/config ({exc})") from None
    try:
        _set_rng_state(rng)
    except (KeyError, IndexError, TypeError, ValueError, OverflowError, RuntimeError) as exc:
        raise _bad_checkpoint(rng_file, checkpoint, f"is not an RNG state gpuval wrote ({exc})") from None
    return step


def _read_json(path: Path, checkpoint: Path) -> Any:
    from gpuval.inputs import decode_json, read_input_text  # the input gate: regular file, UTF-8, bounded

    if not path.exists():
        raise _bad_checkpoint(path, checkpoint, "is missing")
    try:
        return decode_json(read_input_text(path, "checkpoint file"))
    except (UsageError, ValueError) as exc:
        raise _bad_checkpoint(path, checkpoint, f"cannot be read as JSON ({exc})") from None


def _bad_checkpoint(path: Path, checkpoint: Path, problem: str) -> UsageError:
    return UsageError(
        f"checkpoint file '{path}' {problem}: delete the checkpoint '{checkpoint}' to resume from an older "
        "one, or start without --resume"
    )


def _b64(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def _bytes_tensor(text: str) -> torch.Tensor:
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8)


def _rng_state() -> dict[str, Any]:
    """Python's, torch's (CPU and every CUDA device) and numpy's global RNG states as plain JSON values."""
    import torch

    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    try:
        import numpy

        name, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    except ImportError:
        pass
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    """What _rng_state wrote; a value of the wrong shape raises TypeError, ValueError or RuntimeError."""
    import torch

    if not isinstance(state, dict):
        raise TypeError("not a JSON object")
    version, internal, gauss = state["python"]
    if not isinstance(internal, list) or not all(type(i) is int for i in internal):
        raise TypeError("python: the state is not a list of integers")
    python_state = (version, tuple(internal), gauss)
    torch_state = _bytes_tensor(state["torch"])
    cuda_states = [_bytes_tensor(s) for s in state.get("cuda", [])]
    numpy_state = None
    if "numpy" in state:
        import numpy

        name, keys, pos, has_gauss, cached = state["numpy"]
        numpy_state = (name, numpy.array(keys, dtype=numpy.uint32), pos, has_gauss, cached)
    random.setstate(python_state)
    torch.set_rng_state(torch_state)
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
    if numpy_state is not None:
        import numpy

        numpy.random.set_state(numpy_state)


def save_adapter_atomic(
    peft_model: Any, weights: dict[str, torch.Tensor], target: Path, tokenizer: Any = None
) -> None:
    """The adapter (PEFT format) and, when given, the tokenizer with training's chat template
    (save_tokenizer), into a temp folder flushed and then renamed to `target`."""
    temp = target.with_name(f".tmp-{target.name}")
    shutil.rmtree(temp, ignore_errors=True)
    peft_model.save_pretrained(temp, state_dict=weights)
    if tokenizer is not None:
        save_tokenizer(tokenizer, temp)
    fsync_tree(temp)
    if target.exists():
        shutil.rmtree(target)
    os.replace(temp, target)
    fsync_dir(target.parent)


def save_tokenizer(tokenizer: Any, folder: Path) -> None:
    """The tokenizer's files, with the chat template training rendered with (template.chat_template_for) as
    the template they carry (transformers 5 writes it as chat_template.jinja). Qwen2-7B-Instruct's own
    template drops `tools`: served with it, the model would never see the tool list it was trained to read.
    The tokenizer itself is left as it was."""
    own = tokenizer.chat_template
    tokenizer.chat_template = chat_template_for(tokenizer)
    try:
        tokenizer.save_pretrained(folder)
    finally:
        tokenizer.chat_template = own

"""How the fine-tune's tests (tests/finetune/) configure and run a fine-tune: the tests' config, the saved
adapter's weights; and how test_finetune_train.py runs one apart from its `runtime` fixture: under a
launcher in child processes (tests/dist/train_worker.py), or in this process with a group of its own (a
module-scoped fixture's run, a comparison's one-process side)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import yaml
from conftest import cli_env, is_launcher_variable

from gpuval.config import deep_merge
from gpuval.finetune.config import finetune_config_from_dict
from gpuval.finetune.trainer import train
from gpuval.runtime import Runtime, init_runtime

WORKER = Path(__file__).parent / "dist" / "train_worker.py"


def config_dict(train_file: Path, output: Path, **train_settings: object) -> dict:
    """The tests' fine-tune config; `train_settings` merge into its train section (sections such as
    step={"fuse_qkv": True} deeply)."""
    train = {
        "micro_batch_size": 1,
        "grad_accum_steps": 2,
        "max_steps": 20,
        "seed": 7,
        "optim": {"lr": 3e-3, "warmup_steps": 2},
    }
    return {
        "model": "tiny",
        "dtype": "float32",
        "lora": {"rank": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"},
        "data": {"train": str(train_file), "max_seq_len": 256},
        "train": deep_merge(train, train_settings),
        "output": str(output),
    }


def lora_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """The adapter's weights as saved (adapter_model.safetensors)."""
    from safetensors.torch import load_file

    return load_file(str(model_dir / "adapter_model.safetensors"))


@contextmanager
def own_runtime() -> Iterator[Runtime]:
    """A group of one for a module-scoped fixture, without the launcher variables (the function-scoped
    `runtime` fixture's), on one thread as each torchrun rank here (OMP_NUM_THREADS=1). All restored after."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if is_launcher_variable(k)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rt = init_runtime(timeout_s=30, backend="gloo")
    try:
        yield rt
    finally:
        rt.shutdown()
        torch.set_num_threads(threads)
        os.environ.update(saved)


def run_worker(program: list[str], folder: Path, name: str, config: dict) -> tuple[list, dict]:
    """One fine-tune through tests/dist/train_worker.py under `program` (python, or torchrun with its
    arguments): its per-step losses and rank 0's summary."""
    return run_workers(program, folder, {name: config})[name]


def run_workers(program: list[str], folder: Path, configs: dict[str, dict]) -> dict[str, tuple[list, dict]]:
    """Fine-tunes one after another in one launch of tests/dist/train_worker.py under `program`: for each
    name, its per-step losses and rank 0's summary."""
    args = []
    for name, config in configs.items():
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        args += [str(path), str(folder / f"{name}.json")]
    proc = subprocess.run(
        [*program, str(WORKER), *args],
        env=cli_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=180 * len(configs),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    runs = {}
    for name in configs:
        summary = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))
        runs[name] = [s["loss"] for s in summary["steps"]], summary
    return runs


def run_alone(config: dict) -> tuple[list, dict]:
    """The one-process side of a comparison: train() in this process, as train_worker.py runs it in a
    child, without a child's start-up (python, torch, transformers and PEFT imported again: most of a
    run's time here). Its per-step losses and its summary."""
    with own_runtime() as rt:
        summary = train(finetune_config_from_dict(config), rt)
    return [s["loss"] for s in summary["steps"]], summary

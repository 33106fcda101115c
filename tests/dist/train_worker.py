"""Worker for tests/finetune/test_finetune_train.py: fine-tune runs one after another in one process group, alone or
under `torchrun --nproc_per_node=N`.

    train_worker.py CONFIG.yaml OUT.json [CONFIG.yaml OUT.json ...] [--lr LR]

--lr replaces train.optim.lr after validation (the config refuses a learning rate above 1: a run that must
diverge is made here, past it). Several runs in one launch spare the ranks' start-up (python, torch,
transformers and PEFT imported, the group formed) for each run after the first.

Rank 0 writes each run's summary train() returns as JSON to its OUT.json; a rank that stops with a gpuval
error writes OUT.json.rankN.error ("EXIT_CODE message") and exits with that code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpuval.errors import GpuvalError
from gpuval.finetune.config import load_finetune_config
from gpuval.finetune.trainer import train
from gpuval.runtime import init_runtime


def main() -> None:
    args = sys.argv[1:]
    lr = None
    if "--lr" in args:
        at = args.index("--lr")
        lr = float(args[at + 1])
        del args[at : at + 2]
    if not args or len(args) % 2:
        sys.exit("usage: train_worker.py CONFIG.yaml OUT.json [CONFIG.yaml OUT.json ...] [--lr LR]")
    runtime = init_runtime(timeout_s=120, backend="gloo")
    try:
        for config_path, out in zip(args[::2], args[1::2], strict=True):
            run(config_path, Path(out), lr, runtime)
    finally:
        runtime.shutdown()


def run(config_path: str, out_path: Path, lr: float | None, runtime) -> None:
    try:
        config = load_finetune_config(config_path)
        if lr is not None:
            optim = config.train.optim.model_copy(update={"lr": lr})
            config = config.model_copy(update={"train": config.train.model_copy(update={"optim": optim})})
        summary = train(config, runtime)
    except GpuvalError as exc:
        error_file = out_path.with_name(f"{out_path.name}.rank{runtime.rank}.error")
        error_file.write_text(f"{exc.exit_code} {exc}", encoding="utf-8")
        sys.exit(exc.exit_code)
    if runtime.is_main:
        out_path.write_text(json.dumps(summary), encoding="utf-8")


if __name__ == "__main__":
    main()

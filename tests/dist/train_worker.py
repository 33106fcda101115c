"""Worker for tests/test_finetune_train.py: one fine-tune run, alone or under `torchrun --nproc_per_node=N`.

    train_worker.py CONFIG.yaml OUT.json [LR]

LR, when given, replaces train.optim.lr after validation (the config refuses a learning rate above 1: a run
that must diverge is made here, past it).

Rank 0 writes the summary train() returns as JSON; a rank that stops with a gpuval error writes
OUT.json.rankN.error ("EXIT_CODE message") and exits with that code.
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
    config_path, out_path = sys.argv[1], Path(sys.argv[2])
    runtime = init_runtime(timeout_s=120, backend="gloo")
    try:
        try:
            config = load_finetune_config(config_path)
            if len(sys.argv) > 3:
                lr = float(sys.argv[3])
                optim = config.train.optim.model_copy(update={"lr": lr})
                config = config.model_copy(update={"train": config.train.model_copy(update={"optim": optim})})
            summary = train(config, runtime)
        except GpuvalError as exc:
            error_file = out_path.with_name(f"{out_path.name}.rank{runtime.rank}.error")
            error_file.write_text(f"{exc.exit_code} {exc}", encoding="utf-8")
            sys.exit(exc.exit_code)
        if runtime.is_main:
            out_path.write_text(json.dumps(summary), encoding="utf-8")
    finally:
        runtime.shutdown()


if __name__ == "__main__":
    main()

"""Worker for tests/test_finetune_train.py: one fine-tune run, alone or under `torchrun --nproc_per_node=N`.

    train_worker.py CONFIG.yaml OUT.json

Rank 0 writes the summary train() returns as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpuval.finetune.config import load_finetune_config
from gpuval.finetune.train import train
from gpuval.runtime import init_runtime


def main() -> None:
    config_path, out_path = sys.argv[1], Path(sys.argv[2])
    runtime = init_runtime(timeout_s=120, backend="gloo")
    try:
        summary = train(load_finetune_config(config_path), runtime)
        if runtime.is_main:
            out_path.write_text(json.dumps(summary), encoding="utf-8")
    finally:
        runtime.shutdown()


if __name__ == "__main__":
    main()

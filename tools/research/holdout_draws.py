"""Score a fine-tuned adapter on held-out records of other seeds than its run's holdout_values split.

A `gpuval finetune run`'s holdout_values split is one draw of held-out records (`synth.holdout_seed`).
Choosing a base or a recipe by its score there fits that draw: in issue 4, the first 178 records of seed 1
gave 0.90-0.91 where 729 records of seeds 2 and 3 gave 0.81-0.84
(benchmarks/results/archive/2026-11-23-cpu-finetune-synthetic/). This makes held-out records of other
seeds, keeps those whose first reply calls a function the run trained on (as the run's own split does), and
scores the run's adapter on them with `gpuval finetune eval`, written to a folder of its own: the run's
eval.json stays as it is.

    python tools/research/holdout_draws.py --config configs/finetune/tiny-cpu.yaml --run RUN_DIR \
        --output DIR [--seeds 2 3] [--records 600] [--set model=DIR ...]

`--set` takes what the run itself was given with `--set` (its base model, above all): the adapter is
scored on the base it was trained on.

Writes DIR/holdout-seedS.jsonl, DIR/eval.json and DIR/eval_predictions.jsonl (splits named "seedS").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from gpuval.finetune.data.prepare import functions_named, read_jsonl
from gpuval.finetune.data.synth import write_synth
from gpuval.finetune.pipeline import holdout_records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the run's fine-tune config YAML")
    parser.add_argument("--run", type=Path, required=True, help="the run's output folder (adapter/, data/)")
    parser.add_argument("--output", type=Path, required=True, help="folder for the splits and eval.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[2, 3], help="held-out record seeds")
    parser.add_argument(
        "--records", type=int, default=600, help="synthetic records per seed, before the filter"
    )
    parser.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override the run was given (e.g. model=DIR), repeatable",
    )
    args = parser.parse_args()

    train = args.run / "data" / "train.jsonl"
    if not (args.run / "adapter" / "adapter_config.json").is_file() or not train.is_file():
        print(
            f"error: {args.run} has no adapter/ or data/train.jsonl; give a finished run's --output",
            file=sys.stderr,
        )
        return 2
    seen = set().union(*(functions_named(record) for _line, record in read_jsonl(train, "training data")))
    args.output.mkdir(parents=True, exist_ok=True)
    sets = [
        *args.assignments,
        "output=" + str(args.output),
        "eval.max_examples=null",
        "eval.base_model=false",
    ]
    for seed in args.seeds:
        source = args.output / f"glaive-seed{seed}.jsonl"
        write_synth(args.records, source, seed, "jsonl", "holdout")
        records = holdout_records(source, seen)
        split = args.output / f"holdout-seed{seed}.jsonl"
        split.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        source.unlink()
        sets.append(f"eval.splits.seed{seed}={split}")
        print(f"seed {seed}: {len(records)} held-out call records -> {split}")
    command = [sys.executable, "-m", "gpuval", "finetune", "eval", "--config", args.config]
    command += ["--adapter", str(args.run / "adapter")]
    for assignment in sets:
        command += ["--set", assignment]
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())

"""Score a finished fine-tune run's generated text again with the current scoring rules, without
generating anything: for runs scored before a rule changed (issue 53 made `exact_call_accuracy` pass only
what BFCL's AST check passes). Reads each RUN folder's eval.json (its split files; a run that left prompts
out as too long is refused) and eval_predictions.jsonl, and prints one JSON line per run: every split's
tuned exact_call_accuracy as the run scored it and as scored now, and the examples.

    python benchmarks/rescore_predictions.py /tmp/gpuval-tiny-matrix/native-0 ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gpuval.finetune.eval.inputs import read_eval_split
from gpuval.finetune.eval.scoring import examples_from_records, score


def rescore(run: Path, model: str = "tuned") -> dict[str, dict[str, float | int]]:
    document = json.loads((run / "eval.json").read_text(encoding="utf-8"))
    rows = [
        json.loads(line) for line in (run / "eval_predictions.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    found = {}
    for split, path in document["split_files"].items():
        if document.get("prompts_too_long", {}).get(split):
            raise SystemExit(f"{run}: split {split} left prompts out as too long; rescore runs without any")
        mine = sorted(
            (r for r in rows if r["split"] == split and r["model"] == model), key=lambda r: r["index"]
        )
        records, _ = read_eval_split(path, len(mine))  # the run's own reading of the split
        now = score(examples_from_records(records, [r["generated"] for r in mine]))
        found[split] = {
            "examples": len(mine),
            "then": document["splits"][split][model]["exact_call_accuracy"],
            "now": now["exact_call_accuracy"],
        }
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished `gpuval finetune run` output folders")
    args = parser.parse_args()
    for run in args.runs:
        try:
            splits = rescore(run)
        except (OSError, ValueError, KeyError) as error:  # not a finished run's folder: say which
            raise SystemExit(f"{run}: not a finished fine-tune run ({error})") from None
        print(json.dumps({"run": str(run), "splits": splits}))


if __name__ == "__main__":
    main()

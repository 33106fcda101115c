"""How well a tiny base model copies argument values it never saw, before any fine-tuning.

The bundled tiny model is pretrained on Glaive's own text format (tools/tiny_model.py). This asks it,
in that format, for the call of synthetic records whose argument values are all held out (catalogue.py),
and counts the replies whose first call is the expected one exactly. The fine-tuned model's holdout_values
score (issue 4) follows the base's copying (benchmarks/results/2026-11-23-cpu-tiny-base-copy/), so this
ranks pretraining recipes in a minute on a CPU instead of a full fine-tune.

    python tools/research/tiny_base_copy.py [--model DIR] [--records 300] [--show 10] [--json FILE]

The prompt ends with the call turn's "ASSISTANT:" (its space belongs to the reply's first token, as in
pretraining); a reply may say something before the call, as Glaive's replies do.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gpuval.finetune.data.glaive import FUNCTION_CALL, parse_call
from gpuval.finetune.data.synth import rename_names, synth_records, word_pieces
from gpuval.finetune.model import TINY_MODEL_DIR

HOLDOUT_SEED = 1  # the seed of the CPU fine-tune's holdout_values split (configs/finetune/tiny-cpu.yaml)


def cases(records: int, rename_pieces: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(prompt, expected call text) for every record whose first reply with a call is its call turn; with
    `rename_pieces`, every record's parameters (half its functions too) renamed from them
    (synth.rename_names): the base must read the names from the schema as well."""
    out = []
    for index, record in enumerate(synth_records(records, HOLDOUT_SEED, values="holdout")):
        if rename_pieces:
            record = rename_names(record, random.Random(f"base-copy-rename:{index}"), rename_pieces)
        chat = record["chat"]
        at = chat.find("<functioncall>")
        if at < 0:
            continue
        turn = chat.rfind("ASSISTANT:", 0, at) + len("ASSISTANT:")
        want = chat[at:].split("<|endoftext|>")[0].strip()
        out.append((record["system"] + "\n\n" + chat[:turn], want))
    return out


def first_call(text: str) -> tuple[str, dict] | None:
    """The first `<functioncall> {...}` of a reply, parsed as the converter parses Glaive's calls (a raw
    object and a single-quoted string are the same call), or None. The base does not stop after a call,
    so the call is the shortest text up to a closing brace that parses."""
    at = text.find(FUNCTION_CALL)
    if at < 0:
        return None
    body = text[at + len(FUNCTION_CALL) :].lstrip()
    for end, char in enumerate(body):
        if char == "}":
            try:
                return parse_call(body[: end + 1])
            except ValueError:
                continue
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=TINY_MODEL_DIR)
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--show", type=int, default=10, help="misses to print")
    parser.add_argument("--json", type=Path, default=None, help="write the counts and the misses here")
    parser.add_argument(
        "--renamed", action="store_true", help="made-up function and parameter names, read from the schema"
    )
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32).to(device).eval()
    todo = cases(args.records, word_pieces(tokenizer) if args.renamed else ())
    misses = []
    for start in range(0, len(todo), args.batch_size):
        chunk = todo[start : start + args.batch_size]
        enc = tokenizer([p for p, _ in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **enc.to(device), max_new_tokens=128, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        for (_prompt, want), ids in zip(chunk, out[:, enc["input_ids"].shape[1] :], strict=True):
            reply = tokenizer.decode(ids, skip_special_tokens=True)
            if first_call(reply) != first_call(want):
                misses.append({"expected": want, "reply": reply[: len(want) + 40]})
    exact = len(todo) - len(misses)
    what = "held-out values, made-up names" if args.renamed else "held-out values"
    print(f"base copy, Glaive format, {what}: {exact}/{len(todo)} calls = {exact / len(todo):.3f}")
    for miss in misses[: args.show]:
        print(f"  want {miss['expected']}\n  got  {miss['reply']}")
    if args.json:
        result = {"model": str(args.model), "records": args.records, "renamed": args.renamed}
        result |= {"calls": len(todo), "exact": exact}
        args.json.write_text(json.dumps({**result, "misses": misses}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

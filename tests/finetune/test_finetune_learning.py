"""The bundled tiny model learns the Qwen tool format through LoRA, on the CPU, in a few minutes:
held-out accuracy rises from the base model's zero (issue 4; the full tiny-cpu run is
benchmarks/finetune_cpu.sh, its result in benchmarks/results/2026-11-26-cpu-finetune-logits-kept/)."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_CPU_RUN, TINY_CPU_SHORT

pytest.importorskip("transformers")
pytest.importorskip("peft")

pytestmark = pytest.mark.slow  # about two minutes of LoRA training and eval on one CPU thread


@TINY_CPU_RUN
def test_lora_teaches_the_tool_format_and_held_out_accuracy_rises_from_zero(tiny_cpu_run):
    """The shipped CPU config, shortened (conftest.TINY_CPU_SHORT): 100 steps, 40 examples scored."""
    result, run = tiny_cpu_run
    assert TINY_CPU_SHORT["train.max_steps"] == 100  # what the bounds below were measured at
    assert result.returncode == 0, result.stderr[-3000:]
    splits = json.loads((run / "eval.json").read_text(encoding="utf-8"))["splits"]
    holdout = splits["holdout_values"]
    # The base never saw <tool_call>: on requests that all want a call it makes none.
    assert holdout["base"]["calls_made"] == 0 and holdout["base"]["exact_call_accuracy"] == 0.0
    # After 100 LoRA steps the tuned model calls, names the function and fills in values it never saw.
    # Measured on the 2-core dev CPU, one thread as under the workers (2026-11-27), seeds 0 (the test's)
    # and 1: recall 1.0 and 1.0, exact 0.800 and 0.825, argument F1 0.883 and 0.914; 150 steps gave 1.0,
    # 0.875 and 0.943 at 1.3x the CPU time.
    tuned = holdout["tuned"]
    assert tuned["call_recall"] >= 0.9
    # earlier bases at 150 steps: 0.90 with hidden 192; 0.85 with the hidden-128 6,000-step base, 0.775
    # with random-letter values, 0.70 with the 4,000-step base, 0.475 with the first word-level base
    assert tuned["exact_call_accuracy"] >= 0.7, tuned
    assert tuned["argument_f1"] >= 0.7, tuned
    for split in ("eval", "eval_unseen"):
        assert splits[split]["tuned"]["exact_call_accuracy"] > splits[split]["base"]["exact_call_accuracy"]

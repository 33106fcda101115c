"""`gpuval bench train`: the fine-tune step timed on synthetic data (CPU: the bundled tiny model)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from gpuval.bench.train_step import TrainBenchOptions, _defaults, _measurement, synthetic_conversations  # noqa: E402
from gpuval.errors import RunError  # noqa: E402


def options(**overrides: object) -> TrainBenchOptions:
    return TrainBenchOptions(**{**_defaults(quick=True, on_gpu=False), **overrides})


def summary(losses: list[float], norms: list[float]) -> dict:
    steps = [
        {"loss": loss, "grad_norm": norm, "tokens_per_s_per_gpu": 100.0 + i, "mfu": None, "step_s": 0.5}
        for i, (loss, norm) in enumerate(zip(losses, norms, strict=True))
    ]
    return {
        "steps": steps,
        "trainable_params": 10,
        "packing_efficiency": 0.9,
        "peak_memory_gib": None,
        "attention": "sdpa",
        "row_kernel": "varlen",
        "varlen_kernel": "flash",
        "kernels": "torch",
        "fused_loss": False,
        "loss_kernel": None,
        "precision": "bf16",
        "fused_qkv": False,
        "last_mlp_rows": "labelled",
        "fused_gate_up": False,
        "split_products": False,
        "dropout_kernel": "torch",
    }


RUNTIME = SimpleNamespace(world_size=1)


def test_timed_steps_exclude_warmup_and_report_the_median():
    m = _measurement(summary([5.0, 4.0, 3.0, 2.0], [1.0] * 4), options(warmup_steps=1, steps=3), RUNTIME)
    assert m.samples == 3
    assert m.metrics["tokens_per_s_per_gpu"] == 102.0  # median of 101, 102, 103: step 1 is warm-up
    assert (m.metrics["tokens_per_s_per_gpu_min"], m.metrics["tokens_per_s_per_gpu_max"]) == (101.0, 103.0)
    assert (m.metrics["loss_first"], m.metrics["loss_last"]) == (5.0, 2.5)
    assert m.metrics["mfu_pct"] is None and m.metrics["step_ms"] == 500.0
    assert (m.params["precision"], m.params["fused_qkv"]) == ("bf16", False)  # what ran, from the summary


@pytest.mark.parametrize(
    ("losses", "norms", "why"),
    [
        ([3.0, 3.1, 3.2, 3.3], [1.0] * 4, "the loss did not fall"),
        ([3.0, 2.0, 1.0, 0.5], [1.0, 0.0, 1.0, 1.0], "not all finite and non-zero"),
        ([3.0, 2.0, 1.0, 0.5], [1.0, float("nan"), 1.0, 1.0], "not all finite and non-zero"),
    ],
)
def test_a_step_that_does_not_learn_is_an_error_not_a_number(losses, norms, why):
    with pytest.raises(RunError, match=why):
        _measurement(summary(losses, norms), options(warmup_steps=1, steps=3), RUNTIME)


def test_fixed_mode_conversations_are_longer_than_a_sequence():
    from gpuval.finetune.model import load_tokenizer
    from gpuval.finetune.template import encode

    tokenizer = load_tokenizer("tiny")
    joined = synthetic_conversations(options(mode="fixed", seq_len=256, records=60))
    assert joined
    assert all(len(encode(c, tokenizer, 10**6).input_ids) > 256 for c in joined)


@pytest.mark.slow
def test_bench_train_on_cpu_trains_and_reports(tmp_path, gpuval):
    out, summary_to = tmp_path / "train.json", tmp_path / "summary.json"
    command = ["bench", "train", "--quick", "--set", "mode=fixed", "--set", f"summary_to={summary_to}"]
    result = gpuval([*command, "--output", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (m,) = json.loads(out.read_text(encoding="utf-8"))["measurements"]
    assert m["name"] == "train" and m["params"]["mode"] == "fixed" and m["samples"] == 3
    assert m["params"]["packing_efficiency"] == 1.0  # every sequence is one 512-token conversation
    assert m["metrics"]["tokens_per_s_per_gpu"] > 0 and m["metrics"]["mfu_pct"] is None  # no CPU peak
    assert m["metrics"]["loss_last"] < m["metrics"]["loss_first"]
    # summary_to: train()'s summary, every step's loss (the untimed step too), as benchmarks compare them
    losses = [step["loss"] for step in json.loads(summary_to.read_text(encoding="utf-8"))["steps"]]
    assert len(losses) == 1 + 3 and losses[0] == m["metrics"]["loss_first"]

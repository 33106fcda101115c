"""`gpuval bench train`: the fine-tune step timed on synthetic data (CPU: the bundled tiny model)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from gpuval.bench.train_step import TrainBenchOptions, _defaults, _measurement, synthetic_conversations  # noqa: E402
from gpuval.config import deep_merge  # noqa: E402
from gpuval.errors import RunError, UsageError  # noqa: E402
from gpuval.finetune.trainer import step_summary_keys, summary_keys  # noqa: E402


def options(**overrides: object) -> TrainBenchOptions:
    return TrainBenchOptions(**deep_merge(_defaults(quick=True, on_gpu=False), overrides))


def summary(losses: list[float], norms: list[float]) -> dict:
    """A trainer summary: the per-step log, and every key of the trainer's declaration (summary_keys())
    with a value of its own, so a param read from the wrong key shows."""
    steps = [
        {"loss": loss, "grad_norm": norm, "tokens_per_s_per_gpu": 100.0 + i, "mfu": None, "step_s": 0.5}
        for i, (loss, norm) in enumerate(zip(losses, norms, strict=True))
    ]
    declared = {key: f"ran:{key}" for key in summary_keys()}
    return {
        **declared,
        "steps": steps,
        "trainable_params": 10,
        "packing_efficiency": 0.9,
        "peak_memory_gib": None,
    }


# The params' names as evidence files (benchmarks/results/*/) carry them.
PARAMS = {
    "model",
    "mode",
    "seq_len",
    "micro_batch_size",
    "grad_accum_steps",
    "lora_rank",
    "lora_dropout",
    "target_modules",
    "activation_checkpointing",
    "attention",
    "row_kernel",
    "varlen_kernel",
    "kernels",
    "fused_loss",
    "loss_kernel",
    "compile",
    "precision",
    "fused_qkv",
    "last_mlp_rows",
    "fused_gate_up",
    "split_products",
    "dropout_kernel",
    "sharding",
    "parallel",
    "world_size",
    "trainable_params",
    "packing_efficiency",
}


RUNTIME = SimpleNamespace(world_size=1)


def test_timed_steps_exclude_the_untimed_ones_and_report_the_median():
    m = _measurement(summary([5.0, 4.0, 3.0, 2.0], [1.0] * 4), options(untimed_steps=1, steps=3), RUNTIME)
    assert m.samples == 3
    assert m.metrics["tokens_per_s_per_gpu"] == 102.0  # median of 101, 102, 103: step 1 is untimed
    assert (m.metrics["tokens_per_s_per_gpu_min"], m.metrics["tokens_per_s_per_gpu_max"]) == (101.0, 103.0)
    assert (m.metrics["loss_first"], m.metrics["loss_last"]) == (5.0, 2.5)
    assert m.metrics["mfu_pct"] is None and m.metrics["step_ms"] == 500.0


def test_params_carry_every_step_key_the_trainer_declares_under_the_evidence_names():
    """How the step ran comes from the summary's declared keys (each part's reports, after auto), never a
    copied list; the params keep the names earlier evidence files use."""
    m = _measurement(summary([5.0, 4.0, 3.0, 2.0], [1.0] * 4), options(untimed_steps=1, steps=3), RUNTIME)
    assert set(step_summary_keys()) <= set(summary_keys())
    assert {key: m.params[key] for key in step_summary_keys()} == {k: f"ran:{k}" for k in step_summary_keys()}
    assert set(m.params) == PARAMS
    assert (m.params["lora_rank"], m.params["lora_dropout"]) == (64, 0.0)  # the bench's lora defaults


def test_a_set_key_of_a_section_keeps_the_sections_other_bench_defaults():
    from gpuval.bench.run import bench_options

    gpu = bench_options("train", {"step": {"fuse_qkv": False}}, quick=True, on_gpu=True)
    assert (gpu.step.fuse_qkv, gpu.step.compile, gpu.step.activation_checkpointing) == (False, True, False)
    assert gpu.lora.dropout == 0.0 and gpu.lora.rank == 64 and gpu.micro_batch_size == 3
    cpu = bench_options("train", {"lora": {"rank": 8}}, quick=True, on_gpu=False)
    assert (cpu.lora.rank, cpu.lora.dropout, cpu.step.compile) == (8, 0.0, False)
    with pytest.raises(UsageError, match=r"unknown key 'step\.compiled' \(did you mean 'compile'"):
        bench_options("train", {"step": {"compiled": False}}, quick=True, on_gpu=True)


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
        _measurement(summary(losses, norms), options(untimed_steps=1, steps=3), RUNTIME)


def test_fixed_mode_conversations_are_longer_than_a_sequence():
    from gpuval.finetune.model import load_tokenizer
    from gpuval.finetune.template import encode

    tokenizer = load_tokenizer("tiny")
    joined = synthetic_conversations(options(mode="fixed", seq_len=256, records=60))
    assert joined
    assert all(len(encode(c, tokenizer, 10**6).input_ids) > 256 for c in joined)


@pytest.mark.slow
def test_bench_train_on_cpu_trains_and_reports(tmp_path, gpuval):
    out, copied = tmp_path / "train.json", tmp_path / "copies" / "summary.json"
    sets = ["--set", "mode=fixed", "--set", f"summary_to={copied}"]
    result = gpuval(["bench", "train", "--quick", *sets, "--output", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (m,) = json.loads(out.read_text(encoding="utf-8"))["measurements"]
    trained = json.loads(copied.read_text(encoding="utf-8"))  # summary_to: the trainer's own summary
    assert sorted(trained) == sorted(summary_keys())  # every key the trainer declares, and no other
    assert len(trained["steps"]) == 4 and all("loss" in step for step in trained["steps"])  # 1 untimed + 3
    assert {key: m["params"][key] for key in step_summary_keys()} == {
        k: trained[k] for k in step_summary_keys()
    }
    assert m["name"] == "train" and m["params"]["mode"] == "fixed" and m["samples"] == 3
    assert m["params"]["packing_efficiency"] == 1.0  # every sequence is one 512-token conversation
    assert m["metrics"]["tokens_per_s_per_gpu"] > 0 and m["metrics"]["mfu_pct"] is None  # no CPU peak
    assert m["metrics"]["loss_last"] < m["metrics"]["loss_first"]
    # summary_to: train()'s summary, every step's loss (the untimed step too), as benchmarks compare them
    losses = [step["loss"] for step in json.loads(copied.read_text(encoding="utf-8"))["steps"]]
    assert len(losses) == 1 + 3 and losses[0] == m["metrics"]["loss_first"]


@pytest.mark.parametrize(
    ("old", "new"),
    [("compile", "step.compile"), ("lora_dropout", "lora.dropout"), ("warmup_steps", "untimed_steps"),
     ("fp8_exclude", "step.fp8.exclude"), ("fuse_gate_up", "experimental.fuse_gate_up")],
)  # fmt: skip
def test_an_option_that_moved_into_a_section_is_named_where_it_went(old, new):
    from gpuval.bench.run import bench_options

    with pytest.raises(UsageError, match=rf"^bench train: unknown key '{old}' \({old} moved to {new}\)$"):
        bench_options("train", {old: "1"}, quick=True, on_gpu=False)

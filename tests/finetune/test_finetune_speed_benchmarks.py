"""benchmarks/finetune_speed.py and benchmarks/fp8_loss.py, as far as a CPU goes: the TRL side's arguments
(the recipe issue 23 asks for), a short TRL SFTTrainer run of the tiny model through the benchmark's own
training function and step timer, the ratios, every side's LR schedule and per-step loss check against the
seeds' (issue 35), and the FP8 loss comparison. The GPU runs themselves are the
device scripts' (tools/device/finetune_speed_device.sh)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(REPO / "benchmarks"))  # fp8_loss imports finetune_speed, as a script does
    try:
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


speed = _load("finetune_speed")
fp8_loss = _load("fp8_loss")


def speed_args(**overrides: object) -> argparse.Namespace:
    settings = {
        "model": "qwen2-7b-shape",
        "tokenizer": "tiny",
        "seq_len": 4096,
        "steps": 8,
        "warmup": 3,
        "records": 3000,
        "sequences_per_step": 6,
        "trl_micro_batch": 2,
    }
    return argparse.Namespace(**{**settings, **overrides})


def test_the_trl_side_is_the_recipe_issue_23_asks_for():
    padding_free = speed.trl_config_kwargs(speed_args(), padding_free=True, output_dir="/tmp/x")
    assert padding_free["padding_free"] is True and padding_free["use_liger_kernel"] is True
    assert padding_free["gradient_checkpointing"] is False and padding_free["bf16"] is True
    # the same sequences per optimizer step as the other sides: 2 x 3 = 6
    assert padding_free["per_device_train_batch_size"] * padding_free["gradient_accumulation_steps"] == 6
    assert padding_free["max_steps"] == 3 + 8 and padding_free["learning_rate"] == speed.LR
    # gpuval's schedule (issue 35): cosine to 0 over every step, no warm-up
    assert (padding_free["lr_scheduler_type"], padding_free["warmup_steps"]) == ("cosine", 0)
    assert padding_free["max_length"] is None  # TRL refuses max_length with padding-free and no packing
    padded = speed.trl_config_kwargs(speed_args(), padding_free=False, output_dir="/tmp/x")
    assert padded["padding_free"] is False and padded["max_length"] == 4096
    assert {k: v for k, v in padded.items() if k not in ("padding_free", "max_length")} == {
        k: v for k, v in padding_free.items() if k not in ("padding_free", "max_length")
    }
    with pytest.raises(SystemExit, match="not a multiple of 4"):
        speed.trl_config_kwargs(speed_args(trl_micro_batch=4), padding_free=True, output_dir="/tmp/x")


def test_trl_variants_are_known_and_trl_is_imported_only_when_one_runs():
    assert set(speed.TRL_VARIANTS) == {"trl", "trl-padded"}
    assert {"gpuval-fp8", "gpuval-unfused"} <= set(speed.VARIANTS)
    assert speed.VARIANTS["gpuval-fp8"] == {"step.precision": "fp8-base"}
    assert speed.VARIANTS["gpuval-unfused"] == {"step.fuse_qkv": False}
    assert speed.VARIANTS["gpuval-fused-mlp"] == {"experimental.fuse_gate_up": True}
    assert "gpuval-fused-mlp" not in speed.DEFAULT_VARIANTS
    assert set(speed.DEFAULT_VARIANTS) >= {"seeds", "trl", "trl-padded", "gpuval", "gpuval-fp8"}
    script = str(REPO / "benchmarks" / "finetune_speed.py")
    code = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('s', {script!r}); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        "sys.exit(any(name in sys.modules for name in ('trl', 'datasets', 'transformers')))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.slow  # 3-10 s on 2 cores (2026-11-27 profile of the inner loop)
def test_a_variants_prelude_sets_what_it_names_in_the_process_it_starts():
    variant, check = "gpuval-aten-dropout", "print(config.fallback_random)"
    assert variant in speed.VARIANTS and speed.VARIANTS[variant] == {}  # bench train's options unchanged
    code = speed.prelude(variant) + check
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert result.stdout.strip() == "True"
    plain = subprocess.run(
        [sys.executable, "-c", speed.prelude("gpuval") + check], capture_output=True, text=True
    )
    assert plain.stdout.strip() != "True"  # the default variant sets nothing


def test_every_gpuval_variant_is_valid_bench_train_options():
    """A renamed or moved bench train option breaks a variant here, not on a lent GPU."""
    from gpuval.bench.run import bench_options
    from gpuval.config import apply_sets

    for name, variant in speed.VARIANTS.items():
        overrides: dict = {}
        options = {**speed.RECIPE_OPTIONS, "untimed_steps": 1, "mode": "fixed", **variant}
        apply_sets(overrides, [f"{key}={value}" for key, value in options.items()], dotted_maps=())
        parsed = bench_options("train", overrides, quick=True, on_gpu=True)
        assert parsed.lora.rank == 64 and parsed.step.compile is not None, name


def test_ratios_to_seeds_and_to_trl():
    results = {
        "seeds": {"tokens_per_s_per_gpu": 10.0},
        "trl": {"tokens_per_s_per_gpu": 20.0},
        "gpuval": {"tokens_per_s_per_gpu": 30.0},
        "gpuval-fp8": {"error": "exit 1"},
    }
    assert speed.ratios_to(results, "seeds") == {"seeds": 1.0, "trl": 2.0, "gpuval": 3.0}
    assert speed.ratios_to(results, "trl") == {"seeds": 0.5, "trl": 1.0, "gpuval": 1.5}
    assert speed.ratios_to({"gpuval": {"tokens_per_s_per_gpu": 1.0}}, "trl") == {}
    assert speed.BASELINES == {"ratio_to_seeds": "seeds", "ratio_to_trl": "trl"}


def _lrs(optimizer, schedule, steps: int) -> list[float]:
    """The learning rate each of `steps` optimizer steps runs with under `schedule`."""
    lrs = []
    for _step in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return lrs


def test_the_seeds_and_trl_run_gpuvals_lr_schedule():
    """Issue 35: the seeds' side and TRL's decay the LR as gpuval's side does (bench train: no warm-up,
    cosine to 0 over untimed and timed steps), so their losses can be compared step by step."""
    import torch
    from transformers import get_scheduler

    from gpuval.finetune.optim import lr_factor

    total = 3 + 8
    gpuval = [speed.LR * lr_factor(step, 0, total) for step in range(total)]
    optimizer = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=speed.LR)
    seeds = _lrs(optimizer, speed.seeds_schedule(optimizer, total), total)
    assert seeds == pytest.approx(gpuval, rel=1e-9)
    assert seeds[0] == speed.LR and seeds[-1] < 0.05 * speed.LR  # not constant: it decays to near 0
    # TRL's Trainer builds its schedule from these SFTConfig arguments with transformers' get_scheduler
    config = speed.trl_config_kwargs(speed_args(), padding_free=True, output_dir="/tmp/x")
    optimizer = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=config["learning_rate"])
    trl_schedule = get_scheduler(
        config["lr_scheduler_type"],
        optimizer,
        num_warmup_steps=config["warmup_steps"],
        num_training_steps=config["max_steps"],
    )
    assert _lrs(optimizer, trl_schedule, total) == pytest.approx(gpuval, rel=1e-9)


def test_the_loss_check_compares_every_side_with_the_seeds_at_every_step():
    seeds = [10.0, 9.0, 8.0, 7.0]
    results = {
        "seeds": {"losses": seeds},
        "gpuval": {"losses": [10.05, 9.05, 8.05, 7.05]},  # within 1 % at every step: 0.71 % at step 4
        "gpuval-unfused": {"losses": [10.0, 9.0, 8.1, 7.0]},  # 1.25 % at step 3 only
        "gpuval-fp8": {"losses": [10.1, 9.1, 8.1, 7.07]},  # 1.25 % at step 3: within FP8's 1.5 %
        "trl": {"losses": [10.0, 9.0, 8.0, 7.1]},  # TRL: 1 % too, 1.43 % at step 4
        "trl-padded": {"error": "exit 1: out of memory"},
        "gpuval-mb1": {"losses": [10.0, 9.0, 8.0]},  # a step short
    }
    check = speed.loss_check(results)
    assert "seeds" not in check and set(check) == set(results) - {"seeds"}
    assert check["gpuval"]["passed"] and check["gpuval"]["bound"] == 0.01
    assert check["gpuval"]["max_relative_deviation"] == pytest.approx(0.05 / 7)
    assert check["gpuval"]["at_step"] == 4
    unfused = check["gpuval-unfused"]
    assert not unfused["passed"] and unfused["at_step"] == 3
    assert unfused["max_relative_deviation"] == pytest.approx(0.0125)
    fp8 = check["gpuval-fp8"]
    assert fp8["passed"] and fp8["bound"] == 0.015 and fp8["at_step"] == 3
    assert not check["trl"]["passed"] and check["trl"]["bound"] == 0.01 and check["trl"]["at_step"] == 4
    assert not check["trl-padded"]["passed"] and "out of memory" in check["trl-padded"]["error"]
    assert not check["gpuval-mb1"]["passed"] and "3 and 4 points" in check["gpuval-mb1"]["error"]
    assert speed.describe_check(check["gpuval-unfused"]) == "FAIL 1.25% at step 3 (bound 1.0%)"
    assert speed.describe_check(check["gpuval"]).startswith("PASS 0.71% at step 4")
    # FP8 beyond 1.5 % fails; the seeds' side missing its losses fails every check, naming why
    results["gpuval-fp8"]["losses"][1] = 9.0 * 1.016
    assert not speed.loss_check(results)["gpuval-fp8"]["passed"]
    failed_seeds = speed.loss_check({"seeds": {"error": "timed out"}, "gpuval": results["gpuval"]})
    assert failed_seeds["gpuval"]["passed"] is False and "timed out" in failed_seeds["gpuval"]["error"]
    assert speed.loss_check({"gpuval": results["gpuval"]}) == {}  # no seeds' side run: nothing to check
    assert speed.LOSS_BOUNDS == {"bf16": 0.01, "fp8-base": 0.015}  # issue 35


def test_the_report_carries_the_loss_check_and_a_failed_check_fails_the_script(tmp_path, monkeypatch):
    losses = {"seeds": [10.0, 9.0], "gpuval": [10.0, 9.5]}  # gpuval 5.6 % off at step 2
    monkeypatch.setattr(speed, "run_bounded", lambda command, timeout_s: (0, _one_result(command, losses)))
    monkeypatch.setattr(speed, "_versions", dict)
    output = tmp_path / "speed.json"
    monkeypatch.setattr(
        sys, "argv", ["finetune_speed.py", "--variants", "seeds,gpuval", "--output", str(output)]
    )
    assert speed.main() == 1
    report = json.loads(output.read_text(encoding="utf-8"))
    assert report["variants"]["gpuval"]["losses"] == [10.0, 9.5]
    assert (
        report["loss_check"]["gpuval"]["passed"] is False and report["loss_check"]["gpuval"]["at_step"] == 2
    )
    losses["gpuval"] = [10.0, 9.05]
    assert speed.main() == 0
    assert json.loads(output.read_text(encoding="utf-8"))["loss_check"]["gpuval"]["passed"] is True


def _one_result(command: list[str], losses: dict[str, list[float]]) -> str:
    """What `finetune_speed.py --one NAME` prints for a variant: its RESULT line."""
    name = command[command.index("--one") + 1]
    result = {"tokens_per_s_per_gpu": 1.0, "losses": losses[name]}
    return "RESULT " + json.dumps(result) + "\n"


@pytest.mark.slow
def test_a_gpuval_side_carries_every_steps_loss_from_bench_train():
    """run_one's gpuval side through the real `gpuval bench train` (tiny model, CPU): bench train writes
    train()'s summary to `summary_to`, and the side's entry holds every step's loss, untimed ones too."""
    args = speed_args(
        model="tiny", seq_len=128, steps=2, warmup=1, records=40, sequences_per_step=3, profile=None
    )
    result = speed.run_one("gpuval", args)
    assert len(result["losses"]) == 1 + 2 and result["losses"][0] == result["loss_first"]
    assert "summary_to" not in result["options"]  # a temporary file, not part of the settings


def test_profile_names_several_variants_each_profiled_into_its_own_folder_beside_the_output(tmp_path):
    """`--profile seeds,unsloth-no-ckpt`: each named side (and only those) is profiled, every one into
    profile-NAME beside the report, so that two sides' operator tables can be read side by side."""
    args = argparse.Namespace(profile="seeds,unsloth-no-ckpt", output=tmp_path / "run" / "speed.json")
    assert speed.profiled(args) == ["seeds", "unsloth-no-ckpt"]
    assert "unsloth" not in speed.profiled(args)
    assert speed.profile_dir(args, "seeds") == (tmp_path / "run" / "profile-seeds").resolve()
    assert speed.profiled(argparse.Namespace(profile=None, output=args.output)) == []


@pytest.mark.slow
def test_a_variant_past_its_time_is_killed_with_the_processes_it_started():
    """bench train starts ranks of its own: a timed-out variant must not leave them holding the GPU."""
    import os
    import time

    spawn = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(child.pid, flush=True); time.sleep(60)"
    )
    started = time.monotonic()
    returncode, output = speed.run_bounded([sys.executable, "-c", spawn], timeout_s=2)
    assert returncode is None and time.monotonic() - started < 30
    grandchild = int(output.split()[0])
    for _ in range(50):  # reaped by init once killed
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"process {grandchild} outlived the timeout")
    assert speed.run_bounded([sys.executable, "-c", "print('RESULT {}')"], timeout_s=30) == (0, "RESULT {}\n")


@pytest.mark.slow
def test_trl_trains_the_tiny_model_through_the_benchmarks_own_function(tmp_path):
    """TRL's SFTTrainer on a CPU, through `train_trl` and its step timer: the pre-tokenized rows (ids and
    labels with -100) are taken as they are, every optimizer step is timed and logs a loss."""
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    import torch

    from gpuval.finetune.model import load_model, load_tokenizer

    args = speed_args(model="tiny", seq_len=128, steps=2, warmup=1, records=40, sequences_per_step=4)
    tokenizer = load_tokenizer("tiny")
    ids, labels = speed.same_sequences(args, tokenizer)
    assert len(ids) == 4 and all(len(row) == 128 for row in ids)
    assert all(any(label != -100 for label in row) for row in labels)
    model = load_model("tiny", torch.float32)
    config = speed.trl_config_kwargs(args, padding_free=True, output_dir=str(tmp_path), on_gpu=False)
    run = speed.train_trl(model, tokenizer, {"input_ids": ids, "labels": labels}, config, on_gpu=False)
    assert len(run["times"]) == 3 and all(t > 0 for t in run["times"])  # warm-up + timed steps
    assert len(run["losses"]) == 3 and all(loss > 0 for loss in run["losses"])
    lora_per_layer = 64 * (192 + 192) + 64 * (192 + 96) * 2 + 64 * (192 + 192)  # r64 on q, k, v, o
    assert run["trainable_params"] == 6 * lora_per_layer


def test_fp8_loss_smoothing_and_the_largest_relative_difference():
    assert fp8_loss.smooth([1.0, 2.0, 3.0, 4.0, 5.0], 2) == [1.5, 2.5, 3.5, 4.5]
    assert fp8_loss.max_relative_difference([1.0, 2.02, 2.9], [1.0, 2.0, 3.0]) == (pytest.approx(1 / 30), 2)
    runs = {"bf16": {"losses": [4.0] * 12}, "fp8-base": {"losses": [4.0] * 11 + [4.36]}}
    comparison = fp8_loss.compare(runs, window=10)["fp8-base"]
    # the last step's 9 % jump, averaged over 10 steps: 0.9 % at step 12 (the third smoothed point)
    assert comparison["max_relative_difference"] == pytest.approx(0.009)
    assert comparison["at_step"] == 12 and comparison["within_target"] is True
    runs["fp8-base"]["losses"][-1] = 4.44  # 1.1 %: over issue 23's 1 %
    runs["fp8-base-fast"] = {"losses": [4.0] * 12}
    comparisons = fp8_loss.compare(runs, window=10)
    assert comparisons["fp8-base"]["within_target"] is False and comparisons["fp8-base-fast"]["within_target"]
    assert comparisons["fp8-base-fast"]["max_relative_difference"] == 0
    assert fp8_loss.compare({"bf16": runs["bf16"], "fp8-base": {"error": "timed out"}}, window=10) == {}
    assert fp8_loss.compare({"fp8-base": runs["fp8-base"]}, window=10) == {}  # no bf16 to compare with


def test_fp8_loss_runs_differ_in_their_fp8_settings_only_and_are_valid_configs(tmp_path):
    pytest.importorskip("pydantic")
    from gpuval.finetune.config import finetune_config_from_dict

    args = argparse.Namespace(
        model="qwen2-7b-shape",
        tokenizer="tiny",
        seq_len=4096,
        steps=200,
        micro_batch=1,
        lr=1e-4,
        compile=False,
        seed=3,
    )
    configs = {
        n: fp8_loss.train_config(args, n, tmp_path / "train.jsonl", tmp_path / n) for n in fp8_loss.RUNS
    }
    parsed = {name: finetune_config_from_dict(config).train for name, config in configs.items()}
    edges = ["0.*", "1.*", "-2.*", "-1.*"]
    steps = [t.step for t in parsed.values()]
    assert [(t.precision, t.fp8.fast_accum, t.fp8.input_grad, t.fp8.exclude) for t in steps] == [
        ("bf16", False, True, None),
        ("fp8-base", False, True, None),  # as shipped: fp8.DEFAULT_EXCLUDE
        ("fp8-base", False, True, []),
        ("fp8-base", True, True, None),
        ("fp8-base", False, False, None),
        ("fp8-base", False, True, ["*.self_attn.*"]),
        ("fp8-base", False, True, edges),
        ("fp8-base", False, True, ["*.mlp.down_proj"]),
        ("fp8-base", False, True, ["0.*", "-1.*"]),
    ]
    for config in configs.values():
        for key in ("precision", "fp8"):
            config["train"]["step"].pop(key, None)
        config["output"] = None
    bf16, *others = configs.values()
    assert all(other == bf16 for other in others)
    assert bf16["train"]["max_steps"] >= 200 and bf16["lora"]["dropout"] == 0.05
    assert bf16["train"]["seed"] == 3  # --seed reaches every run


def test_an_unsloth_side_that_cannot_load_says_what_is_missing_and_the_report_keeps_it(tmp_path):
    """Issue 53: the Unsloth side runs in its own process like every side; where Unsloth is not installed
    (this CPU) the variant's error names it, the report is still written, and the script exits 1."""
    if importlib.util.find_spec("unsloth") is not None:
        pytest.skip("unsloth is installed here: the side would try to load it")
    assert speed.UNSLOTH_VARIANTS == {"unsloth": "unsloth", "unsloth-no-ckpt": False}
    output = tmp_path / "speed.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "finetune_speed.py"), "--variants", "unsloth",
         "--output", str(output), "--variant-timeout", "120"],
        capture_output=True, text=True, cwd=tmp_path, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(output.read_text(encoding="utf-8"))
    assert "unsloth is not installed here" in report["variants"]["unsloth"]["error"], report["variants"]
    assert "Traceback" not in report["variants"]["unsloth"]["error"]

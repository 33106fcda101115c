"""finetune/train.py on the bundled tiny model (CPU): learning, DDP equivalence, resume, adapter format,
config errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
import yaml  # noqa: E402
from conftest import cli_env  # noqa: E402

from gpuval.errors import UsageError  # noqa: E402
from gpuval.finetune.config import finetune_config_from_dict, load_finetune_config  # noqa: E402
from gpuval.finetune.data import SourceRecord, convert_all  # noqa: E402
from gpuval.finetune.synth import synth_records  # noqa: E402
from gpuval.finetune.train import latest_checkpoint, lr_factor, train  # noqa: E402
from gpuval.runtime import init_runtime  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "dist" / "train_worker.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.fixture(scope="module")
def train_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    records = [SourceRecord(f"record {i}", r) for i, r in enumerate(synth_records(12, seed=3))]
    conversations, _skipped = convert_all(records)
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in conversations), encoding="utf-8")
    return path


def config_dict(train_file: Path, output: Path, **train_settings: object) -> dict:
    return {
        "model": "tiny",
        "dtype": "float32",
        "lora": {"rank": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"},
        "data": {"train": str(train_file), "max_seq_len": 256},
        "train": {
            "micro_batch_size": 1,
            "grad_accum_steps": 2,
            "lr": 3e-3,
            "warmup_steps": 2,
            "max_steps": 20,
            "seed": 7,
            **train_settings,
        },
        "output": str(output),
    }


@pytest.fixture
def runtime(no_launcher_env):
    rt = init_runtime(timeout_s=30, backend="gloo")
    yield rt
    rt.shutdown()


def lora_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "adapter_model.safetensors"))


def test_lr_schedule_warms_up_linearly_then_decays_by_cosine_to_zero():
    assert [lr_factor(s, 4, 12) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(8, 4, 12) == pytest.approx(0.5)
    assert lr_factor(12, 4, 12) == pytest.approx(0.0)


def test_loss_goes_down_and_the_adapter_loads_with_peft(runtime, train_file, tmp_path):
    from peft import PeftModel

    from gpuval.finetune.model import load_model

    cfg = finetune_config_from_dict(config_dict(train_file, tmp_path / "run"))
    summary = train(cfg, runtime)
    losses = [s["loss"] for s in summary["steps"]]
    assert len(losses) == 20
    assert all(s["grad_norm"] > 0 for s in summary["steps"])
    assert sum(losses[-5:]) / 5 < 0.92 * sum(losses[:5]) / 5, losses  # random base: ln(3000) = 8.0 at start

    adapter = Path(summary["adapter"])
    model = PeftModel.from_pretrained(load_model("tiny", torch.float32), adapter)
    loaded = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert loaded and all(p.abs().sum() > 0 for n, p in loaded.items() if "lora_B" in n)
    saved = lora_weights(adapter)
    assert len(saved) == len(loaded)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp", "deepspeed"])
def test_resume_from_a_checkpoint_matches_the_uninterrupted_run(runtime, train_file, tmp_path, parallel):
    settings: dict[str, object] = {"max_steps": 8, "save_every_steps": 2, "keep_last": 2}
    settings["parallel"] = parallel
    if parallel == "deepspeed":
        pytest.importorskip("deepspeed", reason="optional dependency (pip install deepspeed)")
        settings["deepspeed_config"] = str(REPO / "configs" / "finetune" / "deepspeed" / "zero3.json")
    whole = train(finetune_config_from_dict(config_dict(train_file, tmp_path / "whole", **settings)), runtime)

    cut_cfg = finetune_config_from_dict(config_dict(train_file, tmp_path / "cut", **settings))
    first = train(cut_cfg, runtime, stop_after_step=5)  # "killed" after step 5: last checkpoint is step 4
    assert first["adapter"] is None
    checkpoints = sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir())
    assert checkpoints == ["step-00000002", "step-00000004"]  # keep_last 2; no temp folder left
    assert latest_checkpoint(tmp_path / "cut").name == "step-00000004"

    second = train(cut_cfg, runtime, resume=True)
    assert second["resumed_from"].endswith("step-00000004")
    assert [s["step"] for s in second["steps"]] == [5, 6, 7, 8]
    assert [s["loss"] for s in second["steps"]] == [s["loss"] for s in whole["steps"][4:]]
    resumed, uninterrupted = lora_weights(Path(second["adapter"])), lora_weights(Path(whole["adapter"]))
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)


def test_ddp_and_fsdp_on_two_ranks_equal_one_process_with_twice_the_accumulation(train_file, tmp_path):
    def run(program: list[str], accumulation: int, name: str, parallel: str = "ddp") -> tuple[list, dict]:
        config = tmp_path / f"{name}.yaml"
        settings = {"max_steps": 4, "grad_accum_steps": accumulation, "micro_batch_size": 1}
        data = config_dict(train_file, tmp_path / name, **settings, parallel=parallel)
        config.write_text(yaml.safe_dump(data), encoding="utf-8")
        out = tmp_path / f"{name}.json"
        proc = subprocess.run(
            [*program, str(WORKER), str(config), str(out)],
            env=cli_env(OMP_NUM_THREADS="1"),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        summary = json.loads(out.read_text(encoding="utf-8"))
        return [s["loss"] for s in summary["steps"]], summary

    torchrun = [str(TORCHRUN), "--standalone", "--nproc_per_node=2"]
    single, single_summary = run([sys.executable], 4, "single")
    ddp, ddp_summary = run(torchrun, 2, "ddp")
    fsdp, fsdp_summary = run(torchrun, 2, "fsdp", parallel="fsdp")
    assert ddp_summary["world_size"] == fsdp_summary["world_size"] == 2 and single_summary["world_size"] == 1
    assert ddp_summary["global_batch_packs"] == single_summary["global_batch_packs"] == 4
    assert ddp == pytest.approx(single, rel=1e-5)
    assert fsdp == pytest.approx(single, rel=1e-5)
    assert fsdp_summary["parallel"] == "fsdp"
    # The FSDP2 adapter is gathered whole and saved in PEFT format, equal to the one-process adapter.
    sharded, whole = (
        lora_weights(tmp_path / "fsdp" / "adapter"),
        lora_weights(tmp_path / "single" / "adapter"),
    )
    assert sharded.keys() == whole.keys() and whole
    # Equal up to the order of float sums: reduce-scatter over 2 ranks adds in another order than one
    # process, and AdamW's update g/sqrt(v) magnifies that for a weight whose gradient is near zero, so
    # a rare element moves by ~1e-4 (adapter weights here are ~1e-2); the losses above agree to 1e-5.
    for key in whole:
        torch.testing.assert_close(sharded[key], whole[key], rtol=1e-3, atol=2e-4)
    # train_summary.json holds what train() returned (rank 0 wrote it).
    written = json.loads((tmp_path / "fsdp" / "train_summary.json").read_text(encoding="utf-8"))
    assert [s["loss"] for s in written["steps"]] == fsdp


def test_unknown_config_key_is_a_usage_error_naming_it(train_file, tmp_path):
    data = config_dict(train_file, tmp_path / "run")
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert load_finetune_config(good, ["train.max_steps=3"]).train.max_steps == 3

    data["train"]["warmup_step"] = 5
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(UsageError, match=r"unknown key 'train\.warmup_step' \(did you mean 'warmup_steps'"):
        load_finetune_config(bad)
    with pytest.raises(UsageError, match=r"unknown key 'lora\.ranks'"):
        load_finetune_config(good, ["lora.ranks=4"])


def test_a_missing_deepspeed_config_is_an_error_before_the_model_loads(
    runtime, train_file, tmp_path, monkeypatch
):
    import gpuval.finetune.train as train_module

    def no_load(*_args, **_kwargs):
        raise AssertionError("the model was loaded before the DeepSpeed config was checked")

    monkeypatch.setattr(train_module, "load_model", no_load)
    missing = tmp_path / "zero3.json"
    cfg = finetune_config_from_dict(
        config_dict(train_file, tmp_path / "out", parallel="deepspeed", deepspeed_config=str(missing))
    )
    with pytest.raises(UsageError, match=r"^deepspeed config '.*zero3\.json': cannot read it"):
        train(cfg, runtime, save_adapter=False, quiet=True)

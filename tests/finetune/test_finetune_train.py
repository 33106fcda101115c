"""finetune/train.py on the bundled tiny model (CPU): learning, DDP equivalence, resume, adapter format,
config errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
import yaml  # noqa: E402
from conftest import assert_close_to_adamw_steps, cli_env  # noqa: E402
from finetune_runs import (  # noqa: E402
    WORKER,
    config_dict,
    lora_weights,
    own_runtime,
    run_alone,
    run_worker,
    run_workers,
)

from gpuval.errors import UsageError  # noqa: E402
from gpuval.finetune.checkpoint import latest_checkpoint  # noqa: E402
from gpuval.finetune.config import finetune_config_from_dict, load_finetune_config  # noqa: E402
from gpuval.finetune.optim import lr_factor  # noqa: E402
from gpuval.finetune.trainer import BACKWARD, FORWARD, OPTIMIZER_STEP, train  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def test_lr_schedule_warms_up_linearly_then_decays_by_cosine_to_zero():
    # transformers' get_cosine_schedule_with_warmup: the first step's lr is 0, the peak comes at step 4
    assert [lr_factor(s, 4, 12) for s in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert lr_factor(8, 4, 12) == pytest.approx(0.5)
    assert lr_factor(12, 4, 12) == pytest.approx(0.0)
    from transformers import get_cosine_schedule_with_warmup

    for warmup, total in ((4, 12), (0, 7), (10, 60)):
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        schedule = get_cosine_schedule_with_warmup(optimizer, warmup, total)
        expected = []
        for _step in range(total):
            expected.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            schedule.step()
        assert [lr_factor(s, warmup, total) for s in range(total)] == pytest.approx(expected, abs=1e-12)


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("stack", [False, True])
def test_a_profiled_step_writes_its_trace_and_with_stack_names_the_python_behind_it(
    runtime, train_file, tmp_path, stack
):
    cfg = finetune_config_from_dict(
        config_dict(
            train_file,
            tmp_path / "run",
            max_steps=4,
            grad_accum_steps=1,
            log={"tensorboard": False, "profile_steps": 1, "profile_stack": stack},
        )
    )
    train(cfg, runtime, save_adapter=False, quiet=True)
    folder = tmp_path / "run" / "profile"
    events = json.loads((folder / "trace.json").read_text())["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    python = [e["name"] for e in events if e.get("cat") == "python_function"]
    assert any(e["name"] == "aten::mm" for e in ops) and "aten::mm" in (folder / "operators.txt").read_text()
    # one step profiled, of one micro-batch: PEFT's forward once, gpuval's backward once
    forwards = [name for name in python if "peft/peft_model.py" in name and name.endswith(": forward")]
    backwards = [
        name for name in python if "gpuval/finetune/parallel/modes.py" in name and name.endswith(": backward")
    ]
    assert (len(forwards), len(backwards)) == ((1, 1) if stack else (0, 0)), (forwards, backwards)
    # the step's phases as ranges, each once, in order
    phases = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("gpuval: ")]
    assert [e["name"] for e in sorted(phases, key=lambda e: e["ts"])] == [FORWARD, BACKWARD, OPTIMIZER_STEP]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp", "deepspeed"])
@pytest.mark.slow
def test_resume_from_a_checkpoint_matches_the_uninterrupted_run(runtime, train_file, tmp_path, parallel):
    # 6 steps: "killed" after step 5, resumed from step 4's checkpoint, then steps 5 and 6 compared
    settings: dict[str, object] = {"max_steps": 6, "save": {"every_steps": 2, "keep_last": 2}}
    settings["parallel"] = parallel
    if parallel == "deepspeed":
        pytest.importorskip("deepspeed", reason="optional dependency (pip install deepspeed)")
        settings["deepspeed_config"] = str(REPO / "configs" / "finetune" / "deepspeed" / "zero3.json")
    whole = train(finetune_config_from_dict(config_dict(train_file, tmp_path / "whole", **settings)), runtime)
    if parallel == "deepspeed":  # on a CPU, DeepSpeed's shared-memory all-reduce (inference's) is not built
        from deepspeed.comm import comm

        assert comm.cdb is not None and comm.cdb.shm_comm_op is None

    cut_cfg = finetune_config_from_dict(config_dict(train_file, tmp_path / "cut", **settings))
    first = train(cut_cfg, runtime, stop_after_step=5)  # "killed" after step 5: last checkpoint is step 4
    assert first["adapter"] is None
    checkpoints = sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir())
    assert checkpoints == ["step-00000002", "step-00000004"]  # keep_last 2; no temp folder left
    assert latest_checkpoint(tmp_path / "cut").name == "step-00000004"

    second = train(cut_cfg, runtime, resume=True)
    assert second["resumed_from"].endswith("step-00000004")
    assert [s["step"] for s in second["steps"]] == [5, 6]
    assert [s["loss"] for s in second["steps"]] == [s["loss"] for s in whole["steps"][4:]]
    resumed, uninterrupted = lora_weights(Path(second["adapter"])), lora_weights(Path(whole["adapter"]))
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)


@pytest.mark.dist
def test_ddp_and_fsdp_on_two_ranks_equal_one_process_with_twice_the_accumulation(train_file, tmp_path):
    def config(accumulation: int, name: str, parallel: str = "ddp") -> dict:
        settings = {"max_steps": 4, "grad_accum_steps": accumulation, "micro_batch_size": 1}
        return config_dict(train_file, tmp_path / name, **settings, parallel=parallel)

    torchrun = [str(TORCHRUN), "--standalone", "--nproc_per_node=2"]
    single, single_summary = run_alone(config(4, "single"))
    runs = run_workers(
        torchrun, tmp_path, {"ddp": config(2, "ddp"), "fsdp": config(2, "fsdp", parallel="fsdp")}
    )
    (ddp, ddp_summary), (fsdp, fsdp_summary) = runs["ddp"], runs["fsdp"]
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
    # a rare element moved by ~1e-4 (conftest: assert_close_to_adamw_steps); the losses above agree to 1e-5.
    lr_sum = sum(s["lr"] for s in single_summary["steps"])
    for key in whole:
        assert_close_to_adamw_steps(sharded[key], whole[key], lr_sum=lr_sum, msg=key)
    # train_summary.json holds what train() returned (rank 0 wrote it).
    written = json.loads((tmp_path / "fsdp" / "train_summary.json").read_text(encoding="utf-8"))
    assert [s["loss"] for s in written["steps"]] == fsdp


def test_unknown_config_key_is_a_usage_error_naming_it(train_file, tmp_path):
    data = config_dict(train_file, tmp_path / "run")
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert load_finetune_config(good, ["train.max_steps=3"]).train.max_steps == 3

    data["train"]["optim"]["warmup_step"] = 5
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(
        UsageError, match=r"unknown key 'train\.optim\.warmup_step' \(did you mean 'warmup_steps'"
    ):
        load_finetune_config(bad)
    with pytest.raises(UsageError, match=r"unknown key 'lora\.ranks'"):
        load_finetune_config(good, ["lora.ranks=4"])


def test_a_key_that_moved_into_a_section_is_an_error_naming_its_new_place(train_file, tmp_path):
    """issue 35 nested train's settings by concern: an old flat key is unknown, and the error says where
    it went."""
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(config_dict(train_file, tmp_path / "run")), encoding="utf-8")
    for old, new in (
        ("compile", "step.compile"),
        ("fp8_exclude", "step.fp8.exclude"),
        ("save_every_steps", "save.every_steps"),
        ("lr", "optim.lr"),
        ("fuse_gate_up", "experimental.fuse_gate_up"),
    ):
        with pytest.raises(
            UsageError, match=rf"unknown key 'train\.{old}' \(train\.{old} moved to train\.{new}\)$"
        ):
            load_finetune_config(good, [f"train.{old}=1"])
    assert load_finetune_config(good, ["train.step.compile=false"]).train.step.compile is False


def test_a_missing_deepspeed_config_is_an_error_before_the_model_loads(
    runtime, train_file, tmp_path, monkeypatch
):
    import gpuval.finetune.step.build as step_module

    def no_load(*_args, **_kwargs):
        raise AssertionError("the model was loaded before the DeepSpeed config was checked")

    monkeypatch.setattr(step_module, "load_model", no_load)
    missing = tmp_path / "zero3.json"
    cfg = finetune_config_from_dict(
        config_dict(train_file, tmp_path / "out", parallel="deepspeed", deepspeed_config=str(missing))
    )
    with pytest.raises(UsageError, match=r"^deepspeed config '.*zero3\.json': cannot read it"):
        train(cfg, runtime, save_adapter=False, quiet=True)


def test_deepcompile_with_compiled_layers_is_refused_before_the_model_loads(
    runtime, train_file, tmp_path, monkeypatch
):
    """A DeepSpeed JSON that turns on DeepCompile compiles the whole model: gpuval's own compiling of the
    decoder layers on top of it is refused in one line, before any model is built; with `auto` the JSON's
    compile section is passed on as it is."""
    import gpuval.finetune.step.build as step_module
    from gpuval.finetune.parallel.modes import deepcompile, deepspeed_config

    monkeypatch.setattr(step_module, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    config = tmp_path / "zero3-dc.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 3}, "compile": {"deepcompile": True}}))
    settings = {"parallel": "deepspeed", "deepspeed_config": str(config)}
    cfg = finetune_config_from_dict(
        config_dict(train_file, tmp_path / "out", **settings, step={"compile": True})
    )
    with pytest.raises(
        UsageError, match=r"^deepspeed config '.*zero3-dc\.json' turns on compile\.deepcompile"
    ):
        train(cfg, runtime, save_adapter=False, quiet=True)
    cfg = finetune_config_from_dict(config_dict(train_file, tmp_path / "out", **settings))
    assert deepspeed_config(cfg, 2, torch.float32, False)["compile"] == {"deepcompile": True}
    assert not deepcompile({"compile": True}) and not deepcompile({"compile": {"deepcompile": "yes"}})


def test_a_loss_kernel_for_a_run_without_the_fused_loss_is_refused_before_the_model_loads(
    runtime, train_file, tmp_path, monkeypatch
):
    """On a CPU the loss is not fused by default (kernels auto resolve to torch), so
    train.step.loss_kernel=chunked would be ignored, and Liger's loss cannot run there at all: each refused in
    one line instead, before any model is built."""
    from gpuval.finetune.step import build as step

    monkeypatch.setattr(step, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    why = {"chunked": "chooses .* here torch, ", "liger": "Liger-Kernel runs on CUDA GPUs only; "}
    for kernel in ("chunked", "liger"):
        cfg = finetune_config_from_dict(
            config_dict(train_file, tmp_path / kernel, step={"loss_kernel": kernel})
        )
        with pytest.raises(UsageError, match=rf"^train\.step\.loss_kernel={kernel}:? {why[kernel]}.*auto"):
            train(cfg, runtime, save_adapter=False, quiet=True)
        assert not (tmp_path / kernel).exists()


# --- a diverging run stops; checkpoints resume without unpickling anything ---------------------------------


def test_a_nan_loss_is_an_error_naming_the_step_and_nothing_of_that_step_is_saved(
    runtime, train_file, tmp_path, monkeypatch
):
    from gpuval.errors import RunError
    from gpuval.finetune.step import loss_head

    plain_loss, calls = loss_head.LossHead.__call__, []

    def nan_from_step_3(self, *args):  # 2 micro-batches a step: calls 5 and on are step 3
        calls.append(1)
        loss = plain_loss(self, *args)
        return loss * float("nan") if len(calls) > 4 else loss

    monkeypatch.setattr(loss_head.LossHead, "__call__", nan_from_step_3)
    settings = {"max_steps": 4, "save": {"every_steps": 1, "keep_last": 10}}
    cfg = finetune_config_from_dict(config_dict(train_file, tmp_path / "run", **settings))
    with pytest.raises(RunError, match=r"diverged at step 3: loss nan") as caught:
        train(cfg, runtime)
    assert caught.value.exit_code == 3
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["step-00000001", "step-00000002"]  # none of step 3, no temp folder
    assert not (tmp_path / "run" / "adapter").exists()
    assert not (tmp_path / "run" / "train_summary.json").exists()
    saved = lora_weights(tmp_path / "run" / "checkpoints" / "step-00000002" / "adapter")
    assert all(torch.isfinite(w).all() for w in saved.values())


def test_an_infinite_lr_stops_at_the_first_step_whose_update_is_not_finite(runtime, train_file, tmp_path):
    """train.optim.lr=.inf is refused by the config now; a config built past validation still cannot save NaN:
    step 1's loss is finite (the weights are still the initial ones), its update is not."""
    from gpuval.errors import RunError

    cfg = finetune_config_from_dict(
        config_dict(train_file, tmp_path / "run", max_steps=2, save={"every_steps": 1})
    )
    optim = cfg.train.optim.model_copy(update={"lr": float("inf")})
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"optim": optim})})
    with pytest.raises(RunError, match=r"diverged at step 1: loss [^,n]+, \d+ adapter tensor\(s\) with NaN"):
        train(cfg, runtime)
    assert not (tmp_path / "run" / "adapter").exists()
    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        (tmp_path / "run" / "checkpoints").iterdir()
    )


@pytest.mark.dist
def test_two_ranks_diverging_both_stop_at_the_same_step_with_exit_3(train_file, tmp_path):
    """lr 1e30 (set past the config's bound of 1 by the worker) blows the weights up: the loss, reduced
    over the ranks, is the same number on both, so both raise at the same step and neither waits."""
    config = tmp_path / "run.yaml"
    data = config_dict(
        train_file, tmp_path / "run", max_steps=4, save={"every_steps": 1}, optim={"warmup_steps": 1}
    )
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    torchrun = [str(TORCHRUN), "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(
        [*torchrun, str(WORKER), str(config), str(tmp_path / "out.json"), "--lr", "1e30"],
        env=cli_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode != 0
    errors = [(tmp_path / f"out.json.rank{rank}.error").read_text(encoding="utf-8") for rank in (0, 1)]
    assert errors[0] == errors[1] and errors[0].startswith("3 training diverged at step "), errors
    step = int(errors[0].split("at step ")[1].split(":")[0])
    saved = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert saved == [f"step-{s:08d}" for s in range(1, step)]
    assert not (tmp_path / "run" / "adapter").exists() and not (tmp_path / "out.json").exists()


class _Payload:
    """Unpickling this runs open(marker, 'w'): what a planted checkpoint file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture(scope="module")
def checkpointed(train_file, tmp_path_factory) -> tuple[dict, Path]:
    """A run stopped after its step-2 checkpoint (a run of its own, in a module-scoped folder)."""
    output = tmp_path_factory.mktemp("checkpointed") / "run"
    data = config_dict(train_file, output, max_steps=4, save={"every_steps": 2})
    with own_runtime() as rt:
        train(finetune_config_from_dict(data), rt, stop_after_step=2)
    return data, output


def _copy_run(checkpointed, tmp_path) -> tuple[dict, Path]:
    import shutil

    data, source = checkpointed
    output = tmp_path / "run"
    shutil.copytree(source, output)
    return {**data, "output": str(output)}, output / "checkpoints" / "step-00000002"


def _pickle_payload(folder: Path, marker: Path) -> None:
    torch.save(_Payload(marker), folder / "trainer_state.pt")


CORRUPTIONS = {
    "pickle payload": (_pickle_payload, "trainer_state.pt' is not a trainer state gpuval wrote"),
    "truncated trainer state": (
        lambda f, _m: (f / "trainer_state.pt").write_bytes((f / "trainer_state.pt").read_bytes()[:500]),
        "trainer_state.pt' is not a trainer state gpuval wrote",
    ),
    "trainer state of other keys": (
        lambda f, _m: torch.save({"weights": torch.zeros(2)}, f / "trainer_state.pt"),
        "trainer_state.pt' lacks the keys",
    ),
    "state.json not JSON": (
        lambda f, _m: (f / "state.json").write_text("{step: 2", encoding="utf-8"),
        "state.json' cannot be read as JSON",
    ),
    "state.json without step": (
        lambda f, _m: (f / "state.json").write_text('{"world_size": 1}', encoding="utf-8"),
        "state.json' lacks an integer 'step'",
    ),
    "rng garbage": (
        lambda f, _m: (f / "rng-rank0.json").write_text('{"python": [3, [1, 2], null]}', encoding="utf-8"),
        "rng-rank0.json' is not an RNG state gpuval wrote",
    ),
    "rng not JSON": (
        lambda f, _m: (f / "rng-rank0.json").write_bytes(b"\x80\x04garbage"),
        "rng-rank0.json' cannot be read as JSON",
    ),
    "old pickled rng": (
        lambda f, m: ((f / "rng-rank0.json").unlink(), torch.save(_Payload(m), f / "rng-rank0.pt")),
        "rng-rank0.pt' is a pickle from an older gpuval, not loaded",
    ),
    "foreign step folder": (
        lambda f, _m: (f.parent / "step-foo").mkdir(),
        "step-foo' is not a gpuval checkpoint",
    ),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupt_or_planted_checkpoint_is_refused_naming_the_file_and_runs_no_pickle(
    runtime, checkpointed, tmp_path, corruption
):
    data, checkpoint = _copy_run(checkpointed, tmp_path)
    marker = tmp_path / "pwned"
    damage, fragment = CORRUPTIONS[corruption]
    damage(checkpoint, marker)
    with pytest.raises(UsageError, match="start without --resume") as caught:
        train(finetune_config_from_dict(data), runtime, resume=True)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.exit_code == 2
    assert not marker.exists()


@pytest.mark.slow
def test_the_planted_pickle_is_live_and_the_cli_refuses_it_with_exit_2(checkpointed, tmp_path, gpuval):
    data, checkpoint = _copy_run(checkpointed, tmp_path)
    live = tmp_path / "live"
    _pickle_payload(checkpoint, live)
    torch.load(checkpoint / "trainer_state.pt", weights_only=False)  # what --resume did before
    assert live.exists()  # so the payload below would run, were it unpickled

    marker = tmp_path / "pwned"
    _pickle_payload(checkpoint, marker)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    proc = gpuval(["finetune", "train", "--config", str(config), "--resume"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert not marker.exists()
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gpuval")]  # no model-loading bars
    assert len(lines) == 1 and "trainer_state.pt" in lines[0] and "start without --resume" in lines[0]
    assert "Traceback" not in proc.stderr


def test_a_pickle_planted_among_deepspeeds_files_is_refused_before_deepspeed_loads_it(tmp_path):
    """DeepSpeed's own loader unpickles with weights_only=False; gpuval reads every file the safe way
    first. A real tensor file passes; the planted one is refused naming it, and its code never runs."""
    from gpuval.errors import UsageError
    from gpuval.finetune.parallel.modes import _refuse_unsafe_pickles

    checkpoint = tmp_path / "step-00000002"
    shards = checkpoint / "deepspeed" / "step"
    shards.mkdir(parents=True)
    torch.save({"module": {"w": torch.randn(3)}, "ds_version": "0.19.8", "step": 2}, shards / "mp_rank_00.pt")
    _refuse_unsafe_pickles(checkpoint / "deepspeed", checkpoint)  # plain content: no error

    marker = tmp_path / "ran"
    torch.save(_Payload(marker), shards / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    with pytest.raises(UsageError, match=r"zero_pp_rank_0_mp_rank_00_optim_states\.pt' holds more than"):
        _refuse_unsafe_pickles(checkpoint / "deepspeed", checkpoint)
    assert not marker.exists()


class _GetattrPickle:
    """Pickles as `getattr(owner, name)`: how Python 3.11.0-3.11.4 pickle a member of an Enum with a
    mixed-in type (DeepSpeed's ZeroStageEnum is an int Enum), whatever Python writes it here."""

    def __init__(self, owner, name):
        self.owner, self.name = owner, name

    def __reduce__(self):
        return getattr, (self.owner, self.name)


def test_a_deepspeed_enum_pickled_by_python_3_11_2_is_read_and_no_other_getattr(tmp_path):
    """A ZeRO state written under Debian 12's Python 3.11.2 names builtins.getattr for its ZeroStageEnum: it
    resumes (the member comes back), while a getattr of anything else is still refused."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    from gpuval.errors import UsageError
    from gpuval.finetune.parallel.modes import _deepspeed_data_classes, _refuse_unsafe_pickles

    checkpoint = tmp_path / "step-00000004"
    state = checkpoint / "deepspeed" / "step"
    state.mkdir(parents=True)
    path = state / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"zero_stage": _GetattrPickle(ZeroStageEnum, "optimizer_states"), "w": torch.ones(2)}, path)
    _refuse_unsafe_pickles(checkpoint / "deepspeed", checkpoint)  # read, not refused
    with torch.serialization.safe_globals(_deepspeed_data_classes()):
        loaded = torch.load(path, weights_only=True)
    assert loaded["zero_stage"] is ZeroStageEnum.optimizer_states
    for owner, name in ((ZeroStageEnum, "__class__"), (LossScaler, "__init__"), (ZeroStageEnum, "nosuch")):
        torch.save({"zero_stage": _GetattrPickle(owner, name)}, path)
        with pytest.raises(UsageError, match="holds more than tensors"):
            _refuse_unsafe_pickles(checkpoint / "deepspeed", checkpoint)


def test_bad_training_data_leaves_no_tensorboard_folder(runtime, tmp_path):
    """The event writer is made after data, model and checkpoint are accepted: a refused run writes none."""
    from gpuval.errors import UsageError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tools": [], "messages": []}\n{broken\n', encoding="utf-8")
    cfg = finetune_config_from_dict(config_dict(bad, tmp_path / "out", max_steps=1))
    with pytest.raises(UsageError, match=r"line 2: not JSON"):
        train(cfg, runtime)
    assert not (tmp_path / "out" / "tensorboard").exists()


def test_nonfinite_weights_counts_each_tensor_holding_a_nan_or_inf_once():
    """The count behind the divergence stop, by hand: one fused L1 norm per tensor (parallel.py)."""
    from types import SimpleNamespace

    from gpuval.finetune.parallel.modes import Parallel

    nan, inf = float("nan"), float("inf")
    tensors = [
        torch.randn(64, 8),  # finite
        torch.tensor([1.0, nan, 2.0]),  # NaN
        torch.tensor([[inf, 0.0], [1.0, 1.0]]),  # +inf
        torch.tensor([-inf]),  # -inf
        torch.empty(0),  # an empty shard (FSDP)
        torch.tensor([nan, inf], dtype=torch.bfloat16),  # both in one tensor: still one
        torch.full((1000,), 1e30),  # huge but finite: its L1 norm, 1e33, is finite too
        torch.tensor([1.0, -nan], dtype=torch.float64),
    ]
    holder = SimpleNamespace(trainable=tensors, runtime=SimpleNamespace(device=torch.device("cpu")))
    count = Parallel.nonfinite_weights(holder)
    assert count.dtype == torch.float64 and count.dim() == 0
    assert int(count) == 5
    holder.trainable = [t for t in tensors if torch.isfinite(t).all()]
    assert int(Parallel.nonfinite_weights(holder)) == 0
    holder.trainable = []
    assert int(Parallel.nonfinite_weights(holder)) == 0


@pytest.fixture(scope="module")
def untied_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its own output head (Qwen2-7B's layout: tie_word_embeddings false), weights equal
    to the tied one's: the fused loss then takes the head out of the model under every parallel mode."""
    from gpuval.finetune.model import load_model, load_tokenizer

    folder = tmp_path_factory.mktemp("tiny-untied")
    model = load_model("tiny", torch.float32)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    model.save_pretrained(folder)
    load_tokenizer("tiny").save_pretrained(folder)
    return folder


def fused_config(
    train_file: Path, model: Path, output: Path, mode: str, accumulation: int, fuse_qkv: bool
) -> dict:
    """The fused loss and split products on the untied model, 4 steps, under `mode`; fused q/k/v if asked.
    LoRA on the attention, as the shipped recipe has it (ZeRO-3 then fetches each frozen MLP whole)."""
    parts = {"kernels": "liger-loss", "split_products": True, "fuse_qkv": fuse_qkv}
    settings: dict[str, object] = {"max_steps": 4, "grad_accum_steps": accumulation, "step": parts}
    if mode == "fsdp":  # layers that keep their gathered weights until the backward (the GPU's auto);
        # the resharding ones run in test_ddp_and_fsdp_on_two_ranks_...
        settings["sharding"] = {"fsdp_reshard_after_forward": False}
    if mode == "deepspeed":  # q, o, the MLPs and the embeddings partitioned, each frozen MLP fetched whole;
        # k, v and the adapter kept whole, their LoRA layers run as one module
        settings["deepspeed_config"] = str(keep_kv_whole(output.parent))
        settings["sharding"] = {
            "zero3_frozen_leaves": True,
            "zero3_whole_lora": True,
            "zero3_fused_epilogue": True,
        }
    data = config_dict(train_file, output, **settings, parallel=mode)
    data["model"] = str(model)
    data["lora"]["target_modules"] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    return data


KV_WEIGHT = 192 * 96  # the tiny model's k and v projections (hidden 192, 3 K/V heads of 32): 18,432


def keep_kv_whole(folder: Path) -> Path:
    """The shipped zero3.json keeping whole only weights up to the tiny model's k and v projections (and
    the adapter's): under the shipped threshold all its weights would be, and this test is about the
    partitioned ones, with LoRA layers of both kinds."""
    config = json.loads((REPO / "configs" / "finetune" / "deepspeed" / "zero3.json").read_text())
    config["zero_optimization"]["stage3_param_persistence_threshold"] = KV_WEIGHT
    path = folder / "zero3-keep-kv-whole.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def fused_single(train_file, untied_tiny, tmp_path_factory):
    """fused_single(fuse_qkv) -> the one-process run FSDP2 (fused q/k/v) or ZeRO-3 (not) compares with below,
    made once each."""
    made: dict[bool, tuple[list, dict]] = {}

    def single(fuse_qkv: bool) -> tuple[list, dict]:
        if fuse_qkv not in made:
            output = tmp_path_factory.mktemp("fused-single") / "single"
            made[fuse_qkv] = run_alone(fused_config(train_file, untied_tiny, output, "ddp", 4, fuse_qkv))
        return made[fuse_qkv]

    return single


@pytest.mark.dist
@pytest.mark.parametrize("parallel", ["fsdp", "deepspeed"])
def test_the_fused_loss_and_split_products_under_sharding_equal_one_process(
    train_file, tmp_path, untied_tiny, fused_single, parallel
):
    """FSDP2 and ZeRO-3 with the parts that once ran under ddp only: the fused loss (the head, taken out of
    the model, stays whole on every rank) and split products (the gathered weights read at call time) give
    one process's losses, and the summary says both ran. Under FSDP2 fused q/k/v too (its concatenated
    product a module of its own that FSDP2 shards), on both sides so the arithmetic is the same."""
    if parallel == "deepspeed":
        pytest.importorskip("deepspeed", reason="optional dependency (pip install deepspeed)")
    fuse_qkv = parallel == "fsdp"
    single, single_summary = fused_single(fuse_qkv)
    assert single_summary["fused_loss"] and single_summary["split_products"], single_summary
    torchrun = [str(TORCHRUN), "--standalone", "--nproc_per_node=2"]
    data = fused_config(train_file, untied_tiny, tmp_path / parallel, parallel, 2, fuse_qkv)
    sharded, summary = run_worker(torchrun, tmp_path, parallel, data)
    assert summary["fused_loss"] and summary["split_products"], summary
    assert summary["fused_qkv"] is single_summary["fused_qkv"] is fuse_qkv, summary
    if parallel == "fsdp":
        assert summary["sharding"].startswith("fsdp: decoder layers keep their gathered weights"), summary
    else:  # each layer's frozen MLP fetched by one all-gather (LoRA is on the attention only); k and v of
        # each of the 6 layers kept whole, their LoRA layers run as one module; DeepSpeed's hooks left on
        # 20 modules: the root, the embedding and, in each layer, q's and o's partitioned base products
        # and the MLP (the head is out of the model: the fused loss). The optimizer step keeps gathered
        # the 43 frozen weights kept whole (in each layer q's bias, k's and v's weights and biases, the two
        # norms; the final norm) and the adapter's 48 (A and B of q, k, v, o in 6 layers), these brought
        # up to date by one all-gather: a slice wrongly placed would change every loss after the first;
        # the adapter's gradients reduced by gpuval's epilogue (its add path too: 2 micro-batches a step)
        assert re.fullmatch(
            r"zero3: 6 frozen submodules \(Qwen2MLP\) fetched whole \(set\)"
            r" \| zero3: 12 LoRA layers kept whole run as one module each"
            r" \| zero3: hooks on 20 of \d+ modules, the others own no partitioned weight"
            r" \| zero3: the step keeps the 91 weights kept whole gathered, the 48 trainable ones brought up"
            r" to date by one all-gather"
            r" \| zero3: the gradient bucket reduced by a fixed number of operations",
            summary["sharding"],
        ), summary["sharding"]
    assert summary["world_size"] == 2 and summary["parallel"] == parallel
    assert sharded == pytest.approx(single, rel=1e-5)


@pytest.mark.slow
def test_a_part_registered_in_one_line_changes_the_step_and_its_summary_not_the_loop(
    runtime, train_file, tmp_path, monkeypatch, capsys
):
    """A new part is its own file (tests/toy_part.py) and one register line: the step it decides, the
    start-up line, the summary and the losses all change, and gpuval/finetune/trainer.py is not touched."""
    from toy_part import ToyScalePart

    from gpuval.finetune.step import build as step
    from gpuval.finetune.trainer import summary_keys

    def run(name: str) -> dict:
        cfg = finetune_config_from_dict(config_dict(train_file, tmp_path / name, max_steps=2))
        return train(cfg, runtime, save_adapter=False)

    plain = run("plain")
    assert "toy_scale" not in plain and "toy_scale" not in summary_keys()
    monkeypatch.setattr(step, "PARTS", step.PARTS + (ToyScalePart(),))  # the register line
    capsys.readouterr()
    toy = run("toy")
    said = capsys.readouterr().out
    assert "toy_scale" in summary_keys() and toy["toy_scale"] == 2.0
    assert "toy_scale on (a toy: CPU)" in said and " | toy: embeddings x2" in said, said
    first = (plain["steps"][0]["loss"], toy["steps"][0]["loss"])
    assert abs(first[1] - first[0]) > 1e-3 * abs(first[0]), first  # the same data, another model
    assert {k: v for k, v in toy.items() if k not in ("toy_scale", "steps", "adapter")}.keys() == {
        k for k in plain if k not in ("steps", "adapter")
    }

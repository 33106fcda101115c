"""How the LoRA model is spread over ranks (`train.parallel`), and the few places that changes the loop.

- `ddp`: torch DistributedDataParallel over the adapter parameters (the frozen base is replicated and
  never communicated). Gradients are all-reduced (averaged) on the last micro-batch of a step (`no_sync`
  before it).
- `fsdp`: FSDP2 (`torch.distributed.fsdp.fully_shard`, torchtitan's way): every decoder layer, then the
  root, sharded over all ranks; on GPU in bf16 compute with float32 gradient reduction
  (`MixedPrecisionPolicy`). Gradients are reduce-scattered (averaged) on the last micro-batch
  (`set_requires_gradient_sync`). Frozen base weights are sharded too: a 7B base needs 1/world of
  its memory per rank.
- `deepspeed`: a DeepSpeed engine (ZeRO stage and options from `train.deepspeed_config`, a JSON file;
  `deepspeed` is an optional dependency). gpuval fills the batch, accumulation, clipping and precision
  keys from the fine-tune config so the two cannot disagree, and hands over its AdamW and schedule.

Checkpoints (`save_state` / `load_state`): for ddp and fsdp, torch.distributed.checkpoint's state-dict API
(`get_model_state_dict` / `get_optimizer_state_dict` with full state dicts) — one file, written by rank 0,
keyed by parameter name; for deepspeed, the engine's own `save_checkpoint` (every rank its ZeRO
partitions). Both also write the adapter in PEFT format.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

from gpuval.errors import UsageError, first_line
from gpuval.finetune.optim import make_optimizer_and_schedule
from gpuval.finetune.parts import StepContext
from gpuval.inputs import load_json

TRAINER_STATE = "trainer_state.pt"  # ddp/fsdp checkpoints: adapter, optimizer, schedule (full, rank 0);
# tensors and plain values only, read back with torch.load(weights_only=True): no pickled code runs
DEEPSPEED_DIR = "deepspeed"  # deepspeed checkpoints: the engine's own files
DEEPSPEED_TAG = "state"
SHM_COMM_OP = "deepspeed_shm_comm"  # DeepSpeed's ShareMemCommBuilder.NAME (deepspeed/ops/op_builder/cpu)

# DeepSpeed keys gpuval sets from the fine-tune config (a JSON file that sets them differently is
# overridden, and the run says so).
DEEPSPEED_OWNED = (
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",
    "gradient_clipping",
    "bf16",
    "fp16",
)


# What the step's builder gives a wrapper to call once it is made, with what it made (DeepSpeed's engine):
# the `wrapped` stage of the step's parts (step/build.py)
Wrapped = Callable[[Any], None]


class Parallel:
    """Plain (one process) or DDP; FSDP and DeepSpeed override what differs. `ctx`: the step's parts'
    decisions (how the weights are held: `ctx.weights`; the wrapper's own notes go to `ctx.weight_notes`)."""

    def __init__(
        self, peft_model: Any, cfg: Any, runtime: Any, dtype: torch.dtype, ctx: StepContext, wrapped: Wrapped
    ) -> None:
        self.peft_model = peft_model
        self.module: torch.nn.Module = peft_model
        self.runtime = runtime
        self.trainable = [p for p in peft_model.parameters() if p.requires_grad]
        self.ctx = ctx
        self.wrap(cfg, dtype)
        wrapped(self.module)
        self.optimizer, self.scheduler = make_optimizer_and_schedule(self.trainable, cfg.train)

    def wrap(self, cfg: Any, dtype: torch.dtype) -> None:
        if self.runtime.world_size > 1:
            device_ids = [self.runtime.device.index] if self.runtime.on_gpu else None
            self.module = torch.nn.parallel.DistributedDataParallel(self.peft_model, device_ids=device_ids)

    def accumulating(self, last: bool) -> AbstractContextManager[Any]:
        """Around a micro-batch's forward and backward: no gradient reduction unless `last`."""
        if last or self.runtime.world_size == 1:
            return nullcontext()
        return self.module.no_sync()  # type: ignore[operator]

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def step(self, grad_clip: float) -> torch.Tensor | float:
        """Clip (0: no clipping, norm still measured), optimizer and schedule step; the global grad norm, as
        a device tensor (reading it would make the host wait for the step: the trainer reads it later)."""
        norm = torch.nn.utils.clip_grad_norm_(self.trainable, grad_clip if grad_clip > 0 else float("inf"))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return _full(norm)

    def nonfinite_weights(self) -> torch.Tensor:
        """How many of this rank's adapter tensors (its shards under FSDP or ZeRO-3) hold a NaN or inf: a
        0-d tensor on the device, so the check costs no host synchronisation of its own.

        One fused multi-tensor L1 norm instead of an isfinite/all pair per tensor: Qwen2-7B's 224 adapter
        tensors made about 1,100 tiny kernels per step, launched one by one while the GPU waited (2026-11-26
        profile). A sum carries any NaN or inf into the norm; the only other way to a non-finite norm is a
        tensor whose absolute values add up past float32's 3.4e38, which no weight that trains reaches."""
        local = [_local(p) for p in self.trainable]
        if not local:
            return torch.zeros((), dtype=torch.float64, device=self.runtime.device)
        norms = torch._foreach_norm(local, ord=1)
        return torch.stack(norms).isfinite().logical_not().sum().double()

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """Trainable weights by name, complete, on the CPU (rank 0; other ranks may get an empty dict).
        A collective: every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        return get_model_state_dict(self.peft_model, options=options)

    def trainer_state(self) -> dict[str, Any]:
        """Adapter, optimizer (keyed by parameter name) and schedule, complete on rank 0. A collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        optimizer = get_optimizer_state_dict(self.peft_model, self.optimizer, options=options)
        return {
            "adapter": self.adapter_state(),
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
        }

    def save_state(self, folder: Path, adapter_name: str) -> None:
        """Into an existing checkpoint folder: the adapter in PEFT format and TRAINER_STATE (adapter,
        optimizer, schedule), gathered and written by rank 0. A collective: every rank calls it."""
        state = self.trainer_state()
        if self.runtime.is_main:
            self.peft_model.save_pretrained(folder / adapter_name, state_dict=state["adapter"])
            torch.save(state, folder / TRAINER_STATE)

    def load_state(self, folder: Path) -> None:
        """TRAINER_STATE read with `weights_only=True`: tensors, dicts, lists and numbers only, so a pickle
        placed there runs no code; anything else (a foreign, short or garbled file) is a UsageError."""
        path = folder / TRAINER_STATE
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise _bad_state(path, folder, "is missing") from None
        except Exception as exc:  # noqa: BLE001 - UnpicklingError, a short zip, a foreign format: all refused
            reason = first_line(exc)
            raise _bad_state(path, folder, f"is not a trainer state gpuval wrote ({reason[:200]})") from None
        if not isinstance(state, dict) or not {"adapter", "optimizer", "scheduler"} <= state.keys():
            raise _bad_state(path, folder, "lacks the keys adapter, optimizer and scheduler")
        self.load_trainer_state(state)

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        """What trainer_state returned (every rank reads the same file)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, strict=False)
        result = set_model_state_dict(self.peft_model, state["adapter"], options=options)
        if result.unexpected_keys:
            raise KeyError(f"adapter weights not in this model: {result.unexpected_keys[0]}")
        set_optimizer_state_dict(
            self.peft_model, self.optimizer, optim_state_dict=state["optimizer"], options=options
        )
        self.scheduler.load_state_dict(state["scheduler"])


class Fsdp(Parallel):
    def wrap(self, cfg: Any, dtype: torch.dtype) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        runtime = self.runtime
        mesh = init_device_mesh(runtime.device.type, (runtime.world_size,))
        # LoRA weights stay float32 beside a bf16 base: one unit needs one compute dtype, so cast both.
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if runtime.on_gpu and dtype == torch.bfloat16
            else MixedPrecisionPolicy()
        )
        reshard = self.ctx.weights.fsdp_reshard
        layers = decoder_layers(self.peft_model)
        for index, layer in enumerate(layers):
            # the last layer's backward follows its forward at once: never resharded in between
            last = index == len(layers) - 1
            fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard and not last)
        fully_shard(self.peft_model, mesh=mesh, mp_policy=policy)
        self.module = self.peft_model
        # Sharding replaced the parameters with DTensors: collect them again for the optimizer.
        self.trainable = [p for p in self.peft_model.parameters() if p.requires_grad]

    def accumulating(self, last: bool) -> AbstractContextManager[Any]:
        self.peft_model.set_requires_gradient_sync(last)
        return nullcontext()


class DeepSpeed(Parallel):
    def __init__(
        self, peft_model: Any, cfg: Any, runtime: Any, dtype: torch.dtype, ctx: StepContext, wrapped: Wrapped
    ) -> None:
        try:
            import deepspeed
            from deepspeed.utils import set_z3_leaf_module
        except ImportError:
            raise UsageError(
                "train.parallel is deepspeed but the deepspeed package is missing: pip install deepspeed "
                "(or use parallel ddp/fsdp)"
            ) from None
        self.peft_model = peft_model
        self.runtime = runtime
        self.ctx = ctx
        self.trainable = [p for p in peft_model.parameters() if p.requires_grad]
        optimizer, scheduler = make_optimizer_and_schedule(self.trainable, cfg.train)
        ds_config = deepspeed_config(cfg, runtime.world_size, dtype, runtime.on_gpu)
        for module in ctx.weights.zero3_leaves:  # before initialize, which registers the fetch hooks
            set_z3_leaf_module(module, True)
        if not runtime.on_gpu:
            # On a CPU DeepSpeed's communication backend compiles its shared-memory all-reduce (C++, built
            # on first use: about a minute of CPU on two cores, and an error where no compiler is
            # installed), which only its inference all-reduce uses (deepspeed/comm/torch.py); training's
            # collectives go over the gloo process group. Marked incompatible, it is not built.
            deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False
        # DeepSpeed reads the rank layout from the launcher's variables; a run gpuval started as one
        # process (or under srun) has them in the runtime instead.
        for key, value in (("LOCAL_RANK", runtime.local_rank), ("RANK", runtime.rank)):
            os.environ.setdefault(key, str(value))
        os.environ.setdefault("WORLD_SIZE", str(runtime.world_size))
        engine, optimizer, _, scheduler = deepspeed.initialize(
            model=peft_model,
            model_parameters=self.trainable,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=ds_config,
            dist_init_required=False,
        )
        # The step's `wrapped` parts (the ZeRO-3 switches of train.sharding): after initialize, which marks
        # the weights it keeps whole, before the first forward, which records the fetch trace
        wrapped(engine)
        if deepcompile(ds_config):  # the whole model compiled, ZeRO's gathers and releases in its graph
            engine.compile()
            ctx.weight_notes.append("deepspeed: DeepCompile (the JSON's compile.deepcompile)")
        self.engine = engine
        self.module = engine
        self.optimizer, self.scheduler = optimizer, scheduler
        self.accumulation = cfg.train.grad_accum_steps
        self._step_lr = float(scheduler.get_last_lr()[0])

    def accumulating(self, last: bool) -> AbstractContextManager[Any]:
        return nullcontext()  # the engine knows the accumulation boundary from its config

    def backward(self, loss: torch.Tensor) -> None:
        # The engine divides by the accumulation steps (and averages over ranks); undo the first so the
        # token-normalised loss of train.py holds.
        self.engine.backward(loss * self.accumulation)
        if self.engine.is_gradient_accumulation_boundary():
            self._step_lr = float(self.scheduler.get_last_lr()[0])  # the lr this step uses
        self.engine.step()  # an optimizer and schedule step only at the accumulation boundary

    def lr(self) -> float:
        return self._step_lr

    def step(self, grad_clip: float) -> torch.Tensor | float:
        norm = self.engine.get_global_grad_norm()  # clipping happened in the engine (gradient_clipping)
        return float(norm) if norm is not None else float("nan")

    def adapter_state(self) -> dict[str, torch.Tensor]:
        import deepspeed

        names = [n for n, p in self.peft_model.named_parameters() if p.requires_grad]
        params = [p for p in self.peft_model.parameters() if p.requires_grad]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            if not self.runtime.is_main:
                return {}
            return {n: p.detach().float().cpu().clone() for n, p in zip(names, params, strict=True)}

    def save_state(self, folder: Path, adapter_name: str) -> None:
        """The adapter in PEFT format (gathered, rank 0) and the engine's own checkpoint: every rank writes
        its ZeRO partitions of the optimizer state, and the schedule, under `deepspeed/`."""
        weights = self.adapter_state()
        if self.runtime.is_main:
            self.peft_model.save_pretrained(folder / adapter_name, state_dict=weights)
        self.engine.save_checkpoint(str(folder / DEEPSPEED_DIR), tag=DEEPSPEED_TAG)

    def load_state(self, folder: Path) -> None:
        # DeepSpeed's own loader unpickles with weights_only=False: every file is first read the safe way,
        # so a pickle planted in the checkpoint is refused before DeepSpeed would run it.
        _refuse_unsafe_pickles(folder / DEEPSPEED_DIR, folder)
        path, _client = self.engine.load_checkpoint(
            str(folder / DEEPSPEED_DIR), tag=DEEPSPEED_TAG, load_module_strict=False
        )
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {folder / DEEPSPEED_DIR}")
        self._step_lr = float(self.scheduler.get_last_lr()[0])


def deepspeed_config(cfg: Any, world: int, dtype: torch.dtype, on_gpu: bool) -> dict[str, Any]:
    """The JSON file's settings with gpuval's own keys (DEEPSPEED_OWNED) set from the fine-tune config."""
    path = cfg.train.deepspeed_config
    if not path:
        raise UsageError("train.parallel is deepspeed but train.deepspeed_config names no JSON file")
    settings = load_json(path, "deepspeed config")  # the input gate: one line for any unreadable file
    if not isinstance(settings, dict):
        raise UsageError(f"deepspeed config '{path}': the top level must be a JSON object")
    t = cfg.train
    if deepcompile(settings) and t.step.compile is True:
        raise UsageError(
            f"deepspeed config '{path}' turns on compile.deepcompile, which compiles the whole model: "
            "set train.step.compile to false (or auto) to leave the decoder layers to it"
        )
    settings = {key: value for key, value in settings.items() if key not in DEEPSPEED_OWNED}
    settings.update(
        {
            "train_micro_batch_size_per_gpu": t.micro_batch_size,
            "gradient_accumulation_steps": t.grad_accum_steps,
            "train_batch_size": t.global_batch(world),
            "gradient_clipping": t.optim.grad_clip,
            "bf16": {"enabled": on_gpu and dtype == torch.bfloat16},
        }
    )
    return settings


def deepcompile(settings: dict[str, Any]) -> bool:
    """Whether a DeepSpeed config turns on DeepCompile (`compile.deepcompile`; DeepSpeed 0.16.6 and later,
    on CUDA): engine.compile() then compiles the model with ZeRO-3's all-gathers as graph operations
    instead of module hooks."""
    section = settings.get("compile")
    return isinstance(section, dict) and section.get("deepcompile") is True


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks, found by the class names transformers marks as not to be split
    (`_no_split_modules`, e.g. Qwen2DecoderLayer)."""
    base = getattr(model, "get_base_model", lambda: model)()
    names = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise UsageError(f"fsdp: no decoder layers found in {type(base).__name__}")
    return layers


def make_parallel(
    kind: str, peft_model: Any, cfg: Any, runtime: Any, dtype: torch.dtype, ctx: StepContext, wrapped: Wrapped
) -> Parallel:
    """`kind`'s wrapper around the LoRA model; it calls `wrapped` with what it made, before any forward."""
    classes = {"ddp": Parallel, "fsdp": Fsdp, "deepspeed": DeepSpeed}
    return classes[kind](peft_model, cfg, runtime, dtype, ctx, wrapped)


def zero_stage(cfg: Any) -> int | None:
    """The ZeRO stage of the run's DeepSpeed JSON (parallel: deepspeed), else None."""
    if cfg.train.parallel != "deepspeed":
        return None
    settings = load_json(cfg.train.deepspeed_config, "deepspeed config")
    zero = settings.get("zero_optimization") if isinstance(settings, dict) else None
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    return stage if isinstance(stage, int) else None


def _deepspeed_data_classes() -> list[Any]:
    """The two DeepSpeed types its ZeRO optimizer states hold (measured with 0.19.8): a loss scaler restored
    attribute by attribute (no __setstate__) and an Enum. Allowing them imports no other code. Python
    3.11.0-3.11.4 (Debian 12's 3.11.2) pickle a member of an Enum with a mixed-in type as
    `getattr(ZeroStageEnum, "optimizer_states")`: `builtins.getattr` is allowed as `_enum_member`, which
    looks up a member of these Enums and nothing else."""
    try:
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
    except ImportError:
        return []
    return [LossScaler, ZeroStageEnum, (_enum_member_of((ZeroStageEnum,)), "builtins.getattr")]


def _enum_member_of(enums: tuple[type, ...]) -> Callable[[Any, Any], Any]:
    """getattr as an unpickler may call it: only `(one of enums, a member's name)`, else an error."""

    def _enum_member(cls: Any, name: Any) -> Any:
        if cls in enums and isinstance(name, str) and name in cls.__members__:
            return cls.__members__[name]
        raise ValueError(f"getattr({cls!r}, {name!r}) is not a member of an allowed Enum")

    return _enum_member


def _refuse_unsafe_pickles(root: Path, folder: Path) -> None:
    """Every torch file under `root` loads with weights_only=True (tensors, containers, numbers, strings,
    the few torch types it allows and DeepSpeed's two data classes), or the checkpoint is refused."""
    allowed = _deepspeed_data_classes()
    for path in sorted(root.rglob("*.pt")):
        try:
            with torch.serialization.safe_globals(allowed):
                torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - a planted or garbled file: refused either way
            raise _bad_state(
                path, folder, f"holds more than tensors and plain values ({_unsafe(path)})"
            ) from None


def _unsafe(path: Path) -> str:
    """What in a torch file weights_only refuses: the globals it would import, or why it cannot tell."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception as exc:  # noqa: BLE001 - not a torch zip at all
        return f"not a readable torch file: {type(exc).__name__}"
    return "imports " + ", ".join(names[:4]) if names else "refused by torch's weights_only loader"


def _bad_state(path: Path, folder: Path, problem: str) -> UsageError:
    return UsageError(
        f"checkpoint file '{path}' {problem}: delete the checkpoint '{folder}' to resume from an older one, "
        "or start without --resume"
    )


def _local(param: Any) -> torch.Tensor:
    """The part of a parameter this rank holds: a DTensor's shard, a ZeRO-3 partition, or the tensor."""
    if hasattr(param, "to_local"):
        return param.to_local()
    partition = getattr(param, "ds_tensor", None)
    return partition if partition is not None else param.detach()


def _full(value: Any) -> Any:
    """A DTensor's full value (FSDP2 grad norms are DTensors); anything else as is."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value

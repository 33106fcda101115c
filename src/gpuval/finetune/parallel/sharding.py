"""How FSDP2 and ZeRO-3 move the frozen base's weights (`train.sharding`): one step part per switch
(finetune/parts.py's contract, listed in step.PARTS): `fsdp_reshard` and `zero3_frozen_leaves` at the
`lora` stage (after LoRA, before the memory estimate: they leave `ctx.weights`, which the parallel wrapper
reads), the other five ZeRO-3 switches at the `wrapped` stage (after `deepspeed.initialize`).

With LoRA the base is frozen: under `fsdp` its sharded weights are gathered for every micro-batch, and that
gathering is nearly all of the added traffic (the adapter's gradients are ~0.5 % of the model's size).

- `fsdp_reshard_after_forward` (FSDP2's `fully_shard(reshard_after_forward=...)`). True frees each decoder
  layer's gathered weights after its forward and gathers them again for its backward: two all-gathers of
  the base per micro-batch, the least memory. False keeps them from forward to backward: one all-gather,
  while the unsharded weights of the layers between a layer's forward and its backward stay in memory (at
  the turn from forward to backward, all of them). The last layer is never resharded: its backward follows
  at once (torchtitan's default policy, `torchtitan/models/llama3/infra/parallelize.py`). `auto` keeps
  the weights when the whole model's take at most KEEP_GATHERED_FRACTION of the GPU's memory: Qwen2-7B's
  15.2 GB of bf16 weights on an 80 GB H100 is 19 %; a 30B model's 61 GB is not kept.

- `zero3_frozen_leaves` (ZeRO-3). DeepSpeed fetches its parameters module by module, from hooks on every
  submodule (two per module and pass, each with bookkeeping on the host). A "z3 leaf" module
  (`deepspeed.utils.set_z3_leaf_module`) is fetched whole, by one all-gather, and its children get no
  hooks. True marks as leaves the frozen submodules of each decoder layer that have children of their own:
  Qwen2's MLP (gate, up and down: 87 % of a layer's weights) when LoRA targets the attention. A submodule
  that holds a trainable weight is never a leaf: DeepSpeed reduces a leaf's trainable gradients from a
  full backward hook on the module (`DeepSpeedZeroOptimizer_Stage3.create_reduce_and_remove_grad_hooks`),
  which fires once the gradient of the module's input is ready; a LoRA weight whose AccumulateGrad runs
  after that gets a zero-size placeholder gradient, and its real one then cannot be added (seen on two
  CPU ranks with DeepSpeed 0.19.8 when whole decoder layers were leaves: "size of tensor a (0) must
  match"). Leaves change which weights are gathered when, never the arithmetic. `auto` is off, as
  DeepSpeed's own default: on 4×H200 (three calls, 2026-11-27) leaves gave 45.0 %, 54.1 % and 53.2 % of one
  GPU's tokens/s per GPU against 43.9 %, 45.1 % and 59.8 % without, in the same calls, no difference
  within ZeRO-3's spread (`benchmarks/results/2026-11-27-h200x4-finetune-zero3/`).

- `zero3_whole_lora` (ZeRO-3). PEFT's LoRA layer is a module of five that run: the layer, its base
  product, its dropout, A and B; DeepSpeed hooks each (four hook calls per module and micro-batch, each
  with host bookkeeping), which for Qwen2-7B with LoRA on q, k, v and o is 20 of a decoder layer's 29
  modules that run. When ZeRO-3 keeps every weight of a LoRA layer whole on every rank (its
  `stage3_param_persistence_threshold`, which `configs/finetune/deepspeed/zero3.json` sets above the
  attention projections), nothing needs fetching below the layer, so `run_lora_whole` replaces the layer's
  `forward` (an instance attribute, as fused_qkv.py does) with PEFT's arithmetic on the weights: the base
  product, the dropout, A and B called as functions. Only the layer's own hooks run. A layer with a weight
  ZeRO-3 partitions, a LoRA variant (DoRA), several adapters, a bias on A, or a base that is not a plain
  Linear keeps PEFT's forward. Its products call torch's own linear (`ATEN_LINEAR`): ZeRO-3 replaces
  `torch.nn.functional.linear` by an autograd function of its own (DeepSpeed's `memory_efficient_linear`)
  that a partitioned weight needs and a whole one does not. The adapter's parameters, their gradients and
  their reduction (DeepSpeed reduces each trainable weight from a hook on its own gradient accumulation)
  are unchanged. `auto` is on:
  on 2×H200 (two calls, 2026-11-27/28) it gave 64.9 %, 74.4 %, 65.2 % and 67.2 % of one GPU's tokens/s
  per GPU against 56.0 % and 51.2 % without it in the same call
  (`benchmarks/results/2026-11-28-h200x2-finetune-zero3-lora/`); on 4×H200 58.5 % and 68.9 % against
  57.3 % and 68.6 %, no difference (`benchmarks/results/2026-11-28-h200x4-finetune-zero3-whole/`).

- `zero3_unhook_whole` (ZeRO-3). `deepspeed.initialize` hooks every module that is not inside a z3 leaf
  (`DeepSpeedZeRoOffload._register_deepspeed_module`): before and after its forward, and through two
  autograd functions wrapped around its inputs and outputs, before and after its backward; each runs the
  fetch coordinator's bookkeeping on the host. A module fetches only its own weights (a leaf: its whole
  subtree's), so a module that owns no partitioned weight, because ZeRO-3 keeps all of them whole
  (`ds_persist`, the persistence threshold) or it has none (a decoder layer, its attention, activation,
  dropout, rotary embedding, a LoRA layer under the shipped zero3.json), has nothing to fetch or release,
  and its hooks are host work alone. With Qwen2-7B under the shipped zero3.json that is 10 of a decoder
  layer's 13 hooked modules that run with LoRA layers run whole (the layer, two norms, the attention, q, k,
  v, o, the MLP's activation, the MLP itself, which owns no weight of its own: only gate, up and down keep
  their hooks). `unhook_whole_modules` removes those hooks after `deepspeed.initialize` and before the
  first forward, while the fetch trace is still unrecorded: the trace DeepSpeed records and prefetches
  from then lists only modules with something to fetch. The model's root module keeps its hooks: it is
  the outermost backward module, to which DeepSpeed attributes the weights fetched while a checkpointed
  layer is recomputed, and which releases them at the end of the backward. Weights are gathered, used and
  released by the same modules as before; the adapter's gradients are reduced from hooks on each weight's
  gradient accumulation, which this leaves alone. `auto` is on: on 4×H200 it gave 69.8 % and 70.8 % of one
  GPU's tokens/s per GPU against 62.3 % and 68.9 % with every module hooked, back to back, and 72.1 % and
  70.9 % in the next call; runs of the same setting agree within 2.3 points, where they moved by 10 to 20
  with every module hooked (`benchmarks/results/2026-11-28-h200x4-finetune-zero3-unhook/`).

- `zero3_compile_whole` (ZeRO-3). Compiled decoder layers fail under ZeRO-3: Dynamo reads a
  partitioned weight (shape [0]) inside the compiled region before its module's hook gathered it
  (`benchmarks/results/2026-11-28-h200x4-finetune-zero3-unhook/`). A submodule whose weights are all kept
  whole has nothing to gather (and, with `zero3_unhook_whole`, no hooks), so `compile_whole_submodules`
  compiles the forward of each such direct submodule of a decoder layer (Qwen2's attention, with its LoRA
  layers run whole, and the norms under the shipped zero3.json) and leaves the layer and its MLP eager.
  DeepSpeed's parameter dictionary hands a compiled region the weight as it is (`ZeROOrderedDict` returns it
  unchecked while compiling), released or not: an eager pre-forward hook on the submodule first gathers any
  of its weights DeepSpeed released (at start, or after a checkpoint save; seen on one H200, where the
  compiled attention read an adapter weight of shape [0]). `auto` is off: on one H200 (ZeRO-3 at world size
  1) it gave 17,499 tokens/s against 17,664 eager in the same call, at 4.6 GiB more
  (`benchmarks/results/2026-11-28-h200x1-finetune-zero3-compile/`).

- `zero3_lean_step` and `zero3_fused_epilogue` (ZeRO-3): the optimizer step and the end of the backward,
  in finetune/parallel/zero3_step.py, which says what they change and what was measured.

Sources: FSDP2's `fully_shard` documentation
(https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html); DeepSpeed's ZeRO-3 leaf modules
(https://deepspeed.readthedocs.io/en/latest/zero3.html, "Leaf modules" under "Debugging").
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from gpuval.finetune.parallel.zero3_step import fused_gradient_epilogue, gather_released, lean_step
from gpuval.finetune.parts import Decision, Part, StepContext

# torch.nn.functional.linear as torch defines it: ZeRO-3 replaces the module attribute with its own autograd
# function (DeepSpeed's memory_efficient_linear), which keeps a gathered weight out of the saved tensors and
# gathers it again for the backward, host work per product that weights kept whole do not need
ATEN_LINEAR = torch._C._nn.linear
KEEP_GATHERED_FRACTION = 0.25  # of the GPU's memory: the whole model's weights at most this keep gathered


def fsdp_reshard(setting: bool | str, model: Any, on_gpu: bool, device: Any) -> tuple[bool, str]:
    """Whether FSDP2 reshards the decoder layers after their forward (all but the last), and why."""
    if setting != "auto":
        return bool(setting), "set"
    if not on_gpu:
        return True, "auto: CPU"
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return reshard_for_memory(weights, torch.cuda.get_device_properties(device).total_memory)


def reshard_for_memory(weights: int, total: int) -> tuple[bool, str]:
    """`auto`'s rule on a GPU: `weights`, the whole model's bytes, against the GPU's `total` bytes."""
    share = f"the model's {weights / 2**30:.1f} GiB of weights are {weights / total:.0%} of this GPU's memory"
    if weights <= KEEP_GATHERED_FRACTION * total:
        return False, f"auto: {share}"
    return True, f"auto: {share}, more than {KEEP_GATHERED_FRACTION:.0%}"


def fsdp_note(reshard: bool, why: str) -> str:
    """What the start-up line and the summary say of fsdp_reshard's choice."""
    if reshard:
        return f"fsdp: decoder layers reshard after forward, all but the last ({why})"
    return f"fsdp: decoder layers keep their gathered weights until their backward ({why})"


class FsdpReshardPart(Part):
    """`train.sharding.fsdp_reshard_after_forward` under fsdp (module docstring): resolved after LoRA (`auto`
    on a GPU reads the loaded weights' size), left in `ctx.weights` for the memory estimate and the FSDP2
    wrapper, which passes it to `fully_shard`."""

    name = "fsdp_reshard"
    stage = "lora"
    reports: ClassVar[dict[str, Any]] = {}

    def decide(self, ctx: StepContext) -> Decision:
        if ctx.parallel != "fsdp":
            return Decision(False, False, "not fsdp", said=False)
        setting = ctx.sharding.fsdp_reshard_after_forward
        if setting == "auto" and ctx.on_gpu:  # from the loaded weights' size: settled in apply
            return Decision(True, "auto", "auto: from the weights' size once the model is loaded")
        reshard, why = fsdp_reshard(setting, None, ctx.on_gpu, ctx.device)
        return Decision(True, reshard, why)

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        reshard, why = decision.choice, decision.why
        if reshard == "auto":
            reshard, why = fsdp_reshard("auto", model, ctx.on_gpu, ctx.device)
            ctx.settle(self.name, Decision(True, reshard, why))
        # layers that keep their gathered weights hold all of them at the turn from forward to backward
        ctx.weights = replace(ctx.weights, fsdp_reshard=reshard, sharded=reshard)
        ctx.weight_notes.append(fsdp_note(reshard, why))
        return {}


class Zero3LeavesPart(Part):
    """`train.sharding.zero3_frozen_leaves` under ZeRO-3 (module docstring): which frozen submodules are
    fetched whole, found after LoRA (a submodule holding an adapter weight never is) and left in
    `ctx.weights` for the DeepSpeed wrapper, which marks them before `deepspeed.initialize`. On under every
    ZeRO-3 run, leaves or none: it says which, and that each rank holds 1/world of the weights."""

    name = "zero3_frozen_leaves"
    stage = "lora"
    reports: ClassVar[dict[str, Any]] = {}

    def decide(self, ctx: StepContext) -> Decision:
        if not ctx.zero3:  # ddp, or ZeRO-1/2: every rank holds every weight
            return Decision(False, False, "not ZeRO-3", said=False)
        setting = ctx.sharding.zero3_frozen_leaves  # auto: off (module docstring)
        return Decision(True, setting is True, "auto" if setting == "auto" else "set")

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        leaves = tuple(frozen_subtrees(ctx.layers)) if decision.choice else ()
        if not leaves:
            none = ", none has a frozen submodule with children" if decision.choice else ""
            note = f"zero3: every submodule fetched on its own ({decision.why}{none})"
        else:
            kinds = ", ".join(sorted({type(m).__name__ for m in leaves}))
            note = f"zero3: {len(leaves)} frozen submodules ({kinds}) fetched whole ({decision.why})"
        ctx.weights = replace(ctx.weights, zero3_leaves=leaves, sharded=True)
        ctx.weight_notes.append(note)
        return {}


class Zero3Switch(Part):
    """A ZeRO-3 switch of `train.sharding` applied once `deepspeed.initialize` has made the engine (stage
    `wrapped`; `model` is the engine): named as its setting, off (and unsaid) outside ZeRO-3, `auto` as
    `default`. Its `apply` says what it did in `ctx.weight_notes`."""

    stage = "wrapped"
    reports: ClassVar[dict[str, Any]] = {}
    default: ClassVar[bool]

    def decide(self, ctx: StepContext) -> Decision:
        if not ctx.zero3:
            return Decision(False, False, "not ZeRO-3", said=False)
        setting = getattr(ctx.sharding, self.name)
        if setting == "auto":
            return Decision(self.default, self.default, "auto")
        return Decision(bool(setting), bool(setting), "set")


class Zero3WholeLoraPart(Zero3Switch):
    """`train.sharding.zero3_whole_lora` (module docstring; `auto`: on): after `deepspeed.initialize`,
    which marks the weights it keeps whole, each LoRA layer whose weights are all whole runs as one
    module."""

    name = "zero3_whole_lora"
    default = True

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        whole = run_lora_whole(model.module)
        ctx.weight_notes.append(f"zero3: {whole} LoRA layers kept whole run as one module each")
        return {}


class Zero3UnhookPart(Zero3Switch):
    """`train.sharding.zero3_unhook_whole` (module docstring; `auto`: on): before the first forward, which
    records the fetch trace, DeepSpeed's hooks come off the modules with nothing to fetch."""

    name = "zero3_unhook_whole"
    default = True

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        kept, had = unhook_whole_modules(model)
        ctx.weight_notes.append(
            f"zero3: hooks on {kept} of {had} modules, the others own no partitioned weight"
        )
        return {}


class Zero3LeanStepPart(Zero3Switch):
    """`train.sharding.zero3_lean_step` (parallel/zero3_step.py; `auto`: on): after unhooking, the step's
    gathers (the fetch hooks left alone)."""

    name = "zero3_lean_step"
    default = True

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        counts = lean_step(model)
        ctx.weight_notes.append(
            "zero3: lean step off, this DeepSpeed's ZeRO-3 optimizer lacks a part it changes"
            if counts is None
            else f"zero3: the step keeps the {counts[0] + counts[1]} weights kept whole gathered, "
            f"the {counts[1]} trainable ones brought up to date by one all-gather"
        )
        return {}


class Zero3FusedEpiloguePart(Zero3Switch):
    """`train.sharding.zero3_fused_epilogue` (parallel/zero3_step.py; `auto`: off): the gradient bucket
    reduced by a fixed number of operations."""

    name = "zero3_fused_epilogue"
    default = False

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        ctx.weight_notes.append(
            "zero3: the gradient bucket reduced by a fixed number of operations"
            if fused_gradient_epilogue(model)
            else "zero3: fused epilogue off, this DeepSpeed's ZeRO-3 optimizer lacks a part of it"
        )
        return {}


class Zero3CompileWholePart(Zero3Switch):
    """`train.sharding.zero3_compile_whole` (module docstring; `auto`: off): after the whole LoRA forwards,
    before the first forward, the submodules whose weights are all whole are compiled."""

    name = "zero3_compile_whole"
    default = False

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        names = compile_whole_submodules(ctx.layers)
        what = ", ".join(names) or "nothing (no submodule has all its weights whole)"
        ctx.weight_notes.append(f"zero3: compiled in each decoder layer: {what}")
        return {}


def frozen_subtrees(layers: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """In each decoder layer, the outermost submodules that have children and parameters, none trainable
    (containers such as ModuleList never: their children are called, not they)."""
    found: list[torch.nn.Module] = []

    def visit(module: torch.nn.Module) -> None:
        for child in module.children():
            params = list(child.parameters())
            if not params:
                continue
            container = isinstance(child, torch.nn.ModuleList | torch.nn.ModuleDict | torch.nn.Sequential)
            has_children = next(child.children(), None) is not None
            if has_children and not container and not any(p.requires_grad for p in params):
                found.append(child)
            else:
                visit(child)

    for layer in layers:
        visit(layer)
    return found


def run_lora_whole(model: torch.nn.Module) -> int:
    """After `deepspeed.initialize` (which marks the weights it keeps whole `ds_persist`): give every PEFT
    LoRA layer whose weights are all kept whole, and that runs plain LoRA, a forward computing PEFT's
    arithmetic without calling its submodules (module docstring). Returns how many layers it changed."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    changed = 0
    for layer in model.modules():
        if not isinstance(layer, LoraLinear):
            continue
        if not all(getattr(p, "ds_persist", False) for p in layer.parameters()):
            continue
        adapter = _plain_adapter(layer)
        if adapter is not None:
            layer.forward = _whole_forward(layer, adapter)  # an instance attribute: PEFT's class stays
            changed += 1
    return changed


def _plain_adapter(layer: Any) -> str | None:
    """The layer's one adapter when it is plain LoRA on a plain Linear, else None."""
    adapters = [a for a in layer.active_adapters if a in layer.lora_A]
    if len(adapters) != 1 or layer.merged or layer.disable_adapters:
        return None
    if type(layer.base_layer) is not torch.nn.Linear:
        return None
    (adapter,) = adapters
    if adapter in getattr(layer, "lora_variant", {}) or layer.use_dora.get(adapter, False):
        return None
    a, b = layer.lora_A[adapter], layer.lora_B[adapter]
    if type(a) is not torch.nn.Linear or type(b) is not torch.nn.Linear or a.bias is not None:
        return None
    return adapter


def _whole_forward(layer: Any, adapter: str) -> Any:
    """PEFT's `lora.Linear.forward` for one plain adapter (peft/tuners/lora/layer.py), submodules called as
    functions: base(x) + B(A(dropout(x))) · scaling, x cast to the adapter's dtype, the sum returned in the
    base output's dtype. A dropout module that is not torch's Dropout or Identity is still called."""
    base, a, b = layer.base_layer, layer.lora_A[adapter], layer.lora_B[adapter]
    dropout, scaling = layer.lora_dropout[adapter], layer.scaling[adapter]

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args or kwargs:  # PEFT passes these to the base layer, which a plain Linear does not take
            raise TypeError(f"{type(layer).__name__}.forward under zero3_whole_lora takes the input only")
        result = ATEN_LINEAR(x, base.weight, base.bias)
        lora_x = layer._cast_input_dtype(x, a.weight.dtype)
        if type(dropout) is torch.nn.Dropout:
            lora_x = F.dropout(lora_x, dropout.p, dropout.training, dropout.inplace)
        elif type(dropout) is not torch.nn.Identity:
            lora_x = dropout(lora_x)
        update = ATEN_LINEAR(ATEN_LINEAR(lora_x, a.weight), b.weight, b.bias)
        return (result + update * scaling).to(result.dtype)

    return forward


def compile_whole_submodules(layers: list[torch.nn.Module]) -> list[str]:
    """After `deepspeed.initialize` (which marks the weights it keeps whole) and the LoRA layers' whole
    forwards, before the first forward: torch.compile each direct submodule of each decoder layer that owns
    weights, all kept whole, and holds no z3 leaf (module docstring). Returns the compiled submodules'
    class names, once each."""
    from deepspeed.utils import z3_leaf_module

    compiled: dict[str, None] = {}
    for layer in layers:
        for child in layer.children():
            params = list(child.parameters())
            if not params or not all(getattr(p, "ds_persist", False) for p in params):
                continue
            if any(z3_leaf_module(m) for m in child.modules()):
                continue
            # A compiled region reads a weight as it is, gathered or not: one DeepSpeed released (its
            # checkpoint save, GatheredParameters on leaving, the first step) is gathered first, by an
            # eager pre-forward hook outside the compiled forward
            child.register_forward_pre_hook(_gather_before(params))
            child.forward = torch.compile(child.forward)
            compiled[type(child).__name__] = None
    return list(compiled)


def _gather_before(params: list[Any]) -> Any:
    def hook(module: torch.nn.Module, args: Any) -> None:
        gather_released(params)

    return hook


def unhook_whole_modules(engine: Any) -> tuple[int, int]:
    """After `deepspeed.initialize` with ZeRO-3 and before the first forward: take DeepSpeed's hooks off
    every module below the root that owns no partitioned weight (module docstring). Returns how many
    modules keep their hooks and how many had them."""
    from deepspeed.utils import z3_leaf_module

    offload = getattr(engine.optimizer, "parameter_offload", engine.optimizer)  # as DeepSpeed finds it
    root = engine.module
    hooked = [m for m in root.modules() if hasattr(m, "ds_id")]  # a leaf's children were never hooked

    def owns_partitioned(module: torch.nn.Module) -> bool:
        own = module.parameters(recurse=z3_leaf_module(module))
        return any(not getattr(p, "ds_persist", False) for p in own)

    idle = [m for m in hooked if m is not root and not owns_partitioned(m)]
    idle_dicts = {id(d) for m in idle for d in (m._forward_pre_hooks, m._forward_hooks)}

    def keep(handles: list[Any]) -> list[Any]:
        kept = []
        for handle in handles:
            if id(handle.hooks_dict_ref()) in idle_dicts:
                handle.remove()
            else:
                kept.append(handle)
        return kept

    offload.forward_hooks = keep(offload.forward_hooks)
    offload.backward_hooks = keep(offload.backward_hooks)
    coordinator = offload.get_param_coordinator()
    if not coordinator.is_invalid_trace():  # a trace recorded with the removed modules would not match
        coordinator._invalidate_trace()
    return len(hooked) - len(idle), len(hooked)

"""train.sharding (finetune/parallel/sharding.py): when FSDP2's decoder layers keep their gathered weights,
and which frozen submodules ZeRO-3 fetches whole."""

import pytest
import torch
from conftest import FLOAT64_REORDERED, assert_close_to_scale
from step_parts import context

from gpuval.finetune.model import apply_lora, load_model
from gpuval.finetune.parallel import sharding
from gpuval.finetune.parallel.modes import decoder_layers
from gpuval.finetune.parallel.sharding import (
    compile_whole_submodules,
    frozen_subtrees,
    fsdp_note,
    fsdp_reshard,
    reshard_for_memory,
    run_lora_whole,
)
from gpuval.finetune.parts import StepContext, WeightPlan
from gpuval.finetune.step.build import PARTS

GIB = 2**30


def test_auto_keeps_the_gathered_weights_when_the_model_takes_a_quarter_of_the_gpu_or_less():
    # Qwen2-7B's 7.6 B bf16 weights (15.2 GB) on an H100's 79.6 GiB: 18 %, kept
    keep, why = reshard_for_memory(7_615_616_512 * 2, int(79.6 * GIB))
    assert keep is False and "14.2 GiB" in why and "18%" in why
    # exactly a quarter is kept; one byte more reshards
    assert reshard_for_memory(20 * GIB, 80 * GIB)[0] is False
    assert reshard_for_memory(20 * GIB + 1, 80 * GIB)[0] is True
    # a 32B model's 65 GB on the same GPU reshards, and says why
    reshard, why = reshard_for_memory(32_500_000_000 * 2, int(79.6 * GIB))
    assert reshard is True and "more than 25%" in why


def test_a_set_value_wins_and_a_cpu_reshards_under_auto():
    model = torch.nn.Linear(4, 4)
    assert fsdp_reshard(False, model, False, None) == (False, "set")
    assert fsdp_reshard(True, model, False, None) == (True, "set")
    assert fsdp_reshard("auto", model, False, None) == (True, "auto: CPU")
    assert "keep their gathered weights" in fsdp_note(False, "set")
    assert "reshard after forward, all but the last" in fsdp_note(True, "auto: CPU")


def _lora_tiny(targets: list[str]) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    model = apply_lora(load_model("tiny", torch.float32), 4, 8.0, 0.0, targets, [])
    return model, decoder_layers(model)


# The sharding switches, as step.PARTS lists them: two at the `lora` stage, five after the wrapper
SWITCHES = tuple(part for part in PARTS if type(part).__module__ == sharding.__name__)


def _decide(parallel, stage, model, layers, **settings) -> StepContext:
    """Every switch decided for `parallel` (`stage`: the DeepSpeed JSON's ZeRO stage) and `train.sharding`
    settings; the `lora` ones applied to the LoRA `model`, as step.build_step does before the wrapper."""
    ctx = context(parallel=parallel, zero_stage=stage, sharding=settings)
    ctx.layers = layers
    assert len(SWITCHES) == 7
    for part in SWITCHES:
        ctx.decisions[part.name] = decision = part.decide(ctx)
        if decision.on and part.stage == "lora":
            assert part.apply(model, ctx, decision) == {}
    return ctx


def _plan(
    setting,
    model,
    layers,
    stage=3,
    whole_lora="auto",
    unhook="auto",
    lean="auto",
    compiled="auto",
    epilogue="auto",
) -> StepContext:
    return _decide(
        "deepspeed",
        stage,
        model,
        layers,
        zero3_frozen_leaves=setting,
        zero3_whole_lora=whole_lora,
        zero3_unhook_whole=unhook,
        zero3_lean_step=lean,
        zero3_compile_whole=compiled,
        zero3_fused_epilogue=epilogue,
    )


def _on(ctx: StepContext, name: str) -> bool:
    return ctx.decisions[name].on


def test_zero3_fetches_each_layers_frozen_mlp_whole_and_never_a_module_with_an_adapter():
    model, layers = _lora_tiny(["q_proj", "k_proj", "v_proj", "o_proj"])
    assert _plan("auto", model, layers).weights.zero3_leaves == ()  # auto: off, as DeepSpeed's default
    # LoRA layers kept whole run as one module unless set false; never outside ZeRO-3
    assert _on(_plan("auto", model, layers), "zero3_whole_lora") and _on(
        _plan(True, model, layers, whole_lora=True), "zero3_whole_lora"
    )
    assert not _on(_plan("auto", model, layers, whole_lora=False), "zero3_whole_lora")
    assert not _on(_plan("auto", model, layers, stage=2), "zero3_whole_lora")
    # and hooks only where there is something to fetch, likewise
    assert _on(_plan("auto", model, layers), "zero3_unhook_whole") and _on(
        _plan(True, model, layers), "zero3_unhook_whole"
    )
    assert not _on(_plan("auto", model, layers, unhook=False), "zero3_unhook_whole")
    assert not _on(_plan("auto", model, layers, stage=2), "zero3_unhook_whole")
    # and the optimizer step gathering again only the trainable weights kept whole, likewise
    assert _on(_plan("auto", model, layers), "zero3_lean_step")
    assert _on(_plan(True, model, layers, lean=True), "zero3_lean_step")
    assert not _on(_plan("auto", model, layers, lean=False), "zero3_lean_step")
    assert not _on(_plan("auto", model, layers, stage=2), "zero3_lean_step")
    # the gradient bucket reduced by a fixed number of operations only when set (auto: off, measured)
    assert not _on(_plan("auto", model, layers), "zero3_fused_epilogue")
    assert _on(_plan("auto", model, layers, epilogue=True), "zero3_fused_epilogue")
    assert not _on(_plan("auto", model, layers, stage=2, epilogue=True), "zero3_fused_epilogue")
    # compiling the submodules whose weights are all whole only when set (auto: off until measured)
    assert not _on(_plan("auto", model, layers), "zero3_compile_whole")
    assert _on(_plan("auto", model, layers, compiled=True), "zero3_compile_whole")
    assert not _on(_plan("auto", model, layers, stage=2, compiled=True), "zero3_compile_whole")
    plan = _plan(True, model, layers)
    # the MLP of every layer, and nothing of the attention, whose projections hold LoRA weights
    assert [type(m).__name__ for m in plan.weights.zero3_leaves] == ["Qwen2MLP"] * len(layers)
    assert all(m is layer.mlp for m, layer in zip(plan.weights.zero3_leaves, layers, strict=True))
    assert (
        plan.weights.sharded and f"zero3: {len(layers)} frozen submodules (Qwen2MLP)" in plan.weight_notes[0]
    )
    # LoRA on the MLP's projections too: no submodule with children is frozen, so none is fetched whole
    model, layers = _lora_tiny(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    plan = _plan(True, model, layers)
    assert (
        plan.weights.zero3_leaves == ()
        and "none has a frozen submodule with children" in plan.weight_notes[0]
    )
    for leaf in frozen_subtrees(layers):
        assert not any(p.requires_grad for p in leaf.parameters())


def test_zero3_leaves_off_when_set_false_or_not_stage_3_and_fsdp_decides_its_reshard():
    model, layers = _lora_tiny(["q_proj", "v_proj"])
    off = _plan(False, model, layers)
    assert off.weights.zero3_leaves == () and off.weight_notes == [
        "zero3: every submodule fetched on its own (set)"
    ]
    stage2 = _plan(True, model, layers, stage=2)  # ZeRO-2 shards no weights: nothing to fetch
    assert stage2.weights == WeightPlan() and stage2.weight_notes == []
    fsdp = _decide("fsdp", None, model, layers)  # on a CPU
    assert fsdp.weights == WeightPlan(fsdp_reshard=True, sharded=True)
    assert fsdp.decisions["fsdp_reshard"].line("fsdp_reshard") == "fsdp_reshard on (auto: CPU)"
    kept = _decide("fsdp", None, model, layers, fsdp_reshard_after_forward=False)
    assert kept.weights == WeightPlan() and "keep their gathered" in kept.weight_notes[0]
    ddp = _decide("ddp", None, model, layers)
    assert ddp.weights == WeightPlan() and ddp.weight_notes == []
    # a switch with nothing to do under the run's mode is left out of the start-up line
    assert not any(decision.on or decision.said for decision in ddp.decisions.values())
    assert [name for name, d in fsdp.decisions.items() if d.said] == ["fsdp_reshard"]


def _step(model, ids, seed):
    """One forward and backward in training mode (LoRA dropout drawn from `seed`): loss, adapter grads."""
    model.zero_grad()
    torch.manual_seed(seed)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_lora_layers_kept_whole_run_peft_arithmetic_without_calling_their_submodules():
    """run_lora_whole on the tiny model, where DeepSpeed's `ds_persist` mark (set after initialize on the
    weights ZeRO-3 keeps whole) is given to k and v only: their LoRA layers then call none of their
    submodules, q and o still do, and loss and every adapter gradient equal PEFT's own forward's with
    LoRA dropout drawn from the same seed. In float64: the same sums, perhaps in another order."""
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    model = apply_lora(load_model("tiny", torch.float64), 4, 8.0, 0.1, targets, [])
    model.train()
    ids = torch.randint(0, 3000, (2, 24), generator=torch.Generator().manual_seed(0))
    expected = _step(model, ids, seed=7)
    for name, p in model.named_parameters():
        p.ds_persist = ".k_proj." in name or ".v_proj." in name
    assert run_lora_whole(model) == 2 * len(decoder_layers(model))  # k and v of every layer
    called: list[str] = []
    for name, module in model.named_modules():
        module.register_forward_pre_hook(lambda m, args, name=name: called.append(name))
    loss, grads = _step(model, ids, seed=7)
    assert_close_to_scale(loss, expected[0], rel=FLOAT64_REORDERED)
    assert grads.keys() == expected[1].keys()
    for name, grad in grads.items():
        assert_close_to_scale(grad, expected[1][name], rel=FLOAT64_REORDERED, msg=name)
    inner = {".base_layer", ".lora_A.default", ".lora_B.default", ".lora_dropout.default"}
    for layer in range(len(decoder_layers(model))):
        attention = f"base_model.model.model.layers.{layer}.self_attn"
        for projection in ("k_proj", "v_proj"):  # kept whole: the layer runs, its submodules do not
            assert f"{attention}.{projection}" in called
            assert not {f"{attention}.{projection}{part}" for part in inner} & set(called)
        for projection in ("q_proj", "o_proj"):  # a weight ZeRO-3 partitions: PEFT's forward, as before
            assert {f"{attention}.{projection}{part}" for part in inner} <= set(called)


def test_lora_layers_stay_peft_when_a_weight_is_partitioned_or_the_layer_is_not_plain_lora():
    model = apply_lora(load_model("tiny", torch.float32), 4, 8.0, 0.0, ["q_proj", "v_proj"], [])
    assert run_lora_whole(model) == 0  # no ds_persist mark: nothing is known to be kept whole
    for p in model.parameters():
        p.ds_persist = True
    layer = decoder_layers(model)[0].self_attn.q_proj
    layer.use_dora["default"] = True  # a LoRA variant computes something else: left to PEFT
    assert run_lora_whole(model) == 2 * len(decoder_layers(model)) - 1
    assert "forward" not in vars(layer)
    assert "forward" in vars(decoder_layers(model)[0].self_attn.v_proj)


@pytest.mark.slow  # imports DeepSpeed: 2-3 s on 2 cores
def test_zero3_compiles_the_submodules_whose_weights_are_all_whole_and_nothing_with_a_partitioned_one():
    """Marked as deepspeed.initialize marks them: the attention's weights kept whole (ds_persist), the MLP's
    partitioned. Only the attention of each layer is compiled; the norms (whole too) as well, the layer and
    its MLP stay eager. A submodule holding a z3 leaf is never compiled."""
    pytest.importorskip("deepspeed", reason="optional dependency (pip install deepspeed)")
    from deepspeed.utils import set_z3_leaf_module

    model, layers = _lora_tiny(["q_proj", "k_proj", "v_proj", "o_proj"])
    for layer in layers:
        for name, param in layer.named_parameters():
            param.ds_persist = not name.startswith("mlp.")
    set_z3_leaf_module(layers[0].input_layernorm, True)  # a leaf: fetched by DeepSpeed, never compiled
    names = compile_whole_submodules(layers)
    assert sorted(names) == ["Qwen2Attention", "Qwen2RMSNorm"]

    def compiled(module: torch.nn.Module) -> bool:  # its forward, an instance attribute, compiled
        return "forward" in vars(module) and hasattr(module.forward, "_torchdynamo_orig_callable")

    for i, layer in enumerate(layers):
        assert compiled(layer.self_attn) and compiled(layer.post_attention_layernorm)
        assert compiled(layer.input_layernorm) is (i != 0)
        assert not compiled(layer.mlp) and not compiled(layer)
        # each compiled submodule gathers its released weights first, from an eager pre-forward hook
        assert len(layer.self_attn._forward_pre_hooks) == 1 and not layer.mlp._forward_pre_hooks

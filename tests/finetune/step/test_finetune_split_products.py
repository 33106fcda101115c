"""finetune/step/split_products.py on the tiny model: with every frozen linear's hidden-size side computed in
column groups the model computes what it computed before, output and every adapter's gradient (float64),
with PEFT's q/k/v or the fused one and with the last MLP on labelled rows; the groups are the largest power
of two and the rest; only frozen plain linears change; and the split layers compile in one graph."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
from conftest import FLOAT64_REORDERED, assert_close_to_scale  # noqa: E402
from step_parts import decide  # noqa: E402
from test_finetune_fused_qkv import QKVO, lora_model  # noqa: E402

from gpuval.errors import UsageError  # noqa: E402
from gpuval.finetune.step.fused_qkv import fuse_qkv  # noqa: E402
from gpuval.finetune.step.last_mlp_rows import LastMlpRows  # noqa: E402
from gpuval.finetune.step.split_products import (  # noqa: E402
    SplitProductsPart,
    column_grouped_mm,
    column_groups,
    split_products,
)

HIDDEN = 192  # the tiny model's hidden size: groups of 128 and 64
PER_LAYER = (
    7  # q, k, v and o's base layers (input side; q and o also output), gate and up (input), down (output)
)


def test_column_groups_are_the_largest_power_of_two_and_the_rest():
    assert column_groups(3584) == [2048, 1536]  # Qwen2-7B
    assert column_groups(HIDDEN) == [128, 64]
    assert column_groups(4096) == [4096]  # a power of two stays whole
    assert column_groups(5120) == [4096, 1024]
    assert column_groups(1) == [1]
    with pytest.raises(ValueError):
        column_groups(0)


def test_setting_auto_means_compiled_layers_on_a_gpu():
    assert decide(SplitProductsPart(), split_products="auto", on_gpu=True, compiled=True).on
    assert not decide(SplitProductsPart(), split_products="auto", on_gpu=True, compiled=False).on
    assert not decide(SplitProductsPart(), split_products="auto", on_gpu=False, compiled=True).on
    assert decide(SplitProductsPart(), split_products=True, on_gpu=False, compiled=False).on
    assert not decide(SplitProductsPart(), split_products=False, on_gpu=True, compiled=True).on
    # FSDP2 hands each layer its gathered weights, which the split forward reads: on (tested against one
    # process in test_finetune_train); under deepspeed never measured: off, and said so
    assert decide(SplitProductsPart(), split_products="auto", on_gpu=True, compiled=True, parallel="fsdp").on
    zero3 = decide(
        SplitProductsPart(), split_products="auto", on_gpu=True, compiled=True, parallel="deepspeed"
    )
    assert not zero3.on and zero3.note and "train.parallel=deepspeed" in zero3.note


@pytest.mark.parametrize(
    ("fused", "last_rows"),
    [(False, False), (True, False), (True, True)],
    ids=["peft-qkv", "fused", "last-rows"],
)
def test_split_products_give_the_same_output_and_gradients_in_float64(fused, last_rows):
    model = lora_model(dtype=torch.float64, dropout=0.0)
    plain = copy.deepcopy(model)
    if fused:
        fuse_qkv(model)
    layers = list(model.get_base_model().model.layers)
    changed = split_products(layers, HIDDEN)
    assert changed == len(layers) * (PER_LAYER + (1 if fused else 0))  # + the fused q/k/v product
    ids = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(1))
    rows = torch.tensor([3, 5, 17, 30, 47])
    results = []
    for net in (model, plain):
        if last_rows:
            LastMlpRows.attach(list(net.get_base_model().model.layers)).use(rows)
        hidden = net(input_ids=ids, output_hidden_states=True).hidden_states[-1].flatten(0, 1)
        hidden = hidden[rows] if last_rows else hidden
        hidden.square().mean().backward()
        grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
        results.append((hidden.detach(), grads))
    (hidden, grads), (plain_hidden, plain_grads) = results
    assert_close_to_scale(hidden, plain_hidden, rel=FLOAT64_REORDERED)
    assert grads.keys() == plain_grads.keys() and len(grads) == 2 * len(layers) * len(QKVO)
    for name in grads:
        assert_close_to_scale(grads[name], plain_grads[name], rel=FLOAT64_REORDERED, msg=name)


def test_only_frozen_plain_linears_change_and_true_with_none_is_an_error():
    model = lora_model(dtype=torch.float32, dropout=0.0)
    layers = list(model.get_base_model().model.layers)
    layers[0].mlp.down_proj.weight.requires_grad_(True)  # a trained projection: left as it is
    forward = layers[0].mlp.down_proj.forward
    assert split_products(layers, HIDDEN) == len(layers) * PER_LAYER - 1
    assert layers[0].mlp.down_proj.forward == forward
    assert split_products(layers, 256) == 0  # no side of a power-of-two width is split
    with pytest.raises(UsageError, match=r"^train.step.split_products=true: no frozen linear"):
        split_products(layers, 4096, required=True)


@pytest.mark.slow  # 3-10 s on 2 cores (2026-11-27 profile of the inner loop)
@pytest.mark.parametrize("ends", [[7], [4, 7], [1, 3, 7]])
def test_the_column_grouped_product_is_the_whole_product_in_one_plain_buffer(ends):
    generator = torch.Generator().manual_seed(len(ends))
    a = torch.randn(5, 6, dtype=torch.float64, generator=generator)
    b = torch.randn(6, 7, dtype=torch.float64, generator=generator)
    out = column_grouped_mm(a, b, ends)
    assert out.is_contiguous() and out.shape == (5, 7)
    assert_close_to_scale(out, a @ b, rel=FLOAT64_REORDERED)  # every column group written
    compiled = torch.compile(lambda a, b: column_grouped_mm(a, b, ends) * 2, fullgraph=True)
    assert_close_to_scale(compiled(a, b), 2 * (a @ b), rel=FLOAT64_REORDERED)


@pytest.mark.slow
def test_split_layers_compile_in_one_graph_and_match_eager():
    """The trainer compiles each decoder layer: the grouped products (an autograd function and its joins)
    must trace without a graph break (fullgraph) in the MLP and in the fused attention, and give the eager
    answer, gradient included (float64: the graph may sum in another order)."""
    model = lora_model(dtype=torch.float64, dropout=0.0)
    fuse_qkv(model)
    base = model.get_base_model().model
    split_products([base.layers[0]], HIDDEN)
    x = torch.randn(2, 16, HIDDEN, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    cos_sin = base.rotary_emb(x, torch.arange(16).expand(2, -1))
    for module, extra in ((base.layers[0].mlp, ()), (base.layers[0].self_attn, (cos_sin, None))):
        results = []
        for call in (torch.compile(module, backend="aot_eager", fullgraph=True), module):
            inputs = x.clone().requires_grad_()
            out = call(inputs, *extra)
            out = out[0] if isinstance(out, tuple) else out
            out.square().mean().backward()
            results.append((out.detach(), inputs.grad))
        (out, grad), (eager_out, eager_grad) = results
        assert_close_to_scale(out, eager_out, rel=FLOAT64_REORDERED)
        assert_close_to_scale(grad, eager_grad, rel=FLOAT64_REORDERED)

"""finetune/split_products.py on the tiny model: the MLP with its hidden-size products split into column
groups computes what transformers' MLP computes, output and every gradient (float64), the groups are the
largest power of two and the rest, and only MLPs of three frozen bias-free linears are changed."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
from test_finetune_fused_qkv import QKVO, lora_model  # noqa: E402

from gpuval.errors import UsageError  # noqa: E402
from gpuval.finetune.kernels import LastMlpRows  # noqa: E402
from gpuval.finetune.split_products import (  # noqa: E402
    column_groups,
    resolve_split_products,
    split_mlp_products,
)


def test_column_groups_are_the_largest_power_of_two_and_the_rest():
    assert column_groups(3584) == [2048, 1536]  # Qwen2-7B
    assert column_groups(192) == [128, 64]  # the tiny model
    assert column_groups(4096) == [4096]  # a power of two stays whole
    assert column_groups(5120) == [4096, 1024]
    assert column_groups(1) == [1]
    with pytest.raises(ValueError):
        column_groups(0)


def test_setting_auto_means_compiled_layers_on_a_gpu():
    assert resolve_split_products("auto", on_gpu=True, compiled=True)
    assert not resolve_split_products("auto", on_gpu=True, compiled=False)
    assert not resolve_split_products("auto", on_gpu=False, compiled=True)
    assert resolve_split_products(True, on_gpu=False, compiled=False)
    assert not resolve_split_products(False, on_gpu=True, compiled=True)


@pytest.mark.parametrize("last_rows", [False, True], ids=["all-rows", "with-last-mlp-rows"])
def test_split_mlp_gives_the_whole_products_output_and_gradients_in_float64(last_rows):
    model = lora_model(dtype=torch.float64, dropout=0.0)
    plain = copy.deepcopy(model)
    layers = list(model.get_base_model().model.layers)
    assert split_mlp_products(layers) == len(layers)
    ids = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(1))
    rows = torch.tensor([3, 5, 17, 30, 47])
    results = []
    for net in (model, plain):
        if last_rows:
            mlp_rows = LastMlpRows.attach(list(net.get_base_model().model.layers))
            mlp_rows.use(rows)
        hidden = net(input_ids=ids, output_hidden_states=True).hidden_states[-1]
        loss = hidden.flatten(0, 1)[rows].square().mean() if last_rows else hidden.square().mean()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
        results.append((hidden.detach(), grads))
    (hidden, grads), (plain_hidden, plain_grads) = results
    picked = hidden.flatten(0, 1)[rows] if last_rows else hidden
    plain_picked = plain_hidden.flatten(0, 1)[rows] if last_rows else plain_hidden
    torch.testing.assert_close(picked, plain_picked, rtol=1e-12, atol=1e-12)
    assert grads.keys() == plain_grads.keys() and len(grads) == 2 * len(layers) * len(QKVO)
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], rtol=1e-10, atol=1e-12)


def test_only_mlps_of_three_frozen_plain_linears_change_and_true_with_none_is_an_error():
    model = lora_model(dtype=torch.float32, dropout=0.0)
    layers = list(model.get_base_model().model.layers)
    layers[0].mlp.down_proj.weight.requires_grad_(True)  # a trained projection: left as it is
    forward = layers[0].mlp.forward
    assert split_mlp_products(layers) == len(layers) - 1
    assert layers[0].mlp.forward == forward
    with pytest.raises(UsageError, match=r"^train.split_products=true: no MLP"):
        split_mlp_products(layers[:1], required=True)


@pytest.mark.slow
def test_a_split_mlp_compiles_in_one_graph_and_matches_eager():
    """The trainer compiles each decoder layer: the grouped products (two autograd functions and their joins)
    must trace without a graph break (fullgraph) and give the eager answer, gradient included."""
    model = lora_model(dtype=torch.float32, dropout=0.0)
    mlp = model.get_base_model().model.layers[0].mlp
    split_mlp_products([model.get_base_model().model.layers[0]])
    x = torch.randn(2, 16, 192, generator=torch.Generator().manual_seed(2))
    results = []
    for call in (torch.compile(mlp, backend="aot_eager", fullgraph=True), mlp):
        inputs = x.clone().requires_grad_()
        out = call(inputs)
        out.square().mean().backward()
        results.append((out.detach(), inputs.grad))
    (out, grad), (eager_out, eager_grad) = results
    torch.testing.assert_close(out, eager_out)
    torch.testing.assert_close(grad, eager_grad)

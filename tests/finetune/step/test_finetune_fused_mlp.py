"""finetune/step/fused_mlp.py: the fused gate/up computes what the MLP's two products compute (a hand-checked
MLP exactly, the tiny model's loss and LoRA gradients in float64), shares one weight with the projections,
leaves the state dict and the adapter as they were, refuses a call order it was not built for, leaves MLPs
with LoRA on gate/up alone, and in FP8 quantises the concatenated weight once, which
fp8.convert_frozen_linears then leaves alone (PyTorch's CPU `_scaled_mm`, as
tests/finetune/step/test_finetune_fp8.py)."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
from conftest import (  # noqa: E402
    FLOAT64_REORDERED,
    NEEDS_CPU_ROWWISE_FP8,
    assert_close_to_adamw_steps,
    assert_close_to_scale,
    cpu_rowwise_scaled_mm,
)
from finetune_runs import config_dict, lora_weights  # noqa: E402
from step_parts import decide  # noqa: E402
from test_finetune_fused_qkv import FLOAT64_SUMS, QKVO, lora_model, relative  # noqa: E402

from gpuval.errors import UsageError  # noqa: E402
from gpuval.finetune.model import apply_lora, load_model  # noqa: E402
from gpuval.finetune.step.fused_mlp import FusedGateUpPart, GateUpHalf, fuse_gate_up  # noqa: E402

INTERMEDIATE = 576  # the tiny model's intermediate_size (hidden 192)


class _SwiGLU(torch.nn.Module):
    """transformers' Qwen2MLP, small enough to check by hand."""

    def __init__(self, gate: torch.nn.Linear, up: torch.nn.Linear) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = gate, up
        self.down_proj = torch.nn.Linear(gate.out_features, gate.in_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def _frozen_linear(weight: list[list[float]], bias: list[float]) -> torch.nn.Linear:
    layer = torch.nn.Linear(2, 2)
    layer.weight = torch.nn.Parameter(torch.tensor(weight, dtype=torch.float32), requires_grad=False)
    layer.bias = torch.nn.Parameter(torch.tensor(bias, dtype=torch.float32), requires_grad=False)
    return layer


def test_a_hand_checked_mlp_gives_both_halves_and_one_input_gradient():
    mlp = _SwiGLU(_frozen_linear([[1, 2], [3, 4]], [1, 0]), _frozen_linear([[5, 6], [7, 8]], [0, -1]))
    assert fuse_gate_up(mlp) == 1
    x = torch.tensor([1.0, 1.0], requires_grad=True)
    gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    assert gate.tolist() == [1 + 2 + 1, 3 + 4 + 0] and up.tolist() == [5 + 6 + 0, 7 + 8 - 1]
    # d(gate_0 + up_1)/dx = row 0 of W_gate + row 1 of W_up, from one product over [W_gate; W_up]
    (gate[0] + up[1]).backward()
    assert x.grad.tolist() == [1 + 7, 2 + 8]
    assert mlp.gate_proj.bias.tolist() == [1, 0] and mlp.up_proj.bias.tolist() == [0, -1]


def _mlps(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [layer.mlp for layer in model.get_base_model().model.layers]


def test_fused_gate_up_gives_the_unfused_loss_and_lora_gradients_in_float64():
    fused = lora_model()
    plain = copy.deepcopy(fused)
    assert fuse_gate_up(fused) == len(_mlps(fused))
    ids = torch.randint(3, 3000, (2, 40), generator=torch.Generator().manual_seed(1))
    losses = [m(input_ids=ids, labels=ids).loss for m in (fused, plain)]
    assert relative(*losses) < FLOAT64_SUMS  # one product over the concatenation: the same dot products
    for loss in losses:
        loss.backward()
    grads = [{n: p.grad for n, p in m.named_parameters() if p.requires_grad} for m in (fused, plain)]
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == 2 * len(QKVO) * len(_mlps(fused))
    for name in grads[1]:
        assert relative(grads[0][name], grads[1][name]) < FLOAT64_SUMS, name


def test_gate_and_up_weights_are_views_of_the_concatenated_one_and_the_state_dict_is_unchanged():
    model = lora_model()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    fuse_gate_up(model)
    for mlp in _mlps(model):
        assert type(mlp.gate_proj) is GateUpHalf and type(mlp.up_proj) is GateUpHalf
        concatenated = mlp.gate_proj.fused.base.weight
        assert concatenated.shape == (2 * INTERMEDIATE, 192)
        assert mlp.gate_proj.weight.data_ptr() == concatenated[0].data_ptr()  # a view, no second copy
        assert mlp.up_proj.weight.data_ptr() == concatenated[INTERMEDIATE].data_ptr()
        assert not mlp.gate_proj.weight.requires_grad and not mlp.up_proj.weight.requires_grad
    after = model.state_dict()
    assert list(after) == list(before)  # the same keys in the same order, gate/up weights included
    assert all(torch.equal(after[name], before[name]) for name in before)


def test_the_adapter_saves_as_before_and_loads_with_plain_peft(tmp_path):
    from peft import PeftModel

    fused = lora_model(dtype=torch.float32)
    plain = copy.deepcopy(fused)
    fuse_gate_up(fused)
    fused.save_pretrained(tmp_path / "fused")
    plain.save_pretrained(tmp_path / "plain")
    saved, reference = lora_weights(tmp_path / "fused"), lora_weights(tmp_path / "plain")
    assert saved.keys() == reference.keys() and all(torch.equal(saved[k], reference[k]) for k in saved)
    loaded = PeftModel.from_pretrained(load_model("tiny", torch.float32), tmp_path / "fused").eval()
    ids = torch.randint(3, 3000, (1, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = loaded(input_ids=ids).logits
        # float32 sums of one product over the concatenated weights, in another order than two products
        assert relative(fused.eval()(input_ids=ids).logits, logits) < 1e-5


def test_projections_called_out_of_order_are_an_error_not_a_wrong_result():
    model = lora_model()
    fuse_gate_up(model)
    mlp = _mlps(model)[0]
    x = torch.randn(1, 3, 192, dtype=torch.float64)
    with pytest.raises(
        RuntimeError, match=r"^fused gate/up: up_proj was called out of order .*fuse_gate_up=false$"
    ):
        mlp.up_proj(x)
    mlp.gate_proj(x)
    with pytest.raises(RuntimeError, match="gate_proj was called out of order"):
        mlp.gate_proj(x)
    with pytest.raises(RuntimeError, match="up_proj was called out of order"):
        mlp.up_proj(x.clone())  # equal values, another tensor: the pending half is x's, not this one's
    up = mlp.up_proj(x)
    # the up half of one product over [W_gate; W_up] against a product over W_up alone: the same sums, which
    # a CPU's kernels may add in another order for the wider product
    assert_close_to_scale(up, torch.nn.functional.linear(x, mlp.up_proj.weight), rel=FLOAT64_REORDERED)
    with pytest.raises(RuntimeError, match="up_proj was called out of order"):
        mlp.up_proj(x)


@pytest.mark.parametrize(
    ("targets", "fused"),
    [
        ("all-linear", 0),
        (["q_proj", "gate_proj"], 0),
        (["q_proj", "up_proj"], 0),
        (["q_proj", "down_proj"], 6),
    ],
)
def test_mlps_with_lora_on_gate_or_up_are_left_as_they_are(targets, fused):
    from peft.tuners.lora.layer import Linear as LoraLinear

    model = apply_lora(load_model("tiny", torch.float32), 8, 16, 0.0, targets)
    before = {name: type(module) for name, module in model.named_modules()}
    assert fuse_gate_up(model) == fused
    if not fused:
        assert {name: type(module) for name, module in model.named_modules()} == before
        assert any(
            type(getattr(mlp, name)) is LoraLinear
            for mlp in _mlps(model)
            for name in ("gate_proj", "up_proj")
        )
    else:
        assert all(
            type(mlp.down_proj) is LoraLinear and type(mlp.gate_proj) is GateUpHalf for mlp in _mlps(model)
        )


def test_fuse_gate_up_setting_per_device_and_parallelism():
    def on(setting, **context) -> bool:
        return decide(FusedGateUpPart(), experimental={"fuse_gate_up": setting}, **context).on

    assert on("auto", on_gpu=True, parallel="ddp") is True
    assert on("auto", on_gpu=False, parallel="ddp") is False
    assert on("auto", on_gpu=True, parallel="fsdp") is False
    assert on("auto", on_gpu=True, parallel="deepspeed") is False
    assert on(True, on_gpu=False, parallel="ddp") is True  # the tests use it
    assert on(False, on_gpu=True, parallel="ddp") is False
    off = decide(FusedGateUpPart(), experimental={"fuse_gate_up": "auto"}, on_gpu=True, parallel="fsdp")
    assert off.note and "fused_gate_up off under train.parallel=fsdp" in off.note  # said, not silent
    for parallel in ("fsdp", "deepspeed"):
        with pytest.raises(UsageError) as caught:
            decide(FusedGateUpPart(), experimental={"fuse_gate_up": True}, on_gpu=True, parallel=parallel)
        message = str(caught.value)
        assert "\n" not in message and message.endswith("set train.experimental.fuse_gate_up=auto")
        assert message.startswith(
            f"train.experimental.fuse_gate_up=true works with train.parallel=ddp only ({parallel}"
        )


fp8_available = pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="this PyTorch has no float8")


@fp8_available
def test_fp8_quantises_the_concatenated_weight_once_and_convert_frozen_linears_leaves_it_alone():
    from gpuval.finetune.parallel.modes import decoder_layers
    from gpuval.finetune.step.fp8 import Fp8Linear, convert_frozen_linears, quantize_rows

    model = lora_model(dtype=torch.bfloat16)
    plain = copy.deepcopy(model)
    mlp = _mlps(model)[0]
    originals = [mlp.gate_proj.weight.detach().clone(), mlp.up_proj.weight.detach().clone()]
    assert fuse_gate_up(model, fp8=True) == len(_mlps(model))
    base = mlp.gate_proj.fused.base
    assert type(base) is Fp8Linear and base.out_features == 2 * INTERMEDIATE
    # row-wise scales: quantising the concatenation row by row is quantising each projection
    for rows, original in zip((slice(0, INTERMEDIATE), slice(INTERMEDIATE, None)), originals, strict=True):
        values, scales = quantize_rows(original)
        assert torch.equal(base.weight_fp8[rows].float(), values.float())
        assert torch.equal(base.weight_scale[:, rows], scales.T)
    assert list(mlp.gate_proj.parameters()) == [] and list(mlp.up_proj.parameters()) == []  # no bf16 copy

    # the trainer's order: fuse, then convert the rest (q, k, v, o under LoRA and down: 5, not 7)
    layers = len(_mlps(model))
    assert convert_frozen_linears(decoder_layers(model)) == layers * 5
    assert convert_frozen_linears(decoder_layers(plain)) == layers * 7
    assert type(mlp.gate_proj) is GateUpHalf and mlp.gate_proj.fused.base is base  # the fused forward stays
    assert type(mlp.down_proj) is Fp8Linear
    # one FP8 copy of gate/up: none in the state dict, as for the converted plain model
    assert set(model.state_dict()) == set(plain.state_dict())


@pytest.mark.skipif(not cpu_rowwise_scaled_mm(), reason=NEEDS_CPU_ROWWISE_FP8)
def test_fp8_mlp_quantises_x_once_and_computes_one_input_gradient_product(monkeypatch):
    """The real _scaled_mm (CPU) wrapped to record each product: one forward product of 2 × 576 columns for
    gate and up, and one input-gradient product of inner dimension 2 × 576; the forward multiplies the
    unfused FP8 MLP's quantised operands, bit for bit, to its gate and up within one bf16 rounding; the input
    gradient is within the e4m3 bound of tests/finetune/step/test_finetune_fp8.py for one product over the
    concatenated weight."""
    from test_finetune_fp8 import product_bound

    from gpuval.finetune.parallel.modes import decoder_layers
    from gpuval.finetune.step.fp8 import FP8_MAX, convert_frozen_linears

    model = lora_model(dtype=torch.bfloat16)
    plain = copy.deepcopy(model)
    weight = torch.cat([_mlps(model)[0].gate_proj.weight, _mlps(model)[0].up_proj.weight]).detach()
    fuse_gate_up(model, fp8=True)
    for net in (model, plain):
        convert_frozen_linears(decoder_layers(net))
    real, calls = torch._scaled_mm, []

    def recording(a, b, **kwargs):
        out = real(a, b, **kwargs)
        calls.append((a, b, kwargs["scale_a"], kwargs["scale_b"], out))
        return out

    monkeypatch.setattr(torch, "_scaled_mm", recording)
    x = torch.randn(10, 192, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    results = []
    for net in (model, plain):
        calls.clear()
        leaf = x.clone().requires_grad_()
        out = _mlps(net)[0](leaf)
        out.float().square().sum().backward()
        results.append((out.detach(), list(calls)))
    (fused_out, fused_calls), (plain_out, plain_calls) = results
    fused_shapes = [(tuple(a.shape), tuple(b.shape)) for a, b, *_ in fused_calls]
    assert fused_shapes == [
        ((10, 192), (192, 2 * INTERMEDIATE)),  # gate and up: x quantised once
        ((10, INTERMEDIATE), (INTERMEDIATE, 192)),  # down
        ((10, 192), (192, INTERMEDIATE)),  # down's input gradient
        ((10, 2 * INTERMEDIATE), (2 * INTERMEDIATE, 192)),  # gate and up's: one product, inner 2 × 576
    ]
    assert len(plain_calls) == 6  # gate, up, down forward; their three input gradients

    # gate and up: x quantised once, to the bits the unfused MLP multiplies for each; the concatenated
    # weight's columns (and scales) are the two weights' (quantised row by row)
    fused_x, fused_w, fused_x_scale, fused_w_scale, fused_gate_up = fused_calls[0]
    (gate_x, gate_w, gate_x_scale, gate_w_scale, gate), (up_x, up_w, up_x_scale, up_w_scale, up) = (
        plain_calls[:2]
    )
    for quantised, scale in ((gate_x, gate_x_scale), (up_x, up_x_scale)):
        assert torch.equal(fused_x.float(), quantised.float()) and torch.equal(fused_x_scale, scale)
    assert torch.equal(fused_w.float(), torch.cat([gate_w, up_w], dim=1).float())
    assert torch.equal(fused_w_scale, torch.cat([gate_w_scale, up_w_scale], dim=1))
    # one product of 1,152 columns against two of 576: the same float32 sums (192 terms), which a CPU's
    # kernels may add in another order, rounded to bf16: a value near a rounding boundary may land one bf16
    # step away (7 stored bits: at most 2^-7 of itself); the float32 sums' own difference (192 × 2^-24 of
    # their terms) is far below 2^-7 of the largest
    plain_gate_up = torch.cat([gate, up], dim=1)
    assert_close_to_scale(fused_gate_up, plain_gate_up, rel=2**-7)
    # down, from those halves: the very same product of the very same operands where the halves are equal
    # bit for bit (kernels that add both widths in one order, as this CPU's); else its input, quantised to
    # e4m3 (3 mantissa bits), may move a value by one e4m3 step, 2^-3 of itself
    if torch.equal(fused_gate_up, plain_gate_up):
        assert torch.equal(fused_out, plain_out)
    else:
        assert_close_to_scale(fused_out, plain_out, rel=2**-3)

    # the fused input gradient against float64 for a gradient given at the gate/up output
    mlp = _mlps(model)[0]
    grad_out = torch.randn(10, 2 * INTERMEDIATE, generator=torch.Generator().manual_seed(6)).to(
        torch.bfloat16
    )
    leaf = x.clone().requires_grad_()
    gate, up = mlp.gate_proj(leaf), mlp.up_proj(leaf)
    torch.autograd.backward([gate, up], [grad_out[:, :INTERMEDIATE], grad_out[:, INTERMEDIATE:]])
    reference = grad_out.double() @ weight.double()
    grad_scales = grad_out.float().abs().amax(dim=1, keepdim=True) / FP8_MAX
    weight_t_scales = weight.float().abs().amax(dim=0).reshape(-1, 1) / FP8_MAX  # per input channel
    bound = product_bound(grad_out, grad_scales, weight.T, weight_t_scales)
    error = (leaf.grad.double() - reference).abs()
    assert (error <= bound).all(), float((error - bound).max())


@pytest.mark.slow
@pytest.mark.parametrize(
    "fp8",
    [
        False,
        pytest.param(
            True, marks=pytest.mark.skipif(not cpu_rowwise_scaled_mm(), reason=NEEDS_CPU_ROWWISE_FP8)
        ),
    ],
    ids=["bf16-path", "fp8"],
)
def test_a_compiled_mlp_traces_fused_gate_up_in_one_graph(fp8):
    """The trainer compiles each decoder layer on a GPU: the gate/up bookkeeping (pending half, the input
    identity check) must trace without a graph break. Dynamo and AOT autograd run here (aot_eager,
    fullgraph); inductor's code generation is the GPU run's."""
    dtype = torch.bfloat16 if fp8 else torch.float32
    model = lora_model(dtype=dtype)
    plain = copy.deepcopy(model)
    fuse_gate_up(model, fp8=fp8)
    x = torch.randn(2, 16, 192, generator=torch.Generator().manual_seed(4)).to(dtype)
    results = []
    for net, compiled in ((model, True), (plain, False)):
        mlp = _mlps(net)[0]
        call = torch.compile(mlp, backend="aot_eager", fullgraph=True) if compiled else mlp
        inputs = x.clone().requires_grad_()
        out = call(inputs)
        out.float().square().mean().backward()
        results.append((out.detach().float(), inputs.grad.float()))
    (out, grad), (plain_out, plain_grad) = results
    fused = _mlps(model)[0].gate_proj.fused
    assert fused.pending is None and fused.input is None  # the graph's side effects ran: ready for the next
    if fp8:  # two factors each within 2^-4 of themselves: a loose check (the test above is exact)
        assert relative(out, plain_out) < 2 * 2**-4 and relative(grad, plain_grad) < 2 * 2**-4
    else:
        assert relative(out, plain_out) < 1e-6 and relative(grad, plain_grad) < 1e-6


@pytest.mark.slow
def test_train_fused_matches_unfused_step_for_step(runtime, train_file, tmp_path):  # noqa: F811
    from gpuval.finetune.config import finetune_config_from_dict
    from gpuval.finetune.trainer import train

    losses, adapters, lrs = {}, {}, {}
    for fuse in (False, True):
        data = config_dict(
            train_file,
            tmp_path / str(fuse),
            max_steps=3,
            experimental={"fuse_gate_up": fuse},
            log={"tensorboard": False},
        )
        data["lora"]["target_modules"] = QKVO
        summary = train(finetune_config_from_dict(data), runtime)
        assert summary["fused_gate_up"] is fuse
        losses[fuse], lrs[fuse] = [s["loss"] for s in summary["steps"]], [s["lr"] for s in summary["steps"]]
        adapters[fuse] = lora_weights(tmp_path / str(fuse) / "adapter")
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)  # float32: the same training
    assert lrs[True] == lrs[False]
    assert adapters[True].keys() == adapters[False].keys()
    for key in adapters[False]:  # float32 sums in another order, magnified by AdamW (conftest)
        assert_close_to_adamw_steps(
            adapters[True][key], adapters[False][key], lr_sum=sum(lrs[False]), msg=key
        )


def test_fuse_gate_up_true_with_lora_on_every_linear_is_a_one_line_error(runtime, train_file, tmp_path):  # noqa: F811
    from gpuval.finetune.config import finetune_config_from_dict
    from gpuval.finetune.trainer import train

    data = config_dict(
        train_file, tmp_path / "run", experimental={"fuse_gate_up": True}
    )  # target_modules: all-linear
    with pytest.raises(
        UsageError,
        match=r"^train.experimental.fuse_gate_up=true: no MLP .* set train.experimental.fuse_gate_up=false$",
    ):
        train(finetune_config_from_dict(data), runtime, save_adapter=False, quiet=True)

"""finetune/step/fp8.py: row-wise e4m3 quantisation, the FP8 linear layer's output and input gradient, the
device check, and where the trainer puts FP8 layers.

PyTorch's CPU build implements `torch._scaled_mm` for float8 with row-wise scales (it dequantises and
multiplies in float32), so these tests run the real `Fp8Linear` on a CPU: what they cannot see is the GPU
kernel's own accumulation (fast accumulation in the forward product), which the device run's loss curve
covers (benchmarks/fp8_loss.py). The error bounds below follow from e4m3's format, not from tuning:

- e4m3 keeps 3 mantissa bits, so rounding to nearest moves a normal value by at most 2⁻⁴ of itself; below
  its smallest normal (2⁻⁶ after scaling) values are spaced 2⁻⁹ apart: at most 2⁻¹⁰·scale there;
- a product Σ x̂ŵ of quantised factors then errs by at most Σ (eₓ|w| + |x|e_w + eₓe_w), plus float32
  accumulation (K·2⁻²⁴ of Σ|x̂ŵ|) and the bf16 result's rounding (2⁻⁸ of it: 7 stored mantissa bits).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
from conftest import NEEDS_CPU_ROWWISE_FP8, cpu_rowwise_scaled_mm  # noqa: E402
from finetune_runs import config_dict  # noqa: E402
from step_parts import decide  # noqa: E402

from gpuval.errors import UsageError  # noqa: E402
from gpuval.finetune.step.fp8 import (  # noqa: E402
    FP8_MAX,
    Fp8BasePart,
    Fp8Linear,
    _Fp8LinearFunction,
    convert_frozen_linears,
    excluded_linears,
    quantize_rows,
)

MANTISSA_HALF_ULP = 2.0**-4  # e4m3: 3 mantissa bits, round to nearest
SUBNORMAL_HALF_SPACING = 2.0**-10  # e4m3 subnormals are 2^-9 apart (in units of the scale)
BF16_ROUNDING = 2.0**-8  # bf16: 7 stored mantissa bits
FP32_EPS = 2.0**-24
# the tests that run the real FP8 product on this CPU (the others check quantisation and wiring alone)
rowwise_product = pytest.mark.skipif(not cpu_rowwise_scaled_mm(), reason=NEEDS_CPU_ROWWISE_FP8)

pytestmark = pytest.mark.skipif(
    not hasattr(torch, "float8_e4m3fn"), reason="this PyTorch has no float8_e4m3fn"
)


def element_bound(x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The most that quantising `x` (rows scaled by `scales`, shape (rows, 1)) can move each element."""
    x, scales = x.double(), scales.double()
    return torch.maximum(MANTISSA_HALF_ULP * x.abs(), SUBNORMAL_HALF_SPACING * scales.expand_as(x))


def product_bound(
    a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor
) -> torch.Tensor:
    """Bound on |fp8(a) fp8(b)ᵀ - a bᵀ| for a (M, K) scaled per row of a and b (N, K) scaled per row of b,
    with a bf16 result (module docstring)."""
    a, b = a.double(), b.double()
    ea, eb = element_bound(a, a_scales), element_bound(b, b_scales)
    quantised = ea @ b.abs().T + a.abs() @ eb.T + ea @ eb.T
    magnitude = (a.abs() + ea) @ (b.abs() + eb).T
    exact = a @ b.T
    before_rounding = quantised + a.shape[1] * FP32_EPS * magnitude
    return before_rounding + BF16_ROUNDING * (exact.abs() + before_rounding)


def test_quantize_rows_against_hand_computed_scales():
    rows = torch.tensor([[1.0, -2.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], [1344.0, 1.0, 0.0, -3.0]])
    values, scales = quantize_rows(rows)
    assert values.dtype == torch.float8_e4m3fn and scales.dtype == torch.float32 and scales.shape == (3, 1)
    # amax / 448 per row; an all-zero row keeps a tiny finite scale
    expected = torch.tensor([2.0, 1e-12, 1344.0], dtype=torch.float32).div(448.0).reshape(3, 1)
    assert torch.equal(scales, expected)
    assert scales[2, 0] == 3.0 and FP8_MAX == 448.0
    # 1 / (2/448) = 224, -2 -> -448, 0.5 -> 112: all exact in e4m3; 1/3 rounds to 0.34375 (1.375 x 2^-2)
    assert values.float().tolist() == [
        [224.0, -448.0, 112.0, 0.0],
        [0.0, 0.0, 0.0, 0.0],
        [448.0, 0.34375, 0.0, -1.0],
    ]


def test_round_trip_error_is_within_the_e4m3_bound_for_every_element():
    generator = torch.Generator().manual_seed(0)
    magnitude = 10.0 ** torch.empty(64, 256).uniform_(-4, 3, generator=generator)  # 7 decades per row
    x = torch.randn(64, 256, generator=generator) * magnitude
    values, scales = quantize_rows(x)
    back = values.double() * scales.double()
    error = (back - x.double()).abs()
    assert torch.isfinite(back).all()
    assert (error <= element_bound(x, scales)).all()
    # every row's largest value lands on e4m3's largest: the whole range is used
    assert torch.equal(values.float().abs().amax(dim=1), torch.full((64,), FP8_MAX))
    normal = x.abs() >= 2.0**-6 * scales  # normal e4m3 after scaling: within 2^-3 relative, as issue 23 asks
    assert (error[normal] <= 2.0**-3 * x.double().abs()[normal]).all()


def _layer(
    in_features: int = 64, out_features: int = 48, bias: bool = True, seed: int = 1
) -> torch.nn.Linear:
    torch.manual_seed(seed)
    layer = torch.nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)  # the training dtype
    layer.requires_grad_(False)
    return layer


@rowwise_product
def test_fp8_linear_output_and_input_gradient_against_float32_within_the_derived_bound():
    linear = _layer()
    fp8 = Fp8Linear.from_linear(linear)
    generator = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 5, 64, generator=generator) * torch.linspace(0.01, 30, 64)).requires_grad_()
    y = fp8(x)
    assert y.dtype == torch.bfloat16 and y.shape == (3, 5, 48)

    w = linear.weight.double()
    flat_x = x.detach().reshape(-1, 64)
    reference = flat_x.double() @ w.T + linear.bias.double()
    x_scales = flat_x.abs().amax(dim=1, keepdim=True) / FP8_MAX
    w_scales = linear.weight.float().abs().amax(dim=1, keepdim=True) / FP8_MAX
    bound = product_bound(flat_x, x_scales, linear.weight, w_scales)
    error = (y.reshape(-1, 48).double() - reference).abs()
    assert (error <= bound).all(), float((error - bound).max())

    grad_out = torch.randn(3, 5, 48, generator=generator).to(torch.bfloat16)  # y is bf16: so is its gradient
    y.backward(grad_out)
    assert x.grad is not None and x.grad.dtype == torch.float32
    flat_g = grad_out.reshape(-1, 48)
    reference_grad = flat_g.double() @ w
    g_scales = flat_g.float().abs().amax(dim=1, keepdim=True) / FP8_MAX
    wt_scales = linear.weight.float().abs().amax(dim=0).reshape(-1, 1) / FP8_MAX  # per input channel
    grad_bound = product_bound(flat_g, g_scales, linear.weight.T, wt_scales)
    grad_error = (x.grad.reshape(-1, 64).double() - reference_grad).abs()
    assert (grad_error <= grad_bound).all(), float((grad_error - grad_bound).max())


@rowwise_product
def test_the_frozen_weight_gets_no_gradient_and_the_input_one_only_when_asked():
    fp8 = Fp8Linear.from_linear(_layer(bias=False))
    assert list(fp8.parameters()) == [] and list(fp8.buffers()) == []  # nothing to train, save or broadcast
    tensors = (fp8.weight_fp8, fp8.weight_scale, fp8.weight_back, fp8.weight_back_scale)
    x = torch.randn(4, 64, requires_grad=True)
    fp8(x).float().sum().backward()
    assert x.grad is not None and all(t.grad is None and not t.requires_grad for t in tensors)

    # An output that needs a gradient for something else (here, artificially, a scale), not for x: the
    # backward product for x is skipped (needs_input_grad) and x gets none.
    scale = fp8.weight_scale.clone().requires_grad_()
    plain_x = torch.randn(4, 64)
    out = _Fp8LinearFunction.apply(
        plain_x, fp8.weight_fp8, scale, fp8.weight_back, fp8.weight_back_scale, None, False
    )
    out.float().sum().backward()
    assert plain_x.grad is None and scale.grad is None


def _precision(precision: str, dtype: str, parallel: str, name: str | None, capability, **fp8) -> str:
    """The FP8 part's resolved `train.step.precision`; `fp8`: train.step.fp8 settings."""
    gpu = (name, capability) if name else None
    return decide(Fp8BasePart(), precision=precision, dtype=dtype, parallel=parallel, gpu=gpu, fp8=fp8).choice


def test_precision_is_checked_against_the_device_in_one_line_naming_what_to_use():
    assert _precision("bf16", "bfloat16", "ddp", None, None) == "bf16"
    # a float32 model (tiny-cpu.yaml) runs its products in float32, and its summary says so
    assert _precision("bf16", "float32", "ddp", None, None) == "float32"
    assert _precision("fp8-base", "bfloat16", "ddp", "NVIDIA H100 80GB HBM3", (9, 0)) == "fp8-base"
    with pytest.raises(UsageError) as on_cpu:
        _precision("fp8-base", "bfloat16", "ddp", None, None)
    with pytest.raises(UsageError) as on_a100:
        _precision("fp8-base", "bfloat16", "ddp", "NVIDIA A100-SXM4-80GB", (8, 0))
    for raised in (on_cpu, on_a100):
        message = str(raised.value)
        assert "\n" not in message and message.endswith("set train.step.precision=bf16")
        assert message.startswith(
            "train.step.precision=fp8-base needs an NVIDIA GPU of compute capability 9.0"
        )
    assert "CPU" in str(on_cpu.value)
    assert "NVIDIA A100-SXM4-80GB (compute capability 8.0)" in str(on_a100.value)
    with pytest.raises(UsageError, match=r"needs dtype: bfloat16 \(the config has float32\)"):
        _precision("fp8-base", "float32", "ddp", "NVIDIA H200", (9, 0))
    with pytest.raises(UsageError, match=r"train.parallel=ddp only \(not fsdp"):
        _precision("fp8-base", "bfloat16", "fsdp", "NVIDIA H200", (9, 0))


def _lora_model(dtype: torch.dtype = torch.bfloat16):
    from gpuval.finetune.model import apply_lora, load_model

    return apply_lora(load_model("tiny", dtype), 8, 16, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj"])


def test_fp8_settings_under_bf16_are_a_one_line_error_naming_the_setting():
    gpu = ("NVIDIA H100 80GB HBM3", (9, 0))
    for fast, input_grad, exclude, named in (
        (True, True, None, "fast_accum"),
        (False, False, None, "input_grad"),
        (False, True, ["*.mlp.*"], "exclude"),
        (False, True, [], "exclude"),  # every product in FP8: still an FP8 setting
    ):
        with pytest.raises(UsageError) as caught:
            _precision(
                "bf16", "bfloat16", "ddp", *gpu, fast_accum=fast, input_grad=input_grad, exclude=exclude
            )
        message = str(caught.value)
        assert "\n" not in message and message.startswith(
            f"train.step.fp8.{named} applies to train.step.precision=fp8-base"
        )
    # the defaults under bf16, and any of them under fp8-base, are accepted
    assert _precision("bf16", "bfloat16", "ddp", *gpu) == "bf16"
    assert _precision("fp8-base", "bfloat16", "ddp", *gpu, fast_accum=True, input_grad=False) == "fp8-base"


@rowwise_product
def test_fp8_goes_into_the_frozen_base_linears_only_and_lora_keeps_its_parameters():
    from peft.tuners.lora.layer import Linear as LoraLinear

    from gpuval.finetune.parallel.modes import decoder_layers

    model = _lora_model()
    trainable_before = {n: (p.dtype, p.shape) for n, p in model.named_parameters() if p.requires_grad}
    converted = convert_frozen_linears(decoder_layers(model))
    layers = model.get_base_model().model.layers
    assert converted == len(layers) * 7  # q, k, v, o under LoRA; gate, up, down
    lora_layers = [m for m in model.modules() if isinstance(m, LoraLinear)]
    assert len(lora_layers) == len(layers) * 4
    for lora in lora_layers:
        assert type(lora.base_layer) is Fp8Linear
        for adapter in (lora.lora_A["default"], lora.lora_B["default"]):
            assert type(adapter) is torch.nn.Linear and adapter.weight.requires_grad
            assert adapter.weight.dtype == torch.float32  # PEFT's adapters, untouched
    for layer in layers:
        assert all(type(getattr(layer.mlp, n)) is Fp8Linear for n in ("gate_proj", "up_proj", "down_proj"))
    head = model.get_base_model().get_output_embeddings()
    assert type(head) is torch.nn.Linear  # the output head stays bf16
    assert {n: (p.dtype, p.shape) for n, p in model.named_parameters() if p.requires_grad} == trainable_before
    assert convert_frozen_linears(decoder_layers(model)) == 0  # nothing left to convert

    ids = torch.randint(3, 3000, (1, 8))
    model(input_ids=ids).logits.float().sum().backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == set(trainable_before) and all("lora_" in n for n in with_grad)


@rowwise_product
@pytest.mark.parametrize("fast", [False, True])
def test_fast_accumulation_reaches_the_forward_product_only_and_the_fused_parts_keep_it(fast, monkeypatch):
    """`train.step.fp8.fast_accum` sets use_fast_accum of the forward product; the backward's is always off.
    The real _scaled_mm runs (CPU), wrapped to record what each call asked for."""
    real, asked = torch._scaled_mm, []

    def recording(*args, **kwargs):
        asked.append(kwargs["use_fast_accum"])
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", recording)
    fp8 = Fp8Linear.from_linear(_layer(), fast_accum=fast)
    part = fp8.rows(8, 24)  # a fused q/k/v part: a view of the concatenated layer
    assert part.fast_accum is fast and ("fast" in repr(part)) is fast
    x = torch.randn(4, 64, requires_grad=True)
    part(x).float().sum().backward()
    assert asked == [fast, False]


@rowwise_product
def test_bf16_input_gradient_keeps_the_fp8_forward_and_multiplies_by_the_original_weight():
    """`train.step.fp8.input_grad: false`: the forward is the FP8 one, the input gradient is exactly the bf16
    product with the original weight, and a fused q/k/v part slices that weight by output rows."""
    linear = _layer()
    fp8, bf16_grad = Fp8Linear.from_linear(linear), Fp8Linear.from_linear(linear, input_grad_fp8=False)
    assert "bf16 input gradient" in repr(bf16_grad) and "bf16" not in repr(fp8)
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(6, 64, generator=generator).to(torch.bfloat16)
    grad_out = torch.randn(6, 48, generator=generator).to(torch.bfloat16)
    grads = []
    for layer in (fp8, bf16_grad):
        leaf = x.clone().requires_grad_()
        out = layer(leaf)
        out.backward(grad_out)
        grads.append((out.detach(), leaf.grad))
    (out_a, grad_fp8), (out_b, grad_bf16) = grads
    assert torch.equal(out_a, out_b)  # the same FP8 forward
    # bf16 against the original weight: the very same product (operands, shapes, layout), bit for bit
    assert torch.equal(grad_bf16, grad_out @ linear.weight)
    assert not torch.equal(grad_fp8, grad_bf16)  # the FP8 backward rounds differently
    part = bf16_grad.rows(8, 24)
    assert part.weight_back.data_ptr() == linear.weight[8].data_ptr() or torch.equal(
        part.weight_back, linear.weight[8:24]
    )
    leaf = x.clone().requires_grad_()
    part(leaf).backward(grad_out[:, 8:24])
    assert torch.equal(leaf.grad, grad_out[:, 8:24] @ linear.weight[8:24])


def test_fused_qkv_in_fp8_quantises_the_concatenated_weight_once_and_shares_it():
    from gpuval.finetune.parallel.modes import decoder_layers
    from gpuval.finetune.step.fused_qkv import fuse_qkv

    model = _lora_model()
    attention = model.get_base_model().model.layers[0].self_attn
    originals = [
        getattr(attention, n).base_layer.weight.detach().clone() for n in ("q_proj", "k_proj", "v_proj")
    ]
    assert fuse_qkv(model, fp8=True) == len(model.get_base_model().model.layers)
    parts = [getattr(attention, n).base_layer for n in ("q_proj", "k_proj", "v_proj")]
    assert all(type(p) is Fp8Linear for p in parts)
    fused = attention.q_proj.forward.__self__.base
    assert type(fused) is Fp8Linear and fused.out_features == sum(p.out_features for p in parts)
    start = 0
    for part, original in zip(parts, originals, strict=True):
        assert part.weight_fp8.data_ptr() == fused.weight_fp8[start].data_ptr()  # a view, no second copy
        # row-wise scales: quantising the concatenation row by row is quantising each part
        values, scales = quantize_rows(original)
        assert torch.equal(part.weight_fp8.float(), values.float()) and torch.equal(
            part.weight_scale, scales.T
        )
        start += part.out_features
    # the rest of the layer converts around it; the fused parts are not converted twice
    assert convert_frozen_linears(decoder_layers(model)) == len(model.get_base_model().model.layers) * 4


def test_fp8_on_a_cpu_is_refused_before_loading(runtime, train_file, tmp_path, monkeypatch):  # noqa: F811
    import gpuval.finetune.step.build as step
    import gpuval.finetune.trainer as trainer
    from gpuval.finetune.config import finetune_config_from_dict

    def no_load(*_args, **_kwargs):
        raise AssertionError("the model was loaded before the precision was checked")

    monkeypatch.setattr(step, "load_model", no_load)
    data = config_dict(train_file, tmp_path / "run", step={"precision": "fp8-base"})
    data["dtype"] = "bfloat16"
    with pytest.raises(UsageError, match=r"^train.step.precision=fp8-base needs .* this run is on the CPU"):
        trainer.train(finetune_config_from_dict(data), runtime, save_adapter=False, quiet=True)


@rowwise_product
@pytest.mark.slow
def test_train_in_fp8_on_the_cpu_path_saves_a_peft_adapter(runtime, train_file, tmp_path, monkeypatch):  # noqa: F811
    """The trainer's FP8 wiring end to end, through PyTorch's CPU `_scaled_mm` (the device check is
    bypassed: a real run refuses the CPU, test above). bf16 matrix products are slow on this CPU, so two
    short steps; the loss comparison over 200 steps is the device's (benchmarks/fp8_loss.py)."""
    import math

    from peft import PeftModel

    import gpuval.finetune.step.fp8 as fp8
    import gpuval.finetune.trainer as trainer
    from gpuval.finetune.config import finetune_config_from_dict
    from gpuval.finetune.model import load_model

    converted: list[int] = []
    convert = fp8.convert_frozen_linears

    def counting(layers, **options):
        exclude = options.pop("exclude")
        assert options == {"fast_accum": False, "input_grad_fp8": True}  # the defaults
        assert exclude == {id(layer.mlp.down_proj.base_layer) for layer in layers}  # fp8_exclude, below
        converted.append(convert(layers, exclude=exclude, **options))
        return converted[-1]

    monkeypatch.setattr(fp8, "_precision", lambda ctx: ctx.step.precision)
    monkeypatch.setattr(fp8, "convert_frozen_linears", counting)
    data = config_dict(
        train_file,
        tmp_path / "run",
        max_steps=2,
        step={"precision": "fp8-base", "fp8": {"exclude": ["*.mlp.down_proj"]}},
        log={"tensorboard": False},
    )
    data["dtype"] = "bfloat16"
    data["data"]["max_seq_len"] = 128
    summary = trainer.train(finetune_config_from_dict(data), runtime)
    assert summary["precision"] == "fp8-base" and summary["fused_qkv"] is False  # auto: off on a CPU
    assert converted == [6 * 6]  # the tiny model's 6 layers: q, k, v, o, gate, up (down kept in bf16)
    assert all(math.isfinite(s["loss"]) and s["grad_norm"] > 0 for s in summary["steps"])
    loaded = PeftModel.from_pretrained(load_model("tiny", torch.bfloat16), summary["adapter"])
    assert any("lora_A" in name for name, _ in loaded.named_parameters())


def test_quantised_values_are_row_major_whatever_the_input_layout():
    """`_scaled_mm` takes its first operand row-major: a transposed gradient must not reach it as is."""
    transposed = torch.randn(48, 32).t()  # (32, 48), column-major
    values, scales = quantize_rows(transposed)
    assert values.is_contiguous() and values.shape == (32, 48) and scales.shape == (32, 1)
    reference, _ = quantize_rows(transposed.contiguous())
    assert torch.equal(values.float(), reference.float())


@rowwise_product
def test_fp8_exclude_names_layers_from_either_end_and_keeps_exactly_those_in_bf16():
    from gpuval.finetune.parallel.modes import decoder_layers
    from gpuval.finetune.step.fused_qkv import fuse_qkv

    model = _lora_model()
    layers = decoder_layers(model)
    n = len(layers)
    assert n >= 2
    # the first layer's attention products, and the last layer's down projection named from the end
    exclude = excluded_linears(layers, ["0.self_attn.*", "-1.mlp.down_proj"])
    attention0 = layers[0].self_attn
    expected = {id(getattr(attention0, p).base_layer) for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    expected.add(id(layers[-1].mlp.down_proj))
    assert exclude == expected
    # the same module by its index from the start: the same set
    assert excluded_linears(layers, [f"{n - 1}.mlp.down_proj", "0.self_attn.*"]) == expected

    fused = fuse_qkv(model, fp8=True, exclude=exclude)
    assert fused == n
    converted = convert_frozen_linears(layers, exclude=exclude)
    assert converted == (n - 1) * 4 + 3 - 1  # o + gate/up/down per layer, less layer 0's o and the last down
    # layer 0: q/k/v fused in bf16 (one excluded part keeps the concatenation bf16), o in bf16
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert type(getattr(attention0, name).base_layer) is torch.nn.Linear
    assert type(layers[0].mlp.down_proj) is Fp8Linear
    assert type(layers[-1].mlp.down_proj) is torch.nn.Linear
    assert type(layers[-1].mlp.up_proj) is Fp8Linear
    assert all(type(getattr(layers[1].self_attn, p).base_layer) is Fp8Linear for p in ("q_proj", "o_proj"))
    # the model still runs, with gradients for the adapters only
    model(input_ids=torch.randint(3, 3000, (1, 8))).logits.float().sum().backward()
    assert all("lora_" in name for name, p in model.named_parameters() if p.grad is not None)


def test_fp8_exclude_pattern_matching_nothing_is_a_one_line_error():
    from gpuval.finetune.parallel.modes import decoder_layers

    layers = decoder_layers(_lora_model())
    for pattern in ("*.self_attn.q_proj.base_layer", "99.mlp.*", "*.mlp.gate"):
        with pytest.raises(UsageError) as caught:
            excluded_linears(layers, ["*.mlp.down_proj", pattern])
        message = str(caught.value)
        assert "\n" not in message and f"'{pattern}' matches no frozen linear" in message
    assert excluded_linears(layers, []) == frozenset()


def test_fp8_exclude_keeps_a_fused_gate_up_in_bf16_when_either_part_is_excluded():
    from gpuval.finetune.parallel.modes import decoder_layers
    from gpuval.finetune.step.fused_mlp import GateUpHalf, fuse_gate_up

    model = _lora_model()
    layers = decoder_layers(model)
    exclude = excluded_linears(layers, ["-1.mlp.up_proj"])  # one part of the last MLP
    assert exclude == {id(layers[-1].mlp.up_proj)}
    assert fuse_gate_up(model, fp8=True, exclude=exclude) == len(layers)
    for index, layer in enumerate(layers):
        parts = (layer.mlp.gate_proj, layer.mlp.up_proj)
        assert all(type(p) is GateUpHalf for p in parts)
        base = parts[0].fused.base
        assert type(base) is (torch.nn.Linear if index == len(layers) - 1 else Fp8Linear)
    # the parts are no bare nn.Linear: the conversion after leaves them (and the excluded pair) alone
    assert convert_frozen_linears(layers, exclude=exclude) == len(layers) * 5  # q, k, v, o and down


def test_fp8_exclude_unset_keeps_the_first_and_last_layer_in_bf16_and_empty_keeps_none():
    from gpuval.finetune.parallel.modes import decoder_layers
    from gpuval.finetune.step.fp8 import DEFAULT_EXCLUDE, resolve_exclude

    assert resolve_exclude(None) == DEFAULT_EXCLUDE == ("0.*", "-1.*")
    assert resolve_exclude([]) == () and resolve_exclude(["*.mlp.*"]) == ("*.mlp.*",)
    layers = decoder_layers(_lora_model())
    default = excluded_linears(layers, resolve_exclude(None))
    frozen = {
        id(m)
        for layer in (layers[0], layers[-1])
        for m in layer.modules()
        if type(m) is torch.nn.Linear and not m.weight.requires_grad
    }
    assert default == frozen and len(frozen) == 2 * 7  # q, k, v, o (their base layers), gate, up, down
    assert convert_frozen_linears(layers, exclude=default) == (len(layers) - 2) * 7

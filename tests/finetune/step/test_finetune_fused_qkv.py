"""finetune/step/fused_qkv.py on the tiny model: the fused q/k/v computes what PEFT's three LoRA layers
compute (outputs and gradients, float64), shares one dropout mask among them, keeps PEFT's adapter layout
on disk, and refuses a call order it was not built for."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from conftest import assert_close_to_adamw_steps  # noqa: E402
from finetune_runs import config_dict, lora_weights  # noqa: E402
from step_parts import decide  # noqa: E402

from gpuval.errors import UsageError  # noqa: E402
from gpuval.finetune.model import apply_lora, load_model  # noqa: E402
from gpuval.finetune.step.fused_qkv import FusedQkvPart, fuse_qkv  # noqa: E402

QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]
FLOAT64_SUMS = 1e-12  # float64 sums of the same terms in another order (one product vs three)


def lora_model(dtype: torch.dtype = torch.float64, dropout: float = 0.0, seed: int = 0):
    torch.manual_seed(seed)
    model = apply_lora(load_model("tiny", dtype), 8, 16, dropout, QKVO)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero: make the adapters' share of the output non-zero
            torch.nn.init.normal_(parameter, std=0.05)
    return model


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


def test_fused_qkv_gives_peft_outputs_and_gradients_in_float64():
    fused = lora_model()
    plain = copy.deepcopy(fused)
    layers = len(fused.get_base_model().model.layers)
    assert fuse_qkv(fused) == layers
    ids = torch.randint(3, 3000, (2, 40), generator=torch.Generator().manual_seed(1))
    outputs = [m(input_ids=ids).logits for m in (fused, plain)]
    assert relative(*outputs) < FLOAT64_SUMS
    for out in outputs:
        (out.square().mean()).backward()
    grads = [{n: p.grad for n, p in m.named_parameters() if p.requires_grad} for m in (fused, plain)]
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == 2 * 4 * layers
    for name in grads[1]:
        assert relative(grads[0][name], grads[1][name]) < FLOAT64_SUMS, name
    # PEFT's modules and parameters, by the same names: the state dict is PEFT's
    assert list(fused.state_dict()) == list(plain.state_dict())


class _FixedMask(torch.nn.Module):
    def __init__(self, mask: torch.Tensor) -> None:
        super().__init__()
        self.mask = mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.mask


def test_one_dropout_mask_is_shared_by_q_k_and_v():
    fused = lora_model(dropout=0.5)
    plain, peft_own = copy.deepcopy(fused), copy.deepcopy(fused)
    fuse_qkv(fused)
    fused.train()
    attention = fused.get_base_model().model.layers[0].self_attn
    x = torch.randn(2, 7, 192, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    torch.manual_seed(123)
    fused_out = [getattr(attention, name)(x) for name in ("q_proj", "k_proj", "v_proj")]
    torch.manual_seed(123)  # the fused layer's one dropout call draws this mask (scaled by 1 / (1 - p))
    mask = F.dropout(torch.ones_like(x), p=0.5, training=True)
    assert 0 < int((mask == 0).sum()) < mask.numel()

    reference = plain.get_base_model().model.layers[0].self_attn
    for name, out in zip(("q_proj", "k_proj", "v_proj"), fused_out, strict=True):
        layer = getattr(reference, name)
        layer.lora_dropout["default"] = _FixedMask(mask)  # PEFT's layer with this mask instead of its own
        assert relative(out, layer(x)) < FLOAT64_SUMS, name

    # What fusing changes (the module docstring): PEFT draws a mask per projection, so from the same seed
    # its q sees the same mask and its k another one.
    peft_attention = peft_own.train().get_base_model().model.layers[0].self_attn
    torch.manual_seed(123)
    peft_out = [getattr(peft_attention, name)(x) for name in ("q_proj", "k_proj", "v_proj")]
    assert relative(peft_out[0], fused_out[0]) < FLOAT64_SUMS
    assert relative(peft_out[1], fused_out[1]) > 1e-6


def test_projections_called_out_of_order_are_an_error_not_a_wrong_result():
    model = lora_model()
    fuse_qkv(model)
    attention = model.get_base_model().model.layers[0].self_attn
    x = torch.randn(1, 3, 192, dtype=torch.float64)
    with pytest.raises(
        RuntimeError, match=r"k_proj was called out of order .* set train.step.fuse_qkv=false"
    ):
        attention.k_proj(x)
    attention.q_proj(x)
    with pytest.raises(RuntimeError, match="v_proj was called out of order"):
        attention.v_proj(x)


def test_the_adapter_saves_in_peft_layout_and_loads_with_plain_peft(tmp_path):
    from peft import PeftModel

    fused = lora_model(dtype=torch.float32)
    plain = copy.deepcopy(fused)
    fuse_qkv(fused)
    fused.save_pretrained(tmp_path / "fused")
    plain.save_pretrained(tmp_path / "plain")
    saved = lora_weights(tmp_path / "fused")
    assert saved.keys() == lora_weights(tmp_path / "plain").keys()
    assert any(".q_proj.lora_A." in key for key in saved) and any(".v_proj.lora_B." in key for key in saved)

    loaded = PeftModel.from_pretrained(load_model("tiny", torch.float32), tmp_path / "fused").eval()
    ids = torch.randint(3, 3000, (1, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = loaded(input_ids=ids).logits
        # the very same modules, weights and input: the same operations in the same order, bit for bit
        assert torch.equal(logits, plain.eval()(input_ids=ids).logits)
        # float32 sums of one product over the concatenated weights, in another order than three products
        assert relative(fused.eval()(input_ids=ids).logits, logits) < 1e-5


def test_fuse_qkv_setting_per_device_parallelism_and_targets():
    def fuse(setting, on_gpu: bool, parallel: str, targets=QKVO):
        return decide(
            FusedQkvPart(),
            fuse_qkv=setting,
            on_gpu=on_gpu,
            parallel=parallel,
            lora={"target_modules": targets},
        )

    assert fuse("auto", True, "ddp").on is True
    assert fuse("auto", True, "ddp", "all-linear").on is True
    assert fuse("auto", False, "ddp").on is False
    assert fuse("auto", True, "fsdp").on is True  # the concatenated product is a module FSDP2 shards
    under_zero3 = fuse("auto", True, "deepspeed")
    assert under_zero3.on is False and "fused_qkv off under train.parallel=deepspeed" in under_zero3.note
    assert fuse("auto", True, "ddp", ["q_proj", "v_proj"]).on is False
    assert fuse(True, False, "ddp").on is True  # tests use it
    assert fuse(False, True, "ddp").on is False
    with pytest.raises(
        UsageError, match=r"^train.step.fuse_qkv=true works with train.parallel ddp or fsdp \(deepspeed"
    ):
        fuse(True, True, "deepspeed")
    with pytest.raises(UsageError, match=r"needs LoRA on q_proj, k_proj and v_proj .*fuse_qkv=false$"):
        fuse(True, True, "ddp", ["q_proj", "v_proj"])


@pytest.mark.slow
def test_train_fused_matches_unfused_step_for_step_and_saves_a_peft_adapter(runtime, train_file, tmp_path):  # noqa: F811
    from peft import PeftModel

    from gpuval.finetune.config import finetune_config_from_dict
    from gpuval.finetune.trainer import train

    losses, adapters, lrs = {}, {}, {}
    for fuse in (False, True):
        data = config_dict(
            train_file, tmp_path / str(fuse), max_steps=3, step={"fuse_qkv": fuse}, log={"tensorboard": False}
        )
        data["lora"]["target_modules"] = QKVO
        summary = train(finetune_config_from_dict(data), runtime)
        assert summary["fused_qkv"] is fuse
        losses[fuse], lrs[fuse] = [s["loss"] for s in summary["steps"]], [s["lr"] for s in summary["steps"]]
        adapters[fuse] = lora_weights(tmp_path / str(fuse) / "adapter")
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)  # float32, dropout 0: the same training
    assert lrs[True] == lrs[False]
    assert adapters[True].keys() == adapters[False].keys()
    # float32 sums in another order (one product against three), which AdamW's g / sqrt(v) magnifies for a
    # weight whose gradient is near zero (conftest: assert_close_to_adamw_steps)
    for key in adapters[False]:
        assert_close_to_adamw_steps(
            adapters[True][key], adapters[False][key], lr_sum=sum(lrs[False]), msg=key
        )
    PeftModel.from_pretrained(load_model("tiny", torch.float32), tmp_path / "True" / "adapter")


@pytest.mark.slow
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-path", "fp8"])
def test_a_compiled_attention_layer_traces_fused_qkv_in_one_graph(fp8):
    """The trainer compiles each decoder layer on a GPU: the q/k/v calls' bookkeeping (and the FP8 layer's
    autograd function) must trace without a graph break. Dynamo and AOT autograd run here (backend
    aot_eager, fullgraph); inductor's code generation is the GPU run's."""
    from gpuval.finetune.step.fused_qkv import IDLE

    dtype = torch.bfloat16 if fp8 else torch.float32  # FP8 products give bf16, as training's bf16 model does
    model = lora_model(dtype=dtype)
    plain = copy.deepcopy(model)
    fuse_qkv(model, fp8=fp8)
    x = torch.randn(2, 16, 192, generator=torch.Generator().manual_seed(4)).to(dtype)
    results = []
    for net, compiled in ((model, True), (plain, False)):
        base = net.get_base_model().model
        attention = base.layers[0].self_attn
        cos_sin = base.rotary_emb(x, torch.arange(16).expand(2, -1))
        call = torch.compile(attention, backend="aot_eager", fullgraph=True) if compiled else attention
        inputs = x.clone().requires_grad_()
        out = call(inputs, cos_sin, None)[0]
        out.float().square().mean().backward()
        results.append((out.detach().float(), inputs.grad.float()))
    (out, grad), (plain_out, plain_grad) = results
    assert model.get_base_model().model.layers[0].self_attn.q_proj.forward.__self__.state == IDLE
    if fp8:  # two factors each within 2^-4 of themselves: a loose check (test_finetune_fp8.py's is exact)
        assert relative(out, plain_out) < 2 * 2**-4 and relative(grad, plain_grad) < 2 * 2**-4
    else:
        assert relative(out, plain_out) < 1e-6 and relative(grad, plain_grad) < 1e-6

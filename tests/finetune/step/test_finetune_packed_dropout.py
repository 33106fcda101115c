"""finetune/step/packed_dropout.py: the packed keep-mask decides every element independently with the drawn
probability (each of the eight bit positions of a byte too), the same key gives the same mask and another
key another; the dropout keeps the expectation, scales once as nn.Dropout does and sends the gradient
through the kept elements only; it compiles; it replaces PEFT's dropouts (the fused q/k/v's too) without
changing the saved adapter; and a training run with it resumes to the uninterrupted run's losses and
weights (its masks follow the saved RNG state). On a GPU: the Triton kernel's bytes are the packing of
Philox's own numbers."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
from finetune_runs import config_dict, lora_weights  # noqa: E402
from step_parts import decide  # noqa: E402
from test_finetune_fused_qkv import lora_model  # noqa: E402

from gpuval.finetune.config import finetune_config_from_dict  # noqa: E402
from gpuval.finetune.step.fused_qkv import fuse_qkv  # noqa: E402
from gpuval.finetune.step.packed_dropout import (  # noqa: E402
    LEVELS,
    PackedDropout,
    PackedDropoutPart,
    keep_bits,
    pack_bits,
    threshold_for,
    unpack_bits,
    use_packed_dropout,
)
from gpuval.finetune.trainer import train  # noqa: E402


def _seed(a: int, b: int = 0, device: str = "cpu") -> torch.Tensor:
    return torch.tensor([a, b], dtype=torch.int64, device=device)


def _within(observed: float, expected: float, n: int, sigmas: float = 5.0) -> bool:
    """`observed` is a share of `n` independent draws of probability `expected`, within `sigmas`."""
    return abs(observed - expected) <= sigmas * math.sqrt(expected * (1 - expected) / n)


def test_setting_auto_means_compiled_layers_on_a_gpu():
    assert decide(PackedDropoutPart(), dropout_kernel="auto", on_gpu=True, compiled=True).choice == "packed"
    assert decide(PackedDropoutPart(), dropout_kernel="auto", on_gpu=True, compiled=False).choice == "torch"
    assert decide(PackedDropoutPart(), dropout_kernel="auto", on_gpu=False, compiled=True).choice == "torch"
    assert (
        decide(PackedDropoutPart(), dropout_kernel="packed", on_gpu=False, compiled=False).choice == "packed"
    )
    assert decide(PackedDropoutPart(), dropout_kernel="torch", on_gpu=True, compiled=True).choice == "torch"


def test_the_threshold_is_p_at_16_bit_resolution():
    assert threshold_for(0.05) == 3277  # 0.0500031
    assert threshold_for(0.0) == 0
    assert threshold_for(0.5) == LEVELS // 2
    for bad in (-0.1, 1.0, 1 - 1e-6):  # the last rounds to 65,536: every element dropped
        with pytest.raises(ValueError):
            threshold_for(bad)


@pytest.mark.parametrize("count", [8, 800, 803, 1])
def test_pack_and_unpack_are_inverse_bit_b_of_byte_j_being_element_8j_plus_b(count):
    torch.manual_seed(count)
    keep = torch.rand(-(-count // 8) * 8) > 0.3
    bits = pack_bits(keep)
    assert bits.dtype == torch.uint8 and bits.numel() == keep.numel() // 8
    assert torch.equal(unpack_bits(bits, count), keep[:count])
    assert int(bits[0]) == sum(int(keep[b]) << b for b in range(8))


@pytest.mark.parametrize("p", [0.05, 0.5])
def test_the_mask_keeps_each_element_with_the_drawn_probability_at_every_bit_position(p):
    threshold = threshold_for(p)
    count = 1 << 20
    keep = unpack_bits(keep_bits(_seed(11, 4), count, threshold), count)
    expected = 1 - threshold / LEVELS
    assert _within(keep.float().mean().item(), expected, count)
    by_position = keep.view(-1, 8).float().mean(dim=0)  # a packing fault shows at some bit position
    assert all(_within(share.item(), expected, count // 8) for share in by_position)
    pairs = (keep[:-1] & keep[1:]).float().mean().item()  # neighbours independent: P(both) = P²
    assert _within(pairs, expected**2, count)


def test_the_same_key_gives_the_same_mask_and_another_key_another():
    threshold = threshold_for(0.5)
    first = keep_bits(_seed(3, 9), 4096, threshold)
    assert torch.equal(first, keep_bits(_seed(3, 9), 4096, threshold))
    assert not torch.equal(first, keep_bits(_seed(4, 9), 4096, threshold))
    assert not torch.equal(first, keep_bits(_seed(3, 10), 4096, threshold))  # the high half counts too
    assert keep_bits(_seed(1), 0, threshold).numel() == 0


def test_dropout_scales_once_keeps_the_expectation_and_passes_gradient_through_kept_elements_only():
    torch.manual_seed(0)
    dropout = PackedDropout(0.05)
    x = torch.randn(512, 256, dtype=torch.float64, requires_grad=True)
    y = dropout(x)
    kept = y != 0
    scale = LEVELS / (LEVELS - 3277)
    assert torch.equal(y[kept], x[kept] * scale)
    assert _within(kept.float().mean().item(), 1 - 3277 / LEVELS, x.numel())
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, kept.double() * scale)

    ones = torch.ones(1 << 20)
    assert abs(dropout(ones).mean().item() - 1.0) < 5 * math.sqrt(0.05 / 0.95 / ones.numel())  # unbiased

    half = torch.randn(4096, dtype=torch.bfloat16)
    out = dropout(half)
    kept = out != 0
    assert out.dtype == torch.bfloat16
    assert torch.equal(out[kept], (half[kept].float() * scale).to(torch.bfloat16))  # one rounding


def test_evaluation_mode_and_p_zero_pass_the_input_through():
    x = torch.randn(64, 32)
    assert PackedDropout(0.3).eval()(x) is x
    assert PackedDropout(0.0)(x) is x


@pytest.mark.slow  # 3-10 s on 2 cores (2026-11-27 profile of the inner loop)
def test_the_compiled_dropout_drops_at_the_drawn_rate_and_its_gradient_follows_its_mask():
    torch.manual_seed(1)
    dropout = PackedDropout(0.25)
    compiled = torch.compile(lambda x: dropout(x) * 2.0)  # fused with other elementwise work
    x = torch.randn(256, 512, requires_grad=True)
    y = compiled(x)
    kept = y != 0
    assert _within(kept.float().mean().item(), 0.75, x.numel())
    y.sum().backward()
    assert torch.equal(x.grad != 0, kept)
    assert torch.allclose(x.grad[kept], torch.tensor(2.0 / 0.75))


def test_use_packed_dropout_replaces_peft_dropouts_and_the_fused_qkv_uses_it():
    model = lora_model(dtype=torch.float32, dropout=0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    layers = list(model.get_base_model().model.layers)
    assert use_packed_dropout(layers) == 4 * len(layers)  # q, k, v and o's adapters
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    fuse_qkv(model)
    fused = layers[0].self_attn.q_proj.forward.__self__
    assert isinstance(fused.dropout, PackedDropout) and fused.dropout.p == 0.1
    assert isinstance(layers[0].self_attn.o_proj.lora_dropout["default"], PackedDropout)
    assert use_packed_dropout(list(lora_model(dropout=0.0).get_base_model().model.layers)) == 0


@pytest.mark.slow
def test_a_run_with_packed_dropout_resumes_to_the_uninterrupted_runs_losses_and_weights(
    runtime,  # noqa: F811
    train_file,  # noqa: F811
    tmp_path,
):
    def config(name: str):
        data = config_dict(
            train_file,
            tmp_path / name,
            max_steps=6,
            save={"every_steps": 2},
            step={"dropout_kernel": "packed"},
        )
        data["lora"]["dropout"] = 0.2
        return finetune_config_from_dict(data)

    whole = train(config("whole"), runtime)
    assert whole["dropout_kernel"] == "packed"
    train(config("cut"), runtime, stop_after_step=4)
    resumed = train(config("cut"), runtime, resume=True)
    assert [s["loss"] for s in resumed["steps"]] == [s["loss"] for s in whole["steps"][4:]]
    a, b = lora_weights(tmp_path / "cut" / "adapter"), lora_weights(tmp_path / "whole" / "adapter")
    assert all(torch.equal(a[k], b[k]) for k in a)

    plain_config = finetune_config_from_dict(config_dict(train_file, tmp_path / "plain", max_steps=2))
    plain = train(plain_config, runtime)
    assert plain["dropout_kernel"] == "torch"  # auto on a CPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton kernel needs a CUDA GPU")
def test_the_gpu_kernel_packs_philox_numbers_as_documented():
    import triton
    import triton.language as tl

    @triton.jit
    def philox_numbers(seed_ptr, out_ptr, n, BLOCK: tl.constexpr):  # noqa: N803
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        key = tl.load(seed_ptr) + tl.load(seed_ptr + 1) * 2147483648
        r0, r1, r2, r3 = tl.randint4x(key, offsets)
        valid = offsets < n
        tl.store(out_ptr + 4 * offsets, r0.to(tl.int64), mask=valid)
        tl.store(out_ptr + 4 * offsets + 1, r1.to(tl.int64), mask=valid)
        tl.store(out_ptr + 4 * offsets + 2, r2.to(tl.int64), mask=valid)
        tl.store(out_ptr + 4 * offsets + 3, r3.to(tl.int64), mask=valid)

    seed = _seed(12345, 678, device="cuda")
    n_bytes, threshold = 5000, threshold_for(0.3)
    raw = torch.empty(4 * n_bytes, dtype=torch.int64, device="cuda")
    philox_numbers[(-(-n_bytes // 256),)](seed, raw, n_bytes, BLOCK=256)
    halves = torch.stack([raw & 0xFFFF, raw >> 16], dim=1).view(-1)  # r0 low, r0 high, r1 low, ...
    expected = pack_bits(halves >= threshold)
    assert torch.equal(keep_bits(seed, 8 * n_bytes, threshold), expected)
    keep = unpack_bits(keep_bits(_seed(5, 6, "cuda"), 1 << 22, threshold), 1 << 22)
    assert _within(keep.float().mean().item(), 1 - threshold / LEVELS, 1 << 22)

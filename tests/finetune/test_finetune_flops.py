"""LoRA FLOPs per token and MFU against the hand-computed Qwen2-7B figures of docs/mfu.md."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gpuval.finetune.flops import (
    attention_width,
    lora_flops_per_token,
    matmul_params,
    mfu,
    peak_flops,
)
from gpuval.finetune.model import SHAPES_DIR

QWEN2_7B = json.loads((SHAPES_DIR / "qwen2-7b" / "config.json").read_text(encoding="utf-8"))
LORA_R64_QKVO = 40_370_176  # docs/mfu.md


def config(**overrides: object) -> SimpleNamespace:
    return SimpleNamespace(**{**QWEN2_7B, **overrides})


def test_the_bundled_qwen2_7b_shape_is_the_reference_architecture():
    c = config()
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size) == (28, 3584, 18944)
    assert (c.num_attention_heads, c.num_key_value_heads, c.vocab_size) == (28, 4, 152064)
    assert c.tie_word_embeddings is False


def test_matmul_params_of_qwen2_7b_by_hand():
    # per layer: q and o 3584x3584 each, k and v 3584x512 each (4 KV heads of 128), MLP 3 x 3584x18944;
    # plus the untied head 152064x3584.
    per_layer = 2 * 3584 * 3584 + 2 * 3584 * 512 + 3 * 3584 * 18944
    assert matmul_params(config()) == 28 * per_layer + 152064 * 3584 == 7_070_285_824  # "7.07 B"
    assert attention_width(config()) == 3584


def test_lora_flops_per_token_at_4096_is_33_5_gflop():
    flops = lora_flops_per_token(config(), LORA_R64_QKVO, 4096)
    by_hand = 4 * 7_070_285_824 + 6 * LORA_R64_QKVO + 12 * 28 * 3584 * 4096
    assert flops == by_hand
    assert flops / 1e9 == pytest.approx(33.45, abs=0.01)  # docs/mfu.md: 33.45 GFLOP/token
    # 29.6k tokens/s/GPU is 100 % MFU on a 989 TFLOP/s GPU (docs/mfu.md)
    assert mfu(29_580, flops, peak_flops("NVIDIA H100 80GB HBM3")) == pytest.approx(1.0, abs=0.002)


def test_shorter_documents_cost_less_attention_only():
    long, short = lora_flops_per_token(config(), 0, 4096), lora_flops_per_token(config(), 0, 512)
    assert long - short == 12 * 28 * 3584 * (4096 - 512)


def test_peak_is_known_for_hopper_only_and_mfu_is_none_without_it():
    assert peak_flops("NVIDIA H200") == peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe") == 756.0e12
    assert peak_flops("cpu") is None and peak_flops(None) is None
    assert mfu(1000.0, 1e9, None) is None

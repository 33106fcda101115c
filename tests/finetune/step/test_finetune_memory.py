"""train.step.activation_checkpointing: auto — the step's memory estimate, by hand, and the choice it makes.

Figures by hand for the Qwen2-7B shape (finetune/shapes/qwen2-7b/config.json: hidden 3584, intermediate
18944, 28 layers, 28 heads, 4 KV heads, so KV width 512, vocabulary 152064), bf16, 7,615,616,512 frozen
parameters and LoRA r64 on q/k/v/o (28 x 64 x (7168 + 4096 + 4096 + 7168) = 40,370,176 trainable).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuval.finetune.step.memory import GIB, choose_checkpointing, estimate_step_memory

SHAPE = Path(__file__).parents[3] / "src/gpuval/finetune/shapes/qwen2-7b/config.json"
QWEN2_7B = SimpleNamespace(**json.loads(SHAPE.read_text()))
BASE, LORA = 7_615_616_512, 40_370_176
# the lent H100's memory as torch reports it, what the trainer reads (2026-11-25-h100x1-finetune-shipped)
H100 = 85_017_493_504


def test_the_estimate_for_the_shipped_recipe_by_hand():
    # per token per layer: (12 x 3584 + 2 x 512 + 3 x 18944) x 2 B = 201,728 B; 2 x 4096 tokens, 28 layers
    step = estimate_step_memory(QWEN2_7B, BASE, LORA, 8192, 2, fused_loss=True)
    assert step.activations == 46_271_561_728
    assert step.weights == 15_231_233_024 and step.trainable == 645_922_816
    # the fused loss: one chunk of 2,048 rows' logits and their gradient, 2048 x 152064 x (2 + 2) B
    assert step.logits == 1_245_708_288
    assert step.total == 63_394_425_856  # 59.0 GiB: above the 47.6 GiB measured, as it must be
    # unfused: 8192 x 152064 x (2 + 4 + 4) B of logits; FSDP over 2 ranks halves the frozen weights
    unfused = estimate_step_memory(QWEN2_7B, BASE, LORA, 8192, 2, fused_loss=False, weight_shards=2)
    assert unfused.logits == 12_457_082_880 and unfused.weights == 7_615_616_512


def test_auto_keeps_activations_where_the_step_fits_and_recomputes_where_it_would_not():
    fits = estimate_step_memory(QWEN2_7B, BASE, LORA, 8192, 2, fused_loss=True)
    on, why = choose_checkpointing("auto", fits, H100)
    assert on is False and why == "auto: the step needs about 59.0 GiB without it, 79.2 GiB here"
    # micro-batch 3 without the fused loss: 79.4 + 17.4 GiB of logits, far over 90 % of 79.2 GiB (this
    # is the configuration that ran out of memory on the H100 without Liger-Kernel)
    too_big = estimate_step_memory(QWEN2_7B, BASE, LORA, 12288, 2, fused_loss=False)
    on, why = choose_checkpointing("auto", too_big, H100)
    assert on is True and "over 90% of 79.2 GiB" in why
    assert too_big.total / GIB == pytest.approx(96.8, abs=0.1)


def test_an_explicit_setting_is_kept_and_a_cpu_never_recomputes():
    step = estimate_step_memory(QWEN2_7B, BASE, LORA, 8192, 2, fused_loss=True)
    assert choose_checkpointing(True, step, H100) == (True, "set in the config")
    assert choose_checkpointing(False, None, None) == (False, "set in the config")
    assert choose_checkpointing("auto", None, None) == (False, "auto: no GPU, activations kept")
    with pytest.raises(ValueError, match="not true, false or auto"):
        choose_checkpointing("sometimes", step, H100)


def test_the_config_takes_auto_true_and_false_and_defaults_to_auto():
    from gpuval.finetune.config import StepSettings

    assert StepSettings().activation_checkpointing == "auto" and StepSettings().compile == "auto"
    assert StepSettings(activation_checkpointing=True, compile=False).activation_checkpointing is True
    with pytest.raises(ValueError):
        StepSettings(activation_checkpointing="maybe")

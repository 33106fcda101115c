"""train.sharding's rule for FSDP2 (finetune/sharding.py): when decoder layers keep their gathered weights."""

from types import SimpleNamespace

import torch

from gpuval.finetune.sharding import fsdp_note, fsdp_reshard, reshard_for_memory

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
    cpu = SimpleNamespace(on_gpu=False)
    assert fsdp_reshard(False, model, cpu) == (False, "set")
    assert fsdp_reshard(True, model, cpu) == (True, "set")
    assert fsdp_reshard("auto", model, cpu) == (True, "auto: CPU")
    assert "keep their gathered weights" in fsdp_note(False, "set")
    assert "reshard after forward, all but the last" in fsdp_note(True, "auto: CPU")

"""How FSDP2 moves the frozen base's weights (`train.sharding`).

With LoRA the base is frozen: under `fsdp` its sharded weights are gathered for every micro-batch, and that
gathering is nearly all of the added traffic (the adapter's gradients are ~0.5 % of the model's size).

- `fsdp_reshard_after_forward` (FSDP2's `fully_shard(reshard_after_forward=...)`). True frees each decoder
  layer's gathered weights after its forward and gathers them again for its backward: two all-gathers of
  the base per micro-batch, the least memory. False keeps them from forward to backward: one all-gather,
  while the unsharded weights of the layers between a layer's forward and its backward stay in memory (at
  the turn from forward to backward, all of them). The last layer is never resharded: its backward follows
  at once (torchtitan's default policy, `torchtitan/models/llama3/infra/parallelize.py`). `auto` keeps
  the weights when the whole model's take at most KEEP_GATHERED_FRACTION of the GPU's memory: Qwen2-7B's
  15.2 GB of bf16 weights on an 80 GB H100 is 19 %; a 30B model's 61 GB is not kept.

ZeRO-3 has no such setting here. DeepSpeed fetches its parameters module by module, from hooks on every
submodule; marking each decoder layer as one fetch (DeepSpeed's z3 leaf modules, `set_z3_leaf_module`) was
tried on 2026-11-27 with DeepSpeed 0.19.8 and failed in the first backward on two CPU ranks ("size of
tensor a (0) must match" in a LoRA weight's AccumulateGrad). The cause is in DeepSpeed's design: a leaf
module's trainable gradients are reduced from a full backward hook on the module
(`DeepSpeedZeroOptimizer_Stage3.create_reduce_and_remove_grad_hooks`), which fires once the gradient of
the layer's input is ready; a LoRA weight whose AccumulateGrad autograd runs after that is given a
zero-size placeholder gradient first, and its real gradient then cannot be added. Leaf modules suit layers
whose trainable weights are all whole-layer experts (DeepSpeed's MoE case), not adapters inside a layer.

Source: FSDP2's `fully_shard` documentation
(https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html).
"""

from __future__ import annotations

from typing import Any

import torch

KEEP_GATHERED_FRACTION = 0.25  # of the GPU's memory: the whole model's weights at most this keep gathered


def fsdp_reshard(setting: bool | str, model: torch.nn.Module, runtime: Any) -> tuple[bool, str]:
    """Whether FSDP2 reshards the decoder layers after their forward (all but the last), and why."""
    if setting != "auto":
        return bool(setting), "set"
    if not runtime.on_gpu:
        return True, "auto: CPU"
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return reshard_for_memory(weights, torch.cuda.get_device_properties(runtime.device).total_memory)


def reshard_for_memory(weights: int, total: int) -> tuple[bool, str]:
    """`auto`'s rule on a GPU: `weights`, the whole model's bytes, against the GPU's `total` bytes."""
    share = f"the model's {weights / 2**30:.1f} GiB of weights are {weights / total:.0%} of this GPU's memory"
    if weights <= KEEP_GATHERED_FRACTION * total:
        return False, f"auto: {share}"
    return True, f"auto: {share}, more than {KEEP_GATHERED_FRACTION:.0%}"


def fsdp_note(reshard: bool, why: str) -> str:
    """The start-up line's words for fsdp_reshard's choice."""
    if reshard:
        return f" | fsdp: decoder layers reshard after forward, all but the last ({why})"
    return f" | fsdp: decoder layers keep their gathered weights until their backward ({why})"

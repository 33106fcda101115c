"""Training FLOPs per token and MFU for LoRA fine-tuning of a decoder (Qwen2/Llama shape).

Source: docs/mfu.md (PaLM's appendix B count, with frozen weights' missing weight-gradient taken out):
    LoRA training FLOPs/token = 4·N_mm + 6·N_A + 12·L·d·S_eff
- N_mm: parameters of the frozen weight matrices that multiply activations (attention and MLP projections
  of every layer, and the output head; not the embedding lookup). Forward 2·N_mm; backward needs only the
  input-gradient of frozen weights, another 2·N_mm — not the 4·N_mm of full training.
- N_A: trainable adapter parameters, trained fully: 6·N_A (forward 2, input- and weight-gradient 4).
- 12·L·d·S_eff: attention scores and weighted values (2·2·d·S_eff per layer forward, twice that backward),
  d = heads × head_dim, S_eff the mean attention context per token (packing.seq_lens_squared_mean) —
  after PaLM (Chowdhery et al. 2022, appendix B).
Recomputation by activation checkpointing is not counted: MFU measures useful work.

Worked check for Qwen2-7B with LoRA r=64 on q,k,v,o: docs/mfu.md (tests/finetune/test_finetune_flops.py
repeats it).
"""

from __future__ import annotations

from typing import Any

# Dense bf16 tensor-core peak without sparsity, FLOP/s, from NVIDIA's H100/H200 datasheets (SXM: 989.4
# TFLOP/s; H100 PCIe: 756). Matched against torch.cuda.get_device_name(); the first match wins.
BF16_PEAK_FLOPS = (
    ("H200", 989.4e12),
    ("H100 PCIe", 756.0e12),
    ("H100", 989.4e12),  # SXM and NVL names ("NVIDIA H100 80GB HBM3")
)


def matmul_params(config: Any) -> int:
    """N_mm of a Qwen2/Llama-style config: per layer q, k, v, o and the gated MLP (gate, up, down), plus
    the output head (counted also when tied to the embeddings: the head still multiplies)."""
    hidden = config.hidden_size
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o; k, v
    mlp = 3 * hidden * config.intermediate_size
    return config.num_hidden_layers * (attention + mlp) + config.vocab_size * hidden


def attention_width(config: Any) -> int:
    """d = heads × head_dim (equals hidden_size in Qwen2-7B)."""
    heads = config.num_attention_heads
    return heads * (getattr(config, "head_dim", None) or config.hidden_size // heads)


def lora_flops_per_token(config: Any, adapter_params: int, s_eff: float) -> float:
    """4·N_mm + 6·N_A + 12·L·d·S_eff (module docstring)."""
    n_mm = matmul_params(config)
    attention = 12 * config.num_hidden_layers * attention_width(config) * s_eff
    return 4 * n_mm + 6 * adapter_params + attention


def peak_flops(device_name: str | None) -> float | None:
    """Dense bf16 peak of a known GPU; None for CPUs and unknown GPUs (then no MFU is claimed)."""
    if not device_name:
        return None
    for key, peak in BF16_PEAK_FLOPS:
        if key in device_name:
            return peak
    return None


def mfu(tokens_per_s_per_gpu: float, flops_per_token: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved useful FLOP/s over the GPU's dense bf16 peak."""
    if peak is None or peak <= 0:
        return None
    return tokens_per_s_per_gpu * flops_per_token / peak

"""FlashAttention-4 as the attention of whole-document rows (finetune/step/flash4.py,
`train.step.row_kernel: fa4`).

FA4's kernels need a Hopper or Blackwell GPU; here the custom operators run their CPU kernels (the same
outputs from float32 math), which is enough to check the operators' definitions (log-sum-exp, causality,
grouped heads), their autograd and fake-tensor wiring, compiled callers and the setting's resolution.
The last test runs FA4 itself where it can.

The CPU kernels compute in float32 by definition (flash4._reference), so they are compared with SDPA in
float32, by conftest's assert_close_to_scale at FLOAT32_SHORT_SUMS."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close_to_scale
from step_parts import decide

from gpuval.errors import UsageError
from gpuval.finetune.step import attention, flash4
from gpuval.finetune.step.attention import AttentionPart

# rel between the float32 CPU kernels and SDPA: sums of at most 10 terms (8 dimensions, 10 keys), whose
# roundings (2^-24 each) a softmax's exp turns into relative errors of the scores' size (a few units):
# some 50 · 2^-24 ≈ 3e-6 at worst, and the backward's differences of such terms again a few times that
FLOAT32_SHORT_SUMS = 1e-5


def _kernel(setting: str, choice: str, on_gpu: bool) -> str:
    """The attention part's resolved `setting` (row_kernel or varlen_kernel) for `choice`."""
    return decide(AttentionPart(), on_gpu=on_gpu, **{setting: choice}).settings[setting]


def _inputs(batch=2, seq=7, heads=4, kv_heads=2, dim=8, dtype=torch.float32, seed=0, device="cpu"):
    generator = torch.Generator(device=device).manual_seed(seed)
    return [
        torch.randn(batch, seq, h, dim, generator=generator, device=device).to(dtype)
        for h in (heads, kv_heads, kv_heads)
    ]


def test_output_and_log_sum_exp_by_hand():
    """One row of 3 tokens, one head of size 2, scale 0.5: each query's softmax over itself and the keys
    before it, computed here with math, element by element."""
    q = torch.tensor([[[[1.0, 0.0]], [[0.0, 2.0]], [[1.0, -1.0]]]])  # (1, 3, 1, 2)
    k = torch.tensor([[[[0.5, 1.0]], [[-1.0, 0.0]], [[2.0, 1.0]]]])
    v = torch.tensor([[[[1.0, 2.0]], [[3.0, -1.0]], [[0.0, 4.0]]]])
    out, lse = flash4.fa4_causal(q, k, v, None, 0, 0.5)
    expected_out, expected_lse = torch.zeros(1, 3, 1, 2), torch.zeros(1, 1, 3)
    for i in range(3):
        scores = [
            0.5 * sum(q[0, i, 0, d].item() * k[0, j, 0, d].item() for d in range(2)) for j in range(i + 1)
        ]
        top = max(scores)
        expected_lse[0, 0, i] = top + math.log(sum(math.exp(s - top) for s in scores))
        weights = [math.exp(s - expected_lse[0, 0, i].item()) for s in scores]
        for d in range(2):
            expected_out[0, i, 0, d] = sum(w * v[0, j, 0, d].item() for j, w in enumerate(weights))
    # by hand in float64, rounded to float32 once: the kernel's float32 sums of at most 3 terms
    assert_close_to_scale(lse, expected_lse, rel=1e-6)
    assert_close_to_scale(out, expected_out, rel=1e-6)
    assert out.shape == (1, 3, 1, 2) and lse.shape == (1, 1, 3) and lse.dtype == torch.float32


def test_matches_sdpa_with_grouped_heads_forward_and_backward():
    q, k, v = (t.requires_grad_(True) for t in _inputs())
    got = flash4.causal_attention(q, k, v, None)
    dout = torch.randn_like(got)
    grads = torch.autograd.grad(got, (q, k, v), dout)

    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    want = F.scaled_dot_product_attention(
        q2.transpose(1, 2), k2.transpose(1, 2), v2.transpose(1, 2), is_causal=True, enable_gqa=True
    ).transpose(1, 2)
    want_grads = torch.autograd.grad(want, (q2, k2, v2), dout)
    assert_close_to_scale(got, want, rel=FLOAT32_SHORT_SUMS)
    for a, b in zip(grads, want_grads, strict=True):
        assert_close_to_scale(a, b, rel=FLOAT32_SHORT_SUMS)
    # a later token never changes an earlier one's output (causal)
    q3, k3, v3 = (t.detach().clone() for t in (q, k, v))
    k3[:, -1] += 5.0
    v3[:, -1] -= 3.0
    changed = flash4.causal_attention(q3, k3, v3, None)
    assert_close_to_scale(changed[:, :-1], got.detach()[:, :-1], rel=FLOAT32_SHORT_SUMS)
    assert not torch.allclose(changed[:, -1], got.detach()[:, -1])


def test_packed_documents_attend_within_themselves_forward_and_backward():
    """One flattened row of three documents (5, 1 and 4 tokens): the same outputs and gradients as each
    document through SDPA on its own, and nothing of one document reaches another."""
    q, k, v = (t[0].contiguous().requires_grad_(True) for t in _inputs(batch=1, seq=10))  # (T, H, D)
    cu = torch.tensor([0, 5, 6, 10], dtype=torch.int32)
    got = flash4.causal_attention(q, k, v, None, cu_seqlens=cu, max_seqlen=5)
    dout = torch.randn_like(got)
    grads = torch.autograd.grad(got, (q, k, v), dout)
    for a, b in ((0, 5), (5, 6), (6, 10)):
        part = [t.detach()[a:b].clone().requires_grad_(True) for t in (q, k, v)]
        want = F.scaled_dot_product_attention(
            *(t.transpose(0, 1) for t in part), is_causal=True, enable_gqa=True
        ).transpose(0, 1)
        assert_close_to_scale(got[a:b], want, rel=FLOAT32_SHORT_SUMS)
        want_grads = torch.autograd.grad(want, part, dout[a:b])
        for g, w in zip(grads, want_grads, strict=True):
            assert_close_to_scale(g[a:b], w, rel=FLOAT32_SHORT_SUMS)


def test_operators_pass_opcheck():
    """Fake tensors (what torch.compile traces with) match the kernels' outputs; autograd is registered."""
    q, k, v = _inputs(batch=1, seq=5, heads=2, kv_heads=1, dim=4)
    torch.library.opcheck(flash4.fa4_causal, (q.requires_grad_(True), k, v, None, 0, 0.3))
    out, lse = flash4.fa4_causal(q.detach(), k, v, None, 0, 0.3)
    dout = torch.randn_like(out)
    torch.library.opcheck(flash4.fa4_causal_backward, (dout, q.detach(), k, v, out, lse, None, 0, 0.3, False))
    # packed documents: one flattened row of 9 tokens, documents of 4, 2 and 3
    cu = torch.tensor([0, 4, 6, 9], dtype=torch.int32)
    qp, kp, vp = (t[0, :9].contiguous() for t in _inputs(batch=1, seq=9, heads=2, kv_heads=1, dim=4))
    torch.library.opcheck(flash4.fa4_causal, (qp.requires_grad_(True), kp, vp, cu, 4, 0.3))
    out, lse = flash4.fa4_causal(qp.detach(), kp, vp, cu, 4, 0.3)
    assert out.shape == (9, 2, 4) and lse.shape == (2, 9)
    args = (torch.randn_like(out), qp.detach(), kp, vp, out, lse, cu, 4, 0.3, False)
    torch.library.opcheck(flash4.fa4_causal_backward, args)


def test_compiled_caller_matches_eager():
    q, k, v = (t.requires_grad_(True) for t in _inputs(dtype=torch.float32))

    def layer(q, k, v):
        return flash4.causal_attention(q * 1.5, k, v, 0.25).square().sum()

    eager = torch.autograd.grad(layer(q, k, v), (q, k, v))
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    for a, b in zip(got, eager, strict=True):
        assert_close_to_scale(a, b, rel=FLOAT32_SHORT_SUMS)


def test_row_kernel_setting(monkeypatch):
    assert "fa4" in attention.ROW_KERNELS
    assert _kernel("row_kernel", "fa4", False) == "fa4"  # a CPU runs plain causal SDPA
    monkeypatch.setattr(
        flash4, "unavailable_reason", lambda: "the flash-attn-4 package is not importable (x)"
    )
    with pytest.raises(
        UsageError, match=r"^train.step.row_kernel=fa4: the flash-attn-4 package is not importable"
    ):
        _kernel("row_kernel", "fa4", True)
    # auto on a Hopper GPU: fa4 where it can run, else cuDNN
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    assert _kernel("row_kernel", "auto", True) == "cudnn"
    monkeypatch.setattr(flash4, "unavailable_reason", lambda: None)
    assert _kernel("row_kernel", "auto", True) == "fa4"
    assert _kernel("varlen_kernel", "auto", True) == "fa4"
    assert _kernel("varlen_kernel", "auto", False) == "flash"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert _kernel("row_kernel", "auto", True) == "varlen"  # measured only on Hopper
    assert _kernel("varlen_kernel", "auto", True) == "flash"


def test_a_package_that_fails_to_load_is_a_reason_not_a_crash(monkeypatch):
    """auto must fall back to cuDNN or varlen_attn when FA4 is installed but broken (a DSL library that
    does not load raises OSError, not ImportError); an explicit fa4 then says why in one line."""

    def broken() -> None:
        raise OSError("libcute_dsl_runtime.so: cannot open shared object file\nsecond line")

    flash4.unavailable_reason.cache_clear()
    monkeypatch.setattr(flash4, "_interface", broken)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    try:
        reason = flash4.unavailable_reason()
        assert reason == (
            "the flash-attn-4 package is not importable (OSError: libcute_dsl_runtime.so: cannot open "
            "shared object file"
        )
        assert _kernel("varlen_kernel", "auto", True) == "flash"
        with pytest.raises(
            UsageError, match=r"^train.step.row_kernel=fa4: the flash-attn-4 package is not importable"
        ):
            _kernel("row_kernel", "fa4", True)
    finally:
        flash4.unavailable_reason.cache_clear()


def test_varlen_kernel_setting_without_the_package(monkeypatch):
    assert attention.VARLEN_KERNELS == ("fa4", "flash")
    assert _kernel("varlen_kernel", "fa4", False) == "fa4"  # a CPU runs SDPA per document
    assert _kernel("varlen_kernel", "flash", True) == "flash"
    monkeypatch.setattr(flash4, "unavailable_reason", lambda: "no CUDA GPU")
    with pytest.raises(UsageError, match=r"^train.step.varlen_kernel=fa4: no CUDA GPU; install flash-attn-4"):
        _kernel("varlen_kernel", "fa4", True)
    assert _kernel("varlen_kernel", "auto", True) == "flash"


def test_cpu_rows_with_fa4_setting_run_sdpa(monkeypatch):
    monkeypatch.setattr(attention, "_ROW_KERNEL", "fa4")
    q, k, v = (t.transpose(1, 2) for t in _inputs())  # (B, H, S, D), as transformers hands them over
    got = attention._causal_rows(q, k, v, None)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
    assert torch.equal(got, want)  # a CPU runs the very same SDPA call


@pytest.mark.skipif(flash4.unavailable_reason() is not None, reason="FA4 needs flash-attn-4 on a Hopper GPU")
def test_fa4_kernels_match_the_reference_on_the_gpu():
    q, k, v = (t.requires_grad_(True) for t in _inputs(2, 300, 8, 2, 128, torch.bfloat16, device="cuda"))
    got = flash4.causal_attention(q, k, v, None)
    dout = torch.randn_like(got)
    grads = torch.autograd.grad(got, (q, k, v), dout)
    ref_in = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    ref, lse = flash4._reference(*ref_in, 1 / math.sqrt(128))
    ref_grads = torch.autograd.grad(ref, ref_in, dout.float())
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2)
    _, fa4_lse = flash4.fa4_causal(q.detach(), k.detach(), v.detach(), None, 0, 1 / math.sqrt(128))
    torch.testing.assert_close(fa4_lse, lse, rtol=1e-3, atol=1e-3)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a.float(), b, rtol=5e-2, atol=5e-2)
    # packed documents (300, 1, 211 and 88 tokens) in one flattened row, against each alone
    qp, kp, vp = (
        t[0].detach().clone().requires_grad_(True)
        for t in _inputs(1, 600, 8, 2, 128, torch.bfloat16, 1, "cuda")
    )
    cu = torch.tensor([0, 300, 301, 512, 600], dtype=torch.int32, device="cuda")
    packed = flash4.causal_attention(qp, kp, vp, None, cu_seqlens=cu, max_seqlen=300)
    dpacked = torch.randn_like(packed)
    packed_grads = torch.autograd.grad(packed, (qp, kp, vp), dpacked)
    for a, b in ((0, 300), (300, 301), (301, 512), (512, 600)):
        part = [t.detach()[a:b][None].float().requires_grad_(True) for t in (qp, kp, vp)]
        ref, _ = flash4._reference(*part, 1 / math.sqrt(128))
        torch.testing.assert_close(packed[a:b].float(), ref[0], rtol=2e-2, atol=2e-2)
        ref_grads = torch.autograd.grad(ref, part, dpacked[a:b][None].float())
        for g, r in zip(packed_grads, ref_grads, strict=True):
            torch.testing.assert_close(g[a:b].float(), r[0], rtol=5e-2, atol=5e-2)

"""gpuval's chunked output head + cross-entropy (finetune/step/linear_ce.py) against F.cross_entropy over the
full logits, in float64 on the CPU: loss and input gradient, for chunks smaller than, equal to and larger
than the rows, a last chunk of one row, and a scaled incoming gradient."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from conftest import FLOAT64_REORDERED, assert_close_to_scale  # noqa: E402

from gpuval.finetune.step.linear_ce import chunk_loss_and_grad, linear_cross_entropy  # noqa: E402


def _problem(rows: int, d: int = 16, vocab: int = 50, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, d, generator=generator, dtype=torch.float64) * 3
    weight = torch.randn(vocab, d, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, vocab, (rows,), generator=generator)
    return hidden, weight, targets


@pytest.mark.parametrize("chunk", [1, 3, 7, 9, 64])
def test_loss_and_input_gradient_equal_the_full_logits_cross_entropy(chunk):
    hidden, weight, targets = _problem(9)
    reference_input = hidden.clone().requires_grad_(True)
    reference = F.cross_entropy(reference_input @ weight.t(), targets, reduction="sum")
    (reference * 0.37).backward()

    chunked_input = hidden.clone().requires_grad_(True)
    loss = linear_cross_entropy(chunked_input, weight, targets, chunk=chunk)
    (loss * 0.37).backward()  # the trainer scales by world / label tokens: the backward must apply it

    assert loss.dtype == torch.float64  # float64 in, float64 sums (float32 for bf16 and float32 inputs)
    assert_close_to_scale(loss, reference.detach(), rel=FLOAT64_REORDERED)  # chunks: sums in another order
    assert_close_to_scale(chunked_input.grad, reference_input.grad, rel=FLOAT64_REORDERED)


def test_the_gradient_is_softmax_minus_the_target_one_hot_computed_by_hand():
    logits = torch.tensor([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]], dtype=torch.float64)
    targets = torch.tensor([1, 2])
    loss, grad = chunk_loss_and_grad(logits, targets)
    e = torch.exp(logits[0])
    p0 = e / e.sum()
    expected_loss = -torch.log(p0[1]) + torch.log(torch.tensor(3.0, dtype=torch.float64))
    assert loss.dtype == grad.dtype == torch.float64
    assert_close_to_scale(loss, expected_loss, rel=FLOAT64_REORDERED)
    # by hand in float64 too (1/3 rounded to float32 would be all the difference)
    one_hot = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    uniform = torch.tensor([1 / 3, 1 / 3, -2 / 3], dtype=torch.float64)
    assert_close_to_scale(grad, torch.stack([p0 - one_hot, uniform]), rel=FLOAT64_REORDERED)


def test_a_trainable_head_or_a_chunk_of_no_rows_is_refused():
    hidden, weight, targets = _problem(4)
    with pytest.raises(ValueError, match="frozen"):
        linear_cross_entropy(hidden, weight.clone().requires_grad_(True), targets)
    with pytest.raises(ValueError, match="at least 1 row"):
        linear_cross_entropy(hidden, weight, targets, chunk=0)

"""finetune/data/batches.py: a step's batches depend on the step alone (so preparing step k+1 during step
k, or resuming at step k, changes nothing), each rank gets its slice, and the loss denominator counts every
rank's label tokens."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from gpuval.finetune.data.batches import (  # noqa: E402
    data_order,
    label_rows,  # noqa: E402
    step_batches_for,
    to_device,
)
from gpuval.finetune.data.packing import Pack, collate  # noqa: E402
from gpuval.finetune.template import IGNORE_INDEX  # noqa: E402


def _packs(count: int = 7, length: int = 20) -> list[Pack]:
    packs = []
    for index in range(count):
        pack = Pack()
        ids = list(range(3 + index, 3 + index + length - index))  # every pack another length
        pack.add(ids, ids)
        packs.append(pack)
    return packs


def _step_batches(packs: list[Pack], rank: int = 0, world: int = 1, varlen: bool = True):
    return step_batches_for(
        packs,
        seed=5,
        rank=rank,
        world=world,
        micro_batch_size=2,
        global_batch=2 * 2 * world,  # two micro-batches of two per rank
        max_seq_len=24,
        pad_id=0,
        device=torch.device("cpu"),
        varlen=varlen,
        fixed_longest=False,
        whole_rows=False,
        mask_dtype=torch.float32,
    )


def test_data_order_is_a_seeded_stream_of_epochs():
    assert sorted(data_order(7, 5, 0, 7)) == list(range(7))  # one epoch: every pack once
    assert data_order(7, 5, 3, 6) == data_order(7, 5, 0, 9)[3:]  # a position is all that resuming needs
    assert data_order(7, 5, 7, 7) != data_order(7, 5, 0, 7)  # the next epoch is another permutation


def test_a_steps_batches_depend_on_the_step_alone(runtime):  # noqa: F811
    packs = _packs()
    step_batches = _step_batches(packs)
    later_first = [step_batches(step) for step in (3, 1)]  # prefetched or resumed: any order
    in_order = [step_batches(step) for step in (1, 3)]
    for a, b in zip(reversed(later_first), in_order, strict=True):
        assert a.pack_indices == b.pack_indices
        assert all(
            torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a.batches, b.batches, strict=True)
        )
        assert torch.equal(a.counts, b.counts)
    step = in_order[0]
    assert step.pack_indices == data_order(len(packs), 5, 1 * 4, 4)
    assert len(step.batches) == 2 and all("segments" not in b for b in step.batches)
    expected = [
        collate([packs[i] for i in step.pack_indices[j : j + 2]], 0, 24, with_mask=False) for j in (0, 2)
    ]
    for batch, reference in zip(step.batches, expected, strict=True):  # the loss's rows of each micro-batch
        flat = reference["labels"].reshape(1, -1)  # varlen: the micro-batch is one row
        rows, targets = label_rows(flat)
        assert torch.equal(batch["loss_rows"], rows) and torch.equal(batch["loss_targets"], targets)
        assert torch.equal(flat.flatten()[rows + 1], targets) and "labels" not in batch
    labels = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in expected)
    tokens = sum(len(packs[i]) for i in step.pack_indices)
    assert step.counts.dtype == torch.float64 and step.counts.tolist() == [labels, tokens]


def test_each_rank_gets_its_slice_of_the_global_batch(runtime):  # noqa: F811
    """Rank 1 of 2 reads the second half of the step's packs (counts are all-reduced; with one process in
    the group here they are this rank's own)."""
    packs = _packs()
    first, second = (_step_batches(packs, rank=r, world=2)(0) for r in (0, 1))
    assert first.pack_indices == second.pack_indices == data_order(len(packs), 5, 0, 8)
    rows = [collate([packs[i] for i in first.pack_indices[4:6]], 0, 24, with_mask=False)["input_ids"]]
    assert torch.equal(second.batches[0]["input_ids"], rows[0].reshape(1, -1))  # varlen: one row


def test_to_device_leaves_what_is_not_a_tensor_and_copies_to_a_cpu_as_it_is():
    assert to_device(7, "cpu") == 7
    tensor = torch.arange(3)
    assert torch.equal(to_device(tensor, torch.device("cpu")), tensor)

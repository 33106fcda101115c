"""Which packs each optimizer step trains on, per rank, collated and copied to the device.

The data order depends only on the seed and the step (`data_order`), which is also all that resuming needs.
`step_batches(step)` gives one rank's micro-batches of a step, already on their way to the device (the
labels as the rows the loss reads and their targets: label_rows), and the step's loss denominator
summed over the ranks as a device tensor: the loop prepares step k+1 while the GPU still runs step k
(trainer.py), and divides each micro-batch's loss by that tensor, so no micro-batch waits for the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gpuval.finetune.data.packing import Pack, collate, varlen_kwargs
from gpuval.finetune.template import IGNORE_INDEX


@dataclass
class StepBatches:
    batches: list[dict[str, Any]]  # this rank's micro-batches, on the device
    counts: torch.Tensor  # [label tokens, real tokens] of the whole step on every rank (float64, device)
    pack_indices: list[int]  # the step's packs, every rank's (for S_eff)


def data_order(count: int, seed: int, start: int, length: int) -> list[int]:
    """Pack indices `start .. start+length` of an endless stream of epochs, each a seeded permutation of
    `count` packs (epoch e uses seed + e). A position in the stream is all a checkpoint needs to store."""
    indices: list[int] = []
    epoch_cache: dict[int, list[int]] = {}
    for position in range(start, start + length):
        epoch, offset = divmod(position, count)
        if epoch not in epoch_cache:
            generator = torch.Generator().manual_seed(seed + epoch)
            epoch_cache[epoch] = torch.randperm(count, generator=generator).tolist()
        indices.append(epoch_cache[epoch][offset])
    return indices


def to_device(value: Any, device: torch.device | str) -> Any:
    """A tensor copied to `device` without blocking the host (pinned first when it goes to a GPU: a copy
    from pageable memory blocks the host anyway); anything else as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    if torch.device(device).type == "cuda" and value.device.type == "cpu":
        value = value.pin_memory()
    return value.to(device, non_blocking=True)


def step_batches_for(
    packs: list[Pack],
    seed: int,
    rank: int,
    world: int,
    micro_batch_size: int,
    global_batch: int,
    max_seq_len: int,
    pad_id: int,
    device: torch.device,
    varlen: bool,
    fixed_longest: bool,
    whole_rows: bool,
    mask_dtype: torch.dtype,
) -> Callable[[int], StepBatches]:
    """`step_batches(step)` for this rank. `varlen`: one row per micro-batch with documents by cu_seq_lens
    (flatten_for_varlen), `fixed_longest` passing max_seq_len as the longest document (compiled
    layers), `whole_rows` keeping rows that are one document each; else the dense document mask.
    `global_batch`: packed sequences per optimizer step over all ranks (TrainSettings.global_batch)."""
    per_rank = global_batch // world

    def step_batches(step: int) -> StepBatches:
        order = data_order(len(packs), seed, step * global_batch, global_batch)
        mine = [packs[i] for i in order[rank * per_rank : (rank + 1) * per_rank]]
        micro = [mine[i : i + micro_batch_size] for i in range(0, per_rank, micro_batch_size)]
        # Padded to max_seq_len: one shape for every step (no per-shape kernel set-up on CPU or GPU).
        if varlen:
            batches = [
                flatten_for_varlen(
                    collate(mb, pad_id, max_seq_len, with_mask=False),
                    max_length=max_seq_len if fixed_longest else None,
                    whole_rows=whole_rows,
                )
                for mb in micro
            ]
        else:
            batches = [collate(mb, pad_id, max_seq_len, mask_dtype) for mb in micro]
        # The loss reads its labelled rows and their targets (label_rows), found here on the host.
        for b in batches:
            b["loss_rows"], b["loss_targets"] = label_rows(b.pop("labels"))
        # The loss denominator: the targets of the whole step on every rank.
        labels = sum(b["loss_targets"].numel() for b in batches)
        counts = to_device(torch.tensor([labels, sum(map(len, mine))], dtype=torch.float64), device)
        dist.all_reduce(counts)  # NCCL reduces GPU tensors only; asynchronous there
        on_device = [
            {key: to_device(value, device) for key, value in b.items() if key != "segments"} for b in batches
        ]
        return StepBatches(on_device, counts, order)

    return step_batches


def label_rows(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions of `labels` `(B, S)` whose next token is a target, as rows of the flattened `(B·S)`
    output, and those targets: position t of row b predicts label t+1. Made on the host with the batch
    (batches.py), so the loss picks its rows without waiting for the GPU."""
    width = labels.shape[1]
    batch_index, position = (labels[:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)
    return batch_index * width + position, labels[batch_index, position + 1]


def flatten_for_varlen(
    batch: dict[str, torch.Tensor], max_length: int | None = None, whole_rows: bool = False
) -> dict[str, Any]:
    """A collated micro-batch `(B, S)` as one row `(1, B·S)` plus varlen keyword arguments. The first label of
    every document is IGNORE_INDEX (packing.Pack.add), so the loss across a row boundary is unchanged.
    `max_length`: a fixed bound to pass as the longest document instead of the batch's own (the kernel
    only sizes its grid by it), so that a compiled model sees one value and never recompiles for it.
    `whole_rows`: when every row is one document filling it (position ids 0..S-1), keep `(B, S)` with no
    varlen arguments: attention.varlen_attention then runs causal attention per row."""
    positions = batch["position_ids"]
    if whole_rows and bool((positions == torch.arange(positions.shape[1])).all()):
        return {key: batch[key] for key in ("input_ids", "labels", "position_ids")}
    flat = {key: batch[key].reshape(1, -1) for key in ("input_ids", "labels", "position_ids")}
    extra = varlen_kwargs(batch["position_ids"])
    if max_length is not None:
        extra["max_length_q"] = extra["max_length_k"] = max_length
    return {**flat, **extra}

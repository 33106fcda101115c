"""Pack encoded conversations into fixed-length sequences with per-document attention isolation.

Glaive conversations average ≈500 tokens (docs/glaive-format.md), so padding each one to 4096 wastes most of
the compute. `pack` places whole documents into sequences of at most `max_seq_len` tokens (greedy
first-fit, order-stable); `collate` turns packs into model inputs in which no document sees another:

- eager / SDPA attention: `attention_mask` is a 4D additive float mask `(batch, 1, seq, seq)`: 0 where
  a query may attend, `torch.finfo(dtype).min` where not; causal *and* block-diagonal per document.
  transformers 5.x passes a 4D mask through unchanged (`masking_utils._preprocess_mask_arguments`: "If
  the mask is already 4D, simply return as-is"); the eager path adds it to the scores
  (`attn_weights + attention_mask`, so it must be additive, not boolean) and SDPA takes it as
  `attn_mask`. Each padding token attends only to itself, so no row is fully masked (no NaN from
  softmax) and padding never reaches a real token.
- flash-attention varlen: transformers finds document boundaries from `position_ids` restarting at 0
  (`modeling_flash_attention_utils._is_packed_sequence` / `prepare_fa_kwargs_from_position_ids`), but
  only with `attention_mask=None` and a batch of one row. The same collated batch works there: drop
  `attention_mask` and either flatten it to one row or pass `varlen_kwargs(batch["position_ids"])`
  (cu_seqlens over the flattened batch; padding is one extra segment per row and has no labels).
- Without a 4D mask, SDPA/eager in transformers 5.x also infer the blocks from position_ids, but only
  when no KV cache is passed (use_cache=False) and with padding merged into the last document; the
  explicit mask does not depend on that.

Labels: the model's loss shifts labels by one (token t predicts label t+1), so at a document boundary
the last token of one document would be scored on the first token of the next. `pack` therefore sets
the first label of every document to IGNORE_INDEX; that label is never a target when the document is
alone either, so the packed loss equals the unpacked loss exactly
(tests/finetune/data/test_finetune_packing.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gpuval.finetune.template import IGNORE_INDEX


@dataclass
class Pack:
    """One packed sequence: documents back to back, no padding (collate pads)."""

    input_ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)  # 0, 1, ... restarting for every document
    seq_lens: list[int] = field(default_factory=list)  # document lengths in order

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def cu_seqlens(self) -> list[int]:
        """Cumulative document boundaries `[0, s_0, s_0 + s_1, ...]`, as flash-attention varlen takes them."""
        bounds = [0]
        for length in self.seq_lens:
            bounds.append(bounds[-1] + length)
        return bounds

    @property
    def label_count(self) -> int:
        return sum(label != IGNORE_INDEX for label in self.labels)

    def add(self, input_ids: Sequence[int], labels: Sequence[int]) -> None:
        self.input_ids.extend(input_ids)
        self.labels.append(
            IGNORE_INDEX
        )  # see the module docstring: never a target, blocks cross-document loss
        self.labels.extend(labels[1:])
        self.position_ids.extend(range(len(input_ids)))
        self.seq_lens.append(len(input_ids))


@dataclass(frozen=True)
class PackResult:
    packs: list[Pack]
    max_seq_len: int
    documents: int  # documents given
    cut: int  # longer than max_seq_len: kept their first max_seq_len tokens
    dropped: int  # no label token left (after a cut, or none to begin with): not packed
    real_tokens: int  # tokens of the packed documents

    @property
    def slots(self) -> int:
        """Token slots when every pack is padded to max_seq_len."""
        return len(self.packs) * self.max_seq_len

    @property
    def efficiency(self) -> float:
        """Real tokens / slots: 1.0 means no padding at all."""
        return self.real_tokens / self.slots if self.slots else 0.0


def pack_with_stats(encoded_docs: Iterable[Any], max_seq_len: int) -> PackResult:
    """Greedy first-fit: each document goes into the first pack (in creation order) with room for it.

    A document is anything with `input_ids` and `labels` (template.Encoded, or a dict). One longer than
    `max_seq_len` is cut to its first `max_seq_len` tokens and counted in `cut`; one with no label token
    (after the cut) teaches nothing and is dropped and counted in `dropped`. A tree of the packs' free space
    finds the first fit in O(log n); the cost is copying tokens in Python (≈40 s for 100k documents of
    ~800 tokens on the 2-core dev CPU).
    """
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len must be at least 1, got {max_seq_len}")
    docs = [_ids_and_labels(doc) for doc in encoded_docs]
    free = _FirstFit(len(docs))
    packs: list[Pack] = []
    cut = dropped = real = 0
    for input_ids, labels in docs:
        if len(input_ids) > max_seq_len:
            cut += 1
            input_ids, labels = input_ids[:max_seq_len], labels[:max_seq_len]
        # labels[0] is never a target (see Pack.add), so it does not count.
        if not input_ids or all(label == IGNORE_INDEX for label in labels[1:]):
            dropped += 1
            continue
        index = free.first_with(len(input_ids))
        if index is None:
            index = len(packs)
            packs.append(Pack())
            free.set(index, max_seq_len)
        packs[index].add(input_ids, labels)
        free.set(index, max_seq_len - len(packs[index]))
        real += len(input_ids)
    return PackResult(packs, max_seq_len, len(docs), cut, dropped, real)


def pack(encoded_docs: Iterable[Any], max_seq_len: int) -> list[Pack]:
    """`pack_with_stats(...).packs`: the packs alone."""
    return pack_with_stats(encoded_docs, max_seq_len).packs


def padding_efficiency(packs: Sequence[Pack], seq_len: int) -> float:
    """Real tokens / (packs × seq_len): the share of a padded batch's slots that hold document tokens."""
    slots = len(packs) * seq_len
    return sum(len(p) for p in packs) / slots if slots else 0.0


def collate(
    packs: Sequence[Pack],
    pad_id: int,
    pad_to: int | None = None,
    dtype: torch.dtype = torch.float32,
    with_mask: bool = True,
) -> dict[str, torch.Tensor]:
    """Model inputs for a batch of packs, padded on the right to `pad_to` (default: the longest pack).

    Returns `input_ids`, `labels` (IGNORE_INDEX on padding), `position_ids` (restarting per document; padding
    counts on from 0 as one more segment) and `attention_mask`, a `(batch, 1, seq, seq)` additive mask in
    `dtype` (use the model's dtype: SDPA wants the mask in the query's dtype) — see the module docstring.
    """
    if not packs:
        raise ValueError("collate needs at least one pack")
    seq = max(len(p) for p in packs) if pad_to is None else pad_to
    if any(len(p) > seq for p in packs):
        raise ValueError(f"a pack is longer than pad_to={seq}")
    batch = len(packs)
    input_ids = torch.full((batch, seq), pad_id, dtype=torch.long)
    labels = torch.full((batch, seq), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((batch, seq), dtype=torch.long)
    # Document id of every token; each padding token gets an id of its own so it attends only to itself.
    segments = torch.arange(seq).add(seq).repeat(batch, 1)
    for row, p in enumerate(packs):
        n = len(p)
        input_ids[row, :n] = torch.tensor(p.input_ids, dtype=torch.long)
        labels[row, :n] = torch.tensor(p.labels, dtype=torch.long)
        position_ids[row, :n] = torch.tensor(p.position_ids, dtype=torch.long)
        position_ids[row, n:] = torch.arange(seq - n)
        segments[row, :n] = torch.repeat_interleave(torch.arange(len(p.seq_lens)), torch.tensor(p.seq_lens))
    batch = {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}
    if not with_mask:  # the caller builds the mask where it computes (document_mask(segments) on a GPU)
        return {**batch, "segments": segments}
    return {**batch, "attention_mask": document_mask(segments, dtype)}


def document_mask(segments: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive `(batch, 1, seq, seq)` mask from per-token segment ids `(batch, seq)`: query q may attend
    key k when k <= q and both lie in the same segment (0.0), else `finfo(dtype).min`, as transformers' own
    masks."""
    seq = segments.shape[-1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=segments.device).tril()
    allowed = (segments[:, :, None] == segments[:, None, :]) & causal
    mask = torch.zeros(allowed.shape, dtype=dtype, device=segments.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None, :, :]


def varlen_kwargs(position_ids: torch.Tensor) -> dict[str, Any]:
    """Flash-attention varlen keyword arguments for a batch flattened to one row: `cu_seq_lens_q/k` (int32)
    and `max_length_q/k`, a segment starting wherever a position id is 0 (what transformers infers from
    position_ids in `prepare_fa_kwargs_from_position_ids`)."""
    flat = position_ids.reshape(-1)
    starts = (flat == 0).nonzero().view(-1)
    cu = torch.cat([starts, torch.tensor([flat.numel()])]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def seq_lens_squared_mean(seq_lens: Iterable[int]) -> float:
    """S_eff, the mean attention context per token of documents with lengths s_i.

    Used in the attention term 12·L·d·S_eff of the per-token fine-tune FLOPs (MFU). Each of the s_i
    tokens of document i attends within its own s_i tokens, so the token-weighted mean context is
    Σ s_i·s_i / Σ s_i; one unpacked sequence of length S gives S.
    """
    # S_eff = Σ s_i² / Σ s_i for packed documents with per-document attention (docs/mfu.md; attention
    # term after PaLM, app. B).
    lengths = [int(s) for s in seq_lens]
    total = sum(lengths)
    return sum(s * s for s in lengths) / total if total else 0.0


def packs_s_eff(packs: Iterable[Pack]) -> float:
    """S_eff over every document of the packs (padding excluded)."""
    return seq_lens_squared_mean(s for p in packs for s in p.seq_lens)


def _ids_and_labels(doc: Any) -> tuple[list[int], list[int]]:
    if isinstance(doc, dict):
        input_ids, labels = doc["input_ids"], doc["labels"]
    else:
        input_ids, labels = doc.input_ids, doc.labels
    input_ids, labels = list(input_ids), list(labels)
    if len(input_ids) != len(labels):
        raise ValueError(f"document has {len(input_ids)} input ids but {len(labels)} labels")
    return input_ids, labels


class _FirstFit:
    """Max-tree over pack free space: the leftmost pack with at least `need` free slots in O(log n)."""

    def __init__(self, capacity: int) -> None:
        self.size = 1
        while self.size < max(capacity, 1):
            self.size *= 2
        self.tree = [-1] * (2 * self.size)  # -1: no pack there yet

    def set(self, index: int, free: int) -> None:
        node = index + self.size
        self.tree[node] = free
        node //= 2
        while node:
            self.tree[node] = max(self.tree[2 * node], self.tree[2 * node + 1])
            node //= 2

    def first_with(self, need: int) -> int | None:
        if self.tree[1] < need:
            return None
        node = 1
        while node < self.size:
            node = 2 * node if self.tree[2 * node] >= need else 2 * node + 1
        return node - self.size

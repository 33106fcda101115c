"""packing.py: packed documents give the same logits and loss as each document alone (the tiny model in
float64: a pack and a document alone sum the same terms in another order, which float32 on some CPU's kernels
would show; conftest's assert_close_to_scale; transformers' eager attention keeps a float32 softmax:
PACKED_REL)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import FLOAT64_REORDERED, assert_close_to_scale  # noqa: E402

from gpuval.finetune.data.packing import (  # noqa: E402
    Pack,
    collate,
    document_mask,
    pack,
    pack_with_stats,
    packs_s_eff,
    padding_efficiency,
    seq_lens_squared_mean,
    varlen_kwargs,
)
from gpuval.finetune.model import load_model, load_tokenizer  # noqa: E402
from gpuval.finetune.template import IGNORE_INDEX, Encoded, encode  # noqa: E402

X = IGNORE_INDEX
WEATHER = {
    "name": "get_weather",
    "description": "Get the weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
EXAMPLES = [
    {
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": "Weather in Zürich for 2 days?"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [{"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}],
            },
            {"role": "tool", "content": '{"temperature_c": 3}'},
            {"role": "assistant", "content": "It is 3 °C in Zürich."},
        ],
    },
    {
        "tools": [],
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    },
    {
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": "Is it raining in Oslo?"},
            {"role": "assistant", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]},
        ],
    },
    {
        "tools": [],
        "messages": [
            {"role": "user", "content": "Book me a flight to Lima."},
            {"role": "assistant", "content": "I cannot book flights; I have no function for that."},
        ],
    },
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def docs(tokenizer):
    encoded = [encode(example, tokenizer, 10_000) for example in EXAMPLES]
    assert all(doc.label_count > 0 and not doc.truncated for doc in encoded)
    return encoded


@pytest.fixture(scope="module")
def models():
    built = {}
    for implementation in ("eager", "sdpa"):
        model = load_model("tiny", torch.float64)
        model.set_attn_implementation(implementation)
        built[implementation] = model.eval()
    return built


# rel of the packed against the unpacked logits and loss: SDPA computes in the model's float64; transformers'
# eager attention takes its softmax in float32 whatever the model's dtype (qwen2's eager_attention_forward),
# probabilities rounded to 2^-24 of themselves, which reach the logits as up to 2.2e-6 of the largest
# (measured on the AVX-512, AVX2 and default kernel paths)
PACKED_REL = {"eager": 1e-5, "sdpa": FLOAT64_REORDERED}


def per_token_losses(logits, labels):
    """Next-token cross entropy per position (0 where the target is IGNORE_INDEX), as the HF loss shifts; in
    float32, or float64 for float64 logits."""
    return torch.nn.functional.cross_entropy(
        logits[..., :-1, :]
        .reshape(-1, logits.shape[-1])
        .to(torch.promote_types(logits.dtype, torch.float32)),
        labels[..., 1:].reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )


def alone(model, doc):
    ids = torch.tensor([doc.input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    return logits, per_token_losses(logits, torch.tensor(doc.labels))


def packed_setup(docs, tokenizer):
    longest = max(len(doc.input_ids) for doc in docs)
    packs = pack(docs, longest + 40)  # several documents per pack, and some padding in the batch
    assert len(packs) >= 2 and any(len(p.seq_lens) >= 2 for p in packs)
    assert len({len(p) for p in packs}) > 1  # the shorter pack is padded
    return packs, collate(packs, tokenizer.pad_token_id or 0, dtype=torch.float64)  # the models' dtype


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_packed_loss_and_logits_equal_unpacked(models, docs, tokenizer, implementation):
    model = models[implementation]
    packs, batch = packed_setup(docs, tokenizer)
    with torch.no_grad():
        out = model(**batch)
    assert torch.isfinite(out.logits).all()

    # Per-document logits: slice each document out of its pack and compare with the document alone.
    results = {tuple(doc.input_ids): alone(model, doc) for doc in docs}
    seen = 0
    for row, p in enumerate(packs):
        bounds = p.cu_seqlens
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            logits_alone, _ = results[tuple(p.input_ids[start:end])]
            assert_close_to_scale(out.logits[row, start:end], logits_alone, rel=PACKED_REL[implementation])
            seen += 1
    assert seen == len(docs)

    # Loss: sum over label tokens and the token-weighted mean.
    packed_losses = per_token_losses(out.logits, batch["labels"])
    alone_sum = sum(losses.sum() for _, losses in results.values())
    alone_count = sum(doc.label_count for doc in docs)
    packed_count = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
    assert packed_count == alone_count  # the first label of each document is never a target (it is a header)
    assert_close_to_scale(packed_losses.sum(), alone_sum, rel=PACKED_REL[implementation])
    # HF's own mean, which transformers computes in float32 (loss_utils.ForCausalLMLoss): the packed logits'
    # token-weighted mean in float32, summed in another order: at most N·2^-24 of the sum for N ≤ 160
    # non-negative terms
    in_float32 = per_token_losses(out.logits.float(), batch["labels"]).sum() / alone_count
    assert_close_to_scale(out.loss, in_float32, rel=1e-5)


def test_without_isolation_the_loss_differs(models, docs, tokenizer):
    """The test above can fail: a plain causal mask over the whole pack lets documents see each other."""
    model = models["sdpa"]
    packs, batch = packed_setup(docs, tokenizer)
    causal_only = document_mask(torch.zeros_like(batch["input_ids"]))
    with torch.no_grad():
        isolated = model(**batch)
        leaky = model(**{**batch, "attention_mask": causal_only})
    assert not torch.allclose(isolated.loss, leaky.loss, rtol=1e-5, atol=0)
    # Every document after the first in a pack sees the earlier ones: its logits move far beyond rounding.
    checked = 0
    for row, p in enumerate(packs):
        start, end = p.cu_seqlens[1], len(p)
        if start == end:  # one document in this pack: nothing before it to see
            continue
        moved = float((isolated.logits[row, start:end] - leaky.logits[row, start:end]).abs().max())
        assert moved > 1e-2 * float(isolated.logits[row, start:end].abs().max()), (row, moved)
        checked += 1
    assert checked


def test_transformers_infers_isolation_from_position_ids_without_a_mask(models, docs, tokenizer):
    """transformers 5.x (masking_utils.find_packed_sequence_indices) builds the same block mask itself when
    attention_mask is None — but only without a KV cache (use_cache=False; with the tiny config's default
    use_cache=True it silently does not), and padding would join the last segment. Hence collate's explicit
    4D mask; here a batch with no padding."""
    model = models["sdpa"]
    packs, _ = packed_setup(docs, tokenizer)
    full = [p for p in packs if len(p.seq_lens) >= 2][:1]
    batch = collate(full, 0, dtype=torch.float64)
    with torch.no_grad():
        ours = model(**batch).logits
        inferred = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
        ).logits
    assert_close_to_scale(ours, inferred, rel=FLOAT64_REORDERED)  # one mask built two ways


def test_position_ids_restart_and_padding_is_ignored(docs):
    packs = pack(docs, 10_000)
    assert len(packs) == 1
    batch = collate(packs, pad_id=7, pad_to=len(packs[0]) + 5)
    positions = batch["position_ids"][0].tolist()
    starts = packs[0].cu_seqlens[:-1]
    assert [i for i, position in enumerate(positions) if position == 0] == [*starts, len(packs[0])]
    for start, length in zip(starts, packs[0].seq_lens, strict=True):
        assert positions[start : start + length] == list(range(length))
    assert batch["input_ids"][0, -5:].tolist() == [7] * 5
    assert batch["labels"][0, -5:].tolist() == [X] * 5
    assert batch["labels"][0, starts].tolist() == [X] * len(starts)


def test_mask_is_causal_block_diagonal_and_padding_attends_only_itself():
    p = Pack()
    p.add([1, 2, 3], [X, 2, 3])
    p.add([4, 5], [X, 5])
    batch = collate([p], pad_id=0, pad_to=7)
    allowed = (batch["attention_mask"][0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 0, 1],
    ]
    assert batch["attention_mask"].shape == (1, 1, 7, 7)
    assert batch["attention_mask"].min() == torch.finfo(torch.float32).min
    assert collate([p], 0, dtype=torch.bfloat16)["attention_mask"].dtype == torch.bfloat16


def test_long_document_is_cut_or_dropped():
    long_doc = Encoded(list(range(1, 11)), [X, X, X, X, X, X, 7, 8, 9, 10], truncated=False)
    late_labels = Encoded(list(range(1, 11)), [X] * 8 + [9, 10], truncated=False)
    no_labels = {"input_ids": [1, 2], "labels": [X, X]}
    result = pack_with_stats([long_doc, late_labels, no_labels], max_seq_len=8)
    assert (result.documents, result.cut, result.dropped) == (3, 2, 2)
    assert len(result.packs) == 1
    (only,) = result.packs
    assert only.input_ids == list(range(1, 9))
    assert only.labels == [X, X, X, X, X, X, 7, 8]
    assert only.seq_lens == [8]


def test_first_fit_and_efficiency_by_hand():
    def doc(n):
        return {"input_ids": [5] * n, "labels": [X] + [5] * (n - 1)}

    # Lengths 6, 5, 3, 2, 4 into 8: first fit → [6, 2], [5, 3], [4].
    result = pack_with_stats([doc(n) for n in (6, 5, 3, 2, 4)], max_seq_len=8)
    assert [p.seq_lens for p in result.packs] == [[6, 2], [5, 3], [4]]
    assert [p.cu_seqlens for p in result.packs] == [[0, 6, 8], [0, 5, 8], [0, 4]]
    assert result.real_tokens == 20 and result.slots == 24
    assert result.efficiency == pytest.approx(20 / 24)
    assert padding_efficiency(result.packs, 8) == pytest.approx(20 / 24)
    assert padding_efficiency(result.packs, 10) == pytest.approx(20 / 30)
    # Unpacked, each document padded to 8: 20 / 40.
    assert padding_efficiency([Pack(input_ids=[5] * n) for n in (6, 5, 3, 2, 4)], 8) == pytest.approx(0.5)


def test_s_eff():
    assert seq_lens_squared_mean([4096]) == 4096
    assert seq_lens_squared_mean([500] * 8) == 500
    assert seq_lens_squared_mean([6, 2]) == pytest.approx((36 + 4) / 8)
    assert seq_lens_squared_mean([]) == 0.0
    packs = pack([{"input_ids": [5] * n, "labels": [X, 5] + [X] * (n - 2)} for n in (6, 5, 3, 2, 4)], 8)
    assert packs_s_eff(packs) == pytest.approx((36 + 25 + 9 + 4 + 16) / 20)


def test_varlen_kwargs_match_transformers_flash_attention_inference(docs, tokenizer):
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    packs, batch = packed_setup(docs, tokenizer)
    ours = varlen_kwargs(batch["position_ids"])
    (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(batch["position_ids"].reshape(1, -1))
    assert torch.equal(ours["cu_seq_lens_q"], cu_q) and torch.equal(ours["cu_seq_lens_k"], cu_k)
    assert ours["max_length_q"] == int(max_q) and ours["max_length_k"] == int(max_k)
    # Every document boundary of every pack is a boundary of the flattened batch.
    width = batch["input_ids"].shape[1]
    boundaries = set(ours["cu_seq_lens_q"].tolist())
    for row, p in enumerate(packs):
        assert {row * width + b for b in p.cu_seqlens} <= boundaries

"""The step's kernels on a CPU (attention.py, liger_ops.py, loss_head.py, last_mlp_rows.py): the varlen
attention path (registered with transformers, documents by cu_seq_lens, no mask) computes what the masked
SDPA path computes, in the model and in `train`; the choice of attention and kernels per device; errors
that name the setting.

Two paths that compute the same sums (fewer rows against all rows, per document against one masked
product) run in float64 and are compared by conftest's assert_close_to_scale: in float32 their sums in another
order differ by more than a fixed tolerance on some CPU's kernels (issue 48), in float64 by nothing a test can
see, while a real fault moves values by a percent or more."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
from conftest import FLOAT64_REORDERED, assert_close_to_scale  # noqa: E402
from finetune_runs import config_dict  # noqa: E402
from step_parts import decide  # noqa: E402

from gpuval.errors import UsageError  # noqa: E402
from gpuval.finetune.config import finetune_config_from_dict  # noqa: E402
from gpuval.finetune.data.batches import flatten_for_varlen, label_rows  # noqa: E402
from gpuval.finetune.data.packing import Pack, collate  # noqa: E402
from gpuval.finetune.model import load_model  # noqa: E402
from gpuval.finetune.step.attention import AttentionPart, use_varlen_attention  # noqa: E402
from gpuval.finetune.step.last_mlp_rows import LastMlpRows  # noqa: E402
from gpuval.finetune.step.liger_ops import LigerOpsPart  # noqa: E402
from gpuval.finetune.step.loss_head import LossHead  # noqa: E402
from gpuval.finetune.template import IGNORE_INDEX  # noqa: E402
from gpuval.finetune.trainer import train  # noqa: E402


def _packs(vocab: int, rows: tuple[tuple[int, ...], ...] = ((37, 5, 60), (50, 21))) -> list[Pack]:
    """One pack per row of documents of these lengths (by default uneven: one row shorter, padded)."""
    generator = torch.Generator().manual_seed(sum(map(len, rows)))
    packs = []
    for lengths in rows:
        pack = Pack()
        for length in lengths:
            ids = torch.randint(3, vocab, (length,), generator=generator).tolist()
            pack.add(ids, ids)
        packs.append(pack)
    return packs


def test_label_rows_are_the_positions_whose_next_token_is_a_target_by_hand():
    I = IGNORE_INDEX  # noqa: E741
    labels = torch.tensor([[I, I, 7, 8, I], [9, I, I, I, 4]])  # row 1's first label is never a target
    rows, targets = label_rows(labels)
    # row 0: positions 1, 2 predict 7, 8; row 1 (offset 5): position 3 predicts 4
    assert rows.tolist() == [1, 2, 5 + 3] and targets.tolist() == [7, 8, 4]
    none_rows, none_targets = label_rows(torch.full((2, 4), I))
    assert none_rows.numel() == 0 and none_targets.numel() == 0


@pytest.mark.parametrize("shape", [(3, 40), (1, 120)])  # rows of a micro-batch; one varlen row
def test_the_labelled_rows_loss_equals_cross_entropy_over_every_position_in_value_and_gradient(shape):
    """Reference: F.cross_entropy over every shifted position with ignore_index, as transformers' loss does;
    the head sees only the labelled rows and must give the same sum and the same gradient."""
    generator = torch.Generator().manual_seed(11)
    vocab = 50
    labels = torch.randint(0, vocab, shape, generator=generator)
    labels[torch.rand(shape, generator=generator) < 0.5] = IGNORE_INDEX
    logits = torch.randn(*shape, vocab, generator=generator, dtype=torch.float64, requires_grad=True)
    reference = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, vocab),
        labels[:, 1:].reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    (expected_grad,) = torch.autograd.grad(reference, logits)
    loss = LossHead.plain()(logits, *label_rows(labels))
    (grad,) = torch.autograd.grad(loss, logits)
    assert loss.dtype == torch.float64  # float64 logits keep float64 sums
    assert_close_to_scale(loss, reference, rel=FLOAT64_REORDERED)  # the same terms, summed in another order
    assert_close_to_scale(grad, expected_grad, rel=FLOAT64_REORDERED)
    assert int((grad.abs().sum(-1) > 0).sum()) == int((labels[:, 1:] != IGNORE_INDEX).sum())  # rows read


def test_logits_kept_for_labelled_rows_give_the_full_heads_loss_and_gradients():
    """A packed micro-batch flattened to one row: the model asked for the labelled positions' logits
    alone (logits_to_keep, as the trainer does without the fused loss) gives the loss and gradients of
    the full logits indexed afterwards."""
    batch = flatten_for_varlen(collate(_packs(3000), 0, 128, with_mask=False))
    batch.pop("segments", None)
    rows, targets = label_rows(batch.pop("labels"))
    assert 0 < rows.numel() < batch["input_ids"].numel()  # some positions are not targets
    results = []
    for keep in (False, True):
        model = load_model("tiny", torch.float64)
        use_varlen_attention(model)
        logits = model(**batch, **({"logits_to_keep": rows} if keep else {})).logits
        assert logits.shape[1] == (rows.numel() if keep else batch["input_ids"].shape[1])
        loss = LossHead.plain()(logits, None if keep else rows, targets)
        loss.backward()
        results.append((loss.detach(), model.model.layers[-1].mlp.down_proj.weight.grad.clone()))
    (full_loss, full_grad), (kept_loss, kept_grad) = results
    assert_close_to_scale(kept_loss, full_loss, rel=FLOAT64_REORDERED)
    assert_close_to_scale(kept_grad, full_grad, rel=FLOAT64_REORDERED)


def test_the_chunked_fused_loss_head_gives_the_plain_heads_loss_and_gradients():
    """LossHead.fuse (gpuval's chunked loss, no Liger needed) on the tiny model: the same loss and LoRA-free
    input gradients as the model's own head and F.cross_entropy over the labelled rows."""
    batch = collate(_packs(3000), 0, 128, with_mask=False)
    rows, targets = label_rows(batch.pop("labels"))
    results = []
    for fused in (False, True):
        model = load_model("tiny", torch.float64)
        for p in model.parameters():
            p.requires_grad_(False)
        head = LossHead.fuse(model) if fused else LossHead.plain()
        embeds = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_(True)
        out = model(inputs_embeds=embeds, position_ids=batch["position_ids"]).logits
        loss = head(out, rows, targets)
        loss.backward()
        results.append((loss.detach(), embeds.grad))
    (plain_loss, plain_grad), (fused_loss, fused_grad) = results
    assert_close_to_scale(fused_loss, plain_loss, rel=FLOAT64_REORDERED)
    assert_close_to_scale(fused_grad, plain_grad, rel=FLOAT64_REORDERED)


def test_a_micro_batch_without_targets_gives_a_zero_loss_that_still_backpropagates():
    logits = torch.randn(2, 6, 9, requires_grad=True)
    loss = LossHead.plain()(logits, *label_rows(torch.full((2, 6), IGNORE_INDEX)))
    loss.backward()
    assert float(loss) == 0.0 and torch.equal(logits.grad, torch.zeros_like(logits))


def test_varlen_attention_equals_the_masked_sdpa_path_in_loss_and_gradients():
    packs = _packs(3000)
    results = []
    for attention in ("sdpa", "varlen"):
        model = load_model("tiny", torch.float64)
        if attention == "varlen":
            use_varlen_attention(model)
            batch = flatten_for_varlen(collate(packs, 0, 128, with_mask=False))
            batch.pop("segments", None)
        else:
            batch = collate(packs, 0, 128, torch.float64)  # the mask in the query's dtype
        labels = batch.pop("labels")
        loss = LossHead.plain()(model(**batch).logits, *label_rows(labels))
        loss.backward()
        grad = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
        results.append((loss.detach(), grad, int((labels[:, 1:] != IGNORE_INDEX).sum())))
    (loss_sdpa, grad_sdpa, n_sdpa), (loss_varlen, grad_varlen, n_varlen) = results
    assert n_sdpa == n_varlen  # flattening the rows adds no target across the row boundary
    # the same sums in another order (per-document SDPA against one masked SDPA)
    assert_close_to_scale(loss_varlen, loss_sdpa, rel=FLOAT64_REORDERED)
    assert_close_to_scale(grad_varlen, grad_sdpa, rel=FLOAT64_REORDERED)


def test_varlen_attention_keeps_documents_apart():
    """Changing one document's tokens changes no other document's logits."""
    packs = _packs(3000)
    model = load_model("tiny", torch.float64)
    use_varlen_attention(model)

    def logits(p: list[Pack]) -> torch.Tensor:
        batch = flatten_for_varlen(collate(p, 0, 128, with_mask=False))
        return model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], **_cu(batch)).logits

    before = logits(packs)
    changed = _packs(3000)
    changed[0].input_ids[37:42] = [7, 8, 9, 10, 11]  # the second document of the first row
    after = logits(changed)
    assert_close_to_scale(after[0, :37], before[0, :37], rel=FLOAT64_REORDERED)  # the first document
    assert_close_to_scale(after[0, 42:], before[0, 42:], rel=FLOAT64_REORDERED)  # the third, and after
    assert not torch.allclose(after[0, 37:42], before[0, 37:42])


def test_varlen_attention_makes_transformers_skip_its_packed_sequence_check(monkeypatch):
    """transformers' packed-sequence check ends in `if tensor.all()`, a host wait for the GPU at every
    forward; the varlen implementation needs no mask, so the check must not run, packed or whole rows."""
    from transformers import masking_utils

    def refuse(_position_ids):
        raise AssertionError("find_packed_sequence_indices ran")

    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", refuse)
    model = load_model("tiny", torch.float32)
    model.config.use_cache = False  # as the trainer runs it: no KV cache
    use_varlen_attention(model)
    for whole_rows, packs in ((False, _packs(3000)), (True, _whole_packs(3000))):
        batch = flatten_for_varlen(
            collate(packs, 0, 128 if not whole_rows else 64, with_mask=False), whole_rows=whole_rows
        )
        model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], **_cu(batch))
    sdpa = load_model("tiny", torch.float32)  # the check is real: SDPA with position ids runs it
    sdpa.config.use_cache = False
    batch = flatten_for_varlen(collate(_packs(3000), 0, 128, with_mask=False))
    with pytest.raises(AssertionError, match="find_packed_sequence_indices ran"):
        sdpa(input_ids=batch["input_ids"], position_ids=batch["position_ids"])


def _whole_packs(vocab: int, length: int = 64) -> list[Pack]:
    """Two packs that are one document each, filling the row (fixed-length data)."""
    return _packs(vocab, ((length,), (length,)))


def test_whole_document_rows_skip_varlen_and_give_the_flattened_loss_and_gradients():
    packs = _whole_packs(3000)
    kept = flatten_for_varlen(collate(packs, 0, 64, with_mask=False), whole_rows=True)
    assert kept["input_ids"].shape == (2, 64) and not _cu(kept)  # no flattening, no varlen arguments
    flat = flatten_for_varlen(collate(packs, 0, 64, with_mask=False))
    assert flat["input_ids"].shape == (1, 128) and flat["cu_seq_lens_q"].tolist() == [0, 64, 128]
    results = []
    for batch in (flat, kept):
        model = load_model("tiny", torch.float64)
        use_varlen_attention(model, "cudnn")  # on a CPU: whole rows through plain causal SDPA
        batch = dict(batch)
        labels = batch.pop("labels")
        loss = LossHead.plain()(model(**batch).logits, *label_rows(labels))
        loss.backward()
        results.append((loss.detach(), model.model.layers[0].self_attn.k_proj.weight.grad.clone()))
    (loss_flat, grad_flat), (loss_rows, grad_rows) = results
    assert_close_to_scale(loss_rows, loss_flat, rel=FLOAT64_REORDERED)
    assert_close_to_scale(grad_rows, grad_flat, rel=FLOAT64_REORDERED)


def test_rows_with_several_documents_or_padding_are_still_flattened():
    for packs, width in ((_packs(3000), 128), (_whole_packs(3000, 60), 64)):  # 2-3 documents; padded rows
        batch = flatten_for_varlen(collate(packs, 0, width, with_mask=False), whole_rows=True)
        assert batch["input_ids"].shape == (1, 2 * width) and "cu_seq_lens_q" in batch


def _cu(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k.startswith(("cu_seq_lens", "max_length"))}


@pytest.mark.slow
def test_train_with_varlen_attention_matches_sdpa_step_for_step(runtime, train_file, tmp_path, monkeypatch):  # noqa: F811, E501
    """Also the last MLP on labelled rows (varlen side) against every row (sdpa side): the loss is the same,
    and the trainer sets the rows around each micro-batch and clears them after its backward."""
    calls: list[int | None] = []
    use = LastMlpRows.use

    def recording(self, rows):
        calls.append(None if rows is None else rows.numel())
        use(self, rows)

    monkeypatch.setattr(LastMlpRows, "use", recording)
    losses = {}
    for attention, last_mlp_rows in (("sdpa", "all"), ("varlen", "labelled")):
        cfg = finetune_config_from_dict(
            config_dict(
                train_file,
                tmp_path / attention,
                max_steps=3,
                micro_batch_size=2,
                step={"attention": attention, "last_mlp_rows": last_mlp_rows},
                log={"tensorboard": False},
            )
        )
        summary = train(cfg, runtime, save_adapter=False, quiet=True)
        assert summary["attention"] == attention and summary["kernels"] == "torch"
        assert summary["last_mlp_rows"] == last_mlp_rows
        losses[attention] = [s["loss"] for s in summary["steps"]]
    assert losses["varlen"] == pytest.approx(losses["sdpa"], rel=1e-4)
    # varlen side only: 3 steps x 2 micro-batches, each set to its labelled rows, then cleared
    assert len(calls) == 12 and calls[1::2] == [None] * 6 and all(n and n > 1 for n in calls[::2])


def _attention(**settings):
    return decide(AttentionPart(), **settings)


def _kernels(**settings) -> str:
    return decide(LigerOpsPart(), **settings).choice


def test_device_defaults_and_settings_that_cannot_run_here():
    assert _attention(attention="auto", on_gpu=False).choice == "varlen"  # runs per document on a CPU
    assert _attention(attention="sdpa", on_gpu=False).choice == "sdpa"
    assert not _attention(attention="sdpa", on_gpu=False).on
    assert _kernels(kernels="auto", on_gpu=False) == "torch"
    assert _attention(row_kernel="auto", on_gpu=True).settings["row_kernel"] == "varlen"  # no Hopper here
    assert _attention(row_kernel="flash", on_gpu=False).settings["row_kernel"] == "flash"
    assert _kernels(kernels="torch", on_gpu=True) == "torch"
    with pytest.raises(UsageError, match=r"^train.step.kernels=liger: Liger-Kernel runs on CUDA GPUs only"):
        _kernels(kernels="liger", on_gpu=False)
    # gpuval's own fused loss needs no Liger, on a CPU too
    assert _kernels(kernels="liger-loss", on_gpu=False) == "liger-loss"
    with pytest.raises(
        UsageError, match=r"^train.step.loss_kernel=liger: Liger-Kernel runs on CUDA GPUs only"
    ):
        _kernels(kernels="liger-loss", on_gpu=False, loss_kernel="liger")


def test_float32_weights_on_a_gpu_take_sdpa_since_the_flash_kernels_take_half_precision_only(monkeypatch):
    """The tiny config (float32, no autocast) on a GPU stopped at its first step with FlashAttention's "only
    support fp16 and bf16" when auto chose varlen; now auto picks SDPA there and varlen by hand is refused
    up front. bf16 on a GPU and float32 on a CPU keep varlen."""
    from gpuval.finetune.step import attention

    monkeypatch.setattr(attention, "_varlen_attn", lambda: object())  # as on a GPU with torch >= 2.10
    assert _attention(attention="auto", on_gpu=True, dtype="float32").choice == "sdpa"
    assert _attention(attention="auto", on_gpu=True, dtype="bfloat16").choice == "varlen"
    assert _attention(attention="auto", on_gpu=False, dtype="float32").choice == "varlen"
    with pytest.raises(UsageError, match=r"^train.step.attention=varlen runs flash kernels.*float32: set"):
        _attention(attention="varlen", on_gpu=True, dtype="float32")


@pytest.mark.parametrize("installed", [True, False], ids=["liger", "no-liger"])
def test_auto_kernels_on_a_gpu_keep_the_fused_loss_with_or_without_liger(monkeypatch, installed):
    """Whether Liger-Kernel is installed only decides Liger's model kernels in uncompiled layers: the fused
    loss (gpuval's own by default) is chosen on a GPU either way, so its logits are never materialised."""
    from gpuval.finetune.step import liger_ops

    monkeypatch.setattr(liger_ops, "_liger_installed", lambda: installed)
    assert _kernels(kernels="auto", on_gpu=True, compiled=True) == "liger-loss"
    assert _kernels(kernels="auto", on_gpu=True, compiled=False) == ("liger" if installed else "liger-loss")
    assert _kernels(kernels="liger-loss", on_gpu=True) == "liger-loss"
    if installed:
        assert _kernels(kernels="auto", on_gpu=True, compiled=True, loss_kernel="liger") == "liger-loss"
        return
    for setting, option in (("liger", "kernels"), ("auto", "loss_kernel"), ("liger-loss", "loss_kernel")):
        loss_kernel = "liger" if option == "loss_kernel" else "auto"
        with pytest.raises(
            UsageError, match=rf"^train.step.{option}=liger: Liger-Kernel is not installed"
        ) as err:
            _kernels(kernels=setting, on_gpu=True, compiled=True, loss_kernel=loss_kernel)
        assert "\n" not in str(err.value) and "pip install 'gpuval[gpu]'" in str(err.value)
    # transformers' own loss asks for no fused loss: the fused loss part refuses loss_kernel there itself
    assert _kernels(kernels="torch", on_gpu=True, loss_kernel="liger") == "torch"


def test_a_gpu_without_liger_says_so_in_one_line_naming_the_install(monkeypatch):
    from gpuval.finetune.step import liger_ops

    monkeypatch.setattr(liger_ops, "_liger_installed", lambda: False)
    note = decide(LigerOpsPart(), on_gpu=True, compiled=False).note
    assert note is not None and "\n" not in note and "pip install 'gpuval[gpu]'" in note
    monkeypatch.setattr(liger_ops, "_liger_installed", lambda: True)
    assert decide(LigerOpsPart(), on_gpu=True).note is None  # Liger found: nothing to say
    monkeypatch.setattr(liger_ops, "_liger_installed", lambda: False)
    assert decide(LigerOpsPart(), on_gpu=True, compiled=True).note is None  # compiled: none missing
    assert decide(LigerOpsPart(), on_gpu=False).note is None  # a CPU never fuses
    assert decide(LigerOpsPart(), on_gpu=True, kernels="liger-loss").note is None  # the user's choice


@pytest.mark.slow
def test_train_with_the_fused_loss_alone_on_a_cpu_gives_the_plain_losses(runtime, train_file, tmp_path):  # noqa: F811
    """`train.step.kernels=liger-loss` with gpuval's own fused loss runs the whole trainer without Liger (a
    CPU here) and trains exactly as transformers' head and F.cross_entropy do: the same summed loss, float32.
    The tiny model's shape with random weights: the bundled weights predict this data almost perfectly
    (a loss near 1e-5, all rounding), random ones give a loss of about log(vocabulary)."""
    import shutil

    from gpuval.finetune import model as finetune_model

    shape = tmp_path / "tiny-random"
    shape.mkdir()
    shutil.copy(Path(finetune_model.__file__).parent / "tiny_model" / "config.json", shape)
    losses = {}
    for kernels in ("torch", "liger-loss"):
        data = config_dict(
            train_file, tmp_path / kernels, max_steps=3, step={"kernels": kernels}, log={"tensorboard": False}
        )
        data.update(model=str(shape), tokenizer="tiny")
        summary = train(finetune_config_from_dict(data), runtime)
        assert summary["fused_loss"] is (kernels == "liger-loss")
        assert summary["loss_kernel"] == ("chunked" if kernels == "liger-loss" else None)
        losses[kernels] = [s["loss"] for s in summary["steps"]]
    assert losses["torch"][0] > 3  # random weights: far from the answer
    assert losses["liger-loss"] == pytest.approx(losses["torch"], rel=1e-5)


@pytest.mark.parametrize("varlen", [False, True])  # rows of a micro-batch; packed rows flattened to one
def test_last_mlp_on_labelled_rows_gives_the_same_loss_and_gradients_with_fewer_rows(varlen):
    """Reference: the unmodified model. With the last layer's MLP on the labelled rows only, the loss and
    every parameter's gradient (earlier layers' included) must not change, and the MLP must see only
    those rows."""
    packs = _packs(3000)
    batch = collate(packs, 0, 128, torch.float64, with_mask=not varlen)
    if varlen:
        batch = flatten_for_varlen(batch)
        batch.pop("segments", None)
    rows, targets = label_rows(batch.pop("labels"))
    assert 1 < rows.numel() < batch["input_ids"].numel()
    results = []
    for restrict in (False, True):
        model = load_model("tiny", torch.float64)  # float64: the products of fewer rows sum in another order
        if varlen:
            use_varlen_attention(model)
        seen: list[int] = []
        mlp = model.model.layers[-1].mlp
        mlp.down_proj.register_forward_hook(
            lambda _m, args, _out, seen=seen: seen.append(args[0].shape[:-1].numel())
        )
        if restrict:
            last = LastMlpRows.attach(list(model.model.layers))
            assert last is not None
            last.use(rows)
        loss = LossHead.plain()(model(**batch).logits, rows, targets)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), grads, seen))
        if restrict:  # use(None): the whole MLP again, as evaluation needs
            last.use(None)
            model(**batch)
            assert seen[-1] == batch["input_ids"].numel()
    (loss_all, grads_all, seen_all), (loss_rows, grads_rows, seen_rows) = results
    assert seen_all == [batch["input_ids"].numel()] and seen_rows[0] == rows.numel()
    assert_close_to_scale(loss_rows, loss_all, rel=FLOAT64_REORDERED)
    assert grads_rows.keys() == grads_all.keys() and "model.layers.0.mlp.up_proj.weight" in grads_all
    for name, grad in grads_all.items():
        assert_close_to_scale(grads_rows[name], grad, rel=FLOAT64_REORDERED, msg=name)


def test_last_mlp_rows_attaches_to_dense_gated_mlps_only_and_runs_all_rows_below_two():
    model = load_model("tiny", torch.float64)
    layers = list(model.model.layers)
    assert LastMlpRows.attach([torch.nn.Linear(2, 2)]) is None  # no MLP
    assert LastMlpRows.attach([]) is None
    last = LastMlpRows.attach(layers)
    assert last is not None and layers[-1].mlp.forward == last.forward
    assert layers[-2].mlp.forward != last.forward  # the last layer only
    last.use(torch.tensor([3]))  # one row: compile would specialise the size, so every row runs
    assert last.rows is None
    last.use(torch.tensor([1, 4]))
    x = torch.randn(1, 6, model.config.hidden_size, dtype=torch.float64)
    out = layers[-1].mlp(x)
    assert torch.equal(out[0, [0, 2, 3, 5]], torch.zeros(4, x.shape[-1]))  # unread rows: zeros
    last.use(None)
    # products of 2 rows against products of 6: the same sums, in another order on some kernels
    assert_close_to_scale(out[0, [1, 4]], layers[-1].mlp(x)[0, [1, 4]], rel=FLOAT64_REORDERED)


def test_the_fused_loss_runs_under_every_parallel_mode_unless_the_head_is_tied_to_sharded_embeddings(
    capsys,
):
    from step_parts import context

    from gpuval.finetune.parts import Decision
    from gpuval.finetune.step.build import decide_parts
    from gpuval.finetune.step.loss_head import FusedLossPart

    liger_loss = {"liger_ops": Decision(False, "liger-loss", "set")}
    for parallel in ("ddp", "fsdp", "deepspeed"):  # an untied head leaves the model: whole on every rank
        decision = FusedLossPart().decide(context(parallel=parallel, decisions=liger_loss))
        assert decision.on and decision.choice == "chunked" and parallel in decision.why
    # Tied to the input embeddings, the weight stays in the model: ddp keeps it whole, the others shard it.
    assert FusedLossPart().decide(context(parallel="ddp", tied_head=True, decisions=liger_loss)).on
    for parallel in ("fsdp", "deepspeed"):
        decision = FusedLossPart().decide(context(parallel=parallel, tied_head=True, decisions=liger_loss))
        assert not decision.on and "tied to the input embeddings" in decision.why
        assert decision.note and f"train.parallel={parallel}" in decision.note  # never silent
        with pytest.raises(UsageError, match=r"^train.step.loss_kernel=chunked chooses .*set "):
            FusedLossPart().decide(
                context(parallel=parallel, tied_head=True, decisions=liger_loss, loss_kernel="chunked")
            )
    # The note reaches stderr on the main rank through the parts' start-up line, quiet run or not.
    ctx = context(parallel="fsdp", tied_head=True, kernels="liger-loss")
    line = decide_parts(ctx, is_main=True)
    assert "fused_loss off (auto: not under fsdp: the output head is tied" in line
    assert "step parts: fused_loss off under train.parallel=fsdp" in capsys.readouterr().err

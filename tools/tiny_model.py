"""The bundled tiny model: a byte-level BPE tokenizer trained on synthetic Glaive conversations, a small
Qwen2 config (6 layers, hidden 192), and weights pretrained by the project (~6.5 MB in bf16).

Regenerate (the output is committed under `tiny_model/`; the tokenizer is deterministic, the weights
follow a fixed seed and data order but not bit for bit across GPUs):
    python tools/tiny_model.py [--output DIR] [--device cuda] [--pieces] [--stop-after N] [...]
The shipped weights come from `--pieces` with today's defaults on one H100, through
tools/device/tiny_pretrain_device.sh: command, commit, timings, logs and scores in
benchmarks/results/2026-11-23-h100x1-tiny-pretrain-batch64/ (run4). Another seed of the same recipe made a
base that copies far worse: pretraining draws differ more than recipes do, and these weights are the better
of two. A GPU is needed; on a CPU the same run takes hours.

What the base model learns, and what it does not: it is pretrained, with the loss on the replies only, on
synthetic conversations in Glaive's own text format (`USER:` / `ASSISTANT: <functioncall> {...}`) and on
tool-free chats in the Qwen chat template. So it knows the functions and how arguments follow from a
request, but has never seen the Qwen tool format (`<tools>`, `<tool_call>`): before LoRA fine-tuning it
makes no parsable call, as Qwen2-7B-Instruct's own template knows no tools (docs/qwen2-7b.md). Teaching that
format is the fine-tune's job, and evaluation measures it.

Neither the tokenizer nor the pretraining sees a held-out argument value (catalogue.py): the tokenizer and
a quarter of the pretraining records use the "train" part of every pool, the rest made-up values
("synthetic", never a held-out one) that can only be copied from the request. With `--pieces`, half of
the made-up text values are built from the vocabulary's word pieces: a held-out word is written with
pieces no train value leaves whole ("broccoli" -> bro|cc|ol|i), whose embeddings the model otherwise
barely trains, and then it cannot copy them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import time
from pathlib import Path
from typing import Any

from gpuval.finetune.data.catalogue import MadeUp, Values
from gpuval.finetune.data.glaive import convert_record
from gpuval.finetune.data.synth import rename_names, synth_record, synth_records, word_pieces
from gpuval.finetune.model import TINY_MODEL_DIR
from gpuval.finetune.template import (
    END_OF_TEXT,
    IM_END,
    IM_START,
    QWEN25_TOOL_TEMPLATE,
    TOOL_TAGS,
    assistant_spans,
    label_spans,
    qwen_tools,
)

VOCAB_SIZE = 3000
CORPUS_RECORDS = 3000
CORPUS_SEED = 20261122
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)  # skipped by decode(skip_special_tokens=True)
# Qwen2's pre-tokenizer split (tokenizer.json of Qwen/Qwen2-7B-Instruct) with two changes, so that a
# 3,000-token vocabulary behaves for copying and for a new output format as Qwen2's 151k one does:
# - a word never takes the character before it (Qwen2: `[^\r\n\p{L}\p{N}]?\p{L}+`, so " Hanoi" and
#   "Hanoi" are different tokens). Here a value tokenizes the same in the request ("to Hanoi") and in the
#   call's JSON ("city": "Hanoi"): copying it is an identity a tiny model can learn for unseen values;
# - punctuation is one character per token (an optional space before it), never a run: Qwen2 learned runs
#   like `"}}\n` in pretraining, but the tiny base never sees the Qwen tool format, so a run that occurs
#   only there (the end of every call) would be a token whose embedding it never trained.
# Digits one by one, as Qwen2: numbers never seen in training tokenize the way seen ones do.
TINY_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]|\s*[\r\n]+|\s+(?!\S)|\s+"
TINY_CONFIG = {  # Qwen2 shape, scaled down: 6 layers, 6 heads of 32 and 3 KV heads (GQA, as Qwen2-7B's 28/4)
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 192,
    "intermediate_size": 576,
    "num_hidden_layers": 6,
    "num_attention_heads": 6,
    "num_key_value_heads": 3,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
    "attention_dropout": 0.0,
    "use_cache": True,
}


def _tool_template() -> Any:
    """Qwen2.5's tool template in a jinja environment set up as transformers sets up chat templates
    (trim/lstrip blocks, a tojson that keeps non-ASCII characters); no tokenizer needed."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    return environment.from_string(QWEN25_TOOL_TEMPLATE)


def corpus_texts(n: int = CORPUS_RECORDS, seed: int = CORPUS_SEED) -> list[str]:
    """Synthetic conversations rendered in the tool format, the text the tokenizer will meet in training."""
    template = _tool_template()
    texts = []
    for record in synth_records(n, seed, values="train"):
        example = convert_record(record)
        tools = qwen_tools(example["tools"]) or None
        texts.append(template.render(messages=example["messages"], tools=tools, add_generation_prompt=False))
    return texts


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE) -> Any:
    """A byte-level BPE (`tokenizers.Tokenizer`) with the template's markers as single tokens."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(TINY_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL_TOKENS, *TOOL_TAGS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    )
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in TOOL_TAGS])
    return tokenizer


# About two passes over the records in PRETRAIN_STEPS: a made-up value is met about twice, too rarely to
# be memorised instead of copied. (Far fewer records read many more times gave a base that recalled and
# garbled unseen values: benchmarks/results/archive/2026-11-22-cpu-finetune-tokenizer2.) A longer
# schedule over more records copies better
# (benchmarks/results/archive/2026-11-23-h100x1-tiny-pretrain-longer/). A batch of 64 costs a GPU step
# about what 32 does, so the hidden-192 model takes 4,000 steps of 64 over 260,000 records; 128 with half
# the steps trains a worse copier (benchmarks/results/2026-11-23-h100x1-tiny-pretrain-batch64/).
PRETRAIN_RECORDS = 260000
PRETRAIN_SEED = 20261123  # not the tokenizer's corpus seed, not a fine-tune seed
PRETRAIN_STEPS = 4000
PRETRAIN_SEQ = 1024
PRETRAIN_BATCH = 64
PRETRAIN_LR = 3e-3
PRETRAIN_WARMUP = 50


Part = tuple[Values, int, int, int, float, float]
# values, seed, first and past-last record index, rename share, share of renamed records' functions renamed


def pretrain_plan(
    n: int = PRETRAIN_RECORDS,
    seed: int = PRETRAIN_SEED,
    pieces: tuple[str, ...] = (),
    rename_share: float = 0.0,
    rename_functions: float = 0.5,
) -> list[Part]:
    """The pretraining records as `(values, seed, start, stop, rename_share, rename_functions)` ranges
    of synth_record indices: a quarter with train-part values, three quarters with made-up text values
    (catalogue.py, "synthetic"; half of them built from word `pieces` when given) that can only be copied
    from the request. Of the made-up part, `rename_share` of the records with functions get made-up
    parameter names (synth.rename_names, from the word pieces): names that can only be read from the
    schema, as a fine-tuned model's call to a function it never saw must read them; `rename_functions` of
    those records' functions get a made-up name too (0: parameters only)."""
    made_up: Values = MadeUp(pieces) if pieces else "synthetic"
    if rename_share and not pieces:
        raise ValueError("made-up names are built from word pieces: pass --pieces too")
    return [
        ("train", seed, 0, n - n * 3 // 4, 0.0, 0.0),
        (made_up, seed + 1, 0, n * 3 // 4, rename_share, rename_functions),
    ]


def record_texts(
    values: Values, seed: int, start: int, stop: int, rename_share: float = 0.0, rename_functions: float = 0.5
) -> list[str]:
    """Records `start..stop` in Glaive's raw text format, plus the tool-free ones again in the Qwen chat
    template; `rename_share` of them with made-up names (pretrain_plan)."""
    import random

    template = _tool_template()
    texts = []
    for index in range(start, stop):
        record = synth_record(seed, index, values)
        rng = random.Random(f"gpuval-rename:{seed}:{index}")
        if rename_share and isinstance(values, MadeUp) and rng.random() < rename_share:
            record = rename_names(record, rng, values.pieces, rename_functions)
        texts.append(f"{record['system']}\n\n{record['chat']}")
        example = convert_record(record)
        if not example["tools"]:
            texts.append(
                template.render(messages=example["messages"], tools=None, add_generation_prompt=False)
            )
    return texts


def _chunks(plan: list[Part], size: int) -> list[Part]:
    return [
        (values, seed, at, min(at + size, stop), rename, functions)
        for values, seed, start, stop, rename, functions in plan
        for at in range(start, stop, size)
    ]


GLAIVE_REPLY = re.compile(r"ASSISTANT:(.*?)(?:<\|endoftext\|>|$)", re.S)


def reply_spans(text: str) -> list[tuple[int, int]]:
    """Where the assistant speaks: Qwen-template replies, or Glaive's `ASSISTANT: ... <|endoftext|>` turns
    (end marker included, so the model learns to stop). Pretraining learns from these alone, as
    supervised fine-tuning does, instead of spending the tiny model on system-prompt boilerplate."""
    if IM_START in text:
        return assistant_spans(text)
    return [(m.start(1), m.end(0)) for m in GLAIVE_REPLY.finditer(text)]


def pretrain(
    output: Path = TINY_MODEL_DIR,
    steps: int = PRETRAIN_STEPS,
    device: str = "cpu",
    records: int = PRETRAIN_RECORDS,
    batch_size: int = PRETRAIN_BATCH,
    log: Any = print,
    time_limit_s: float | None = None,
    pieces: bool = False,
    stop_after: int | None = None,
    seed: int = PRETRAIN_SEED,
    lr: float = PRETRAIN_LR,
    rename_share: float = 0.0,
    rename_functions: float = 0.5,
) -> Path:
    """Full-parameter training of the tiny config on the replies of `pretrain_texts` (made-up values from
    word pieces too when `pieces`), saved as bf16 safetensors. `seed` draws the records, the initial
    weights and the data order, so that draws of one recipe can be compared. On a GPU: bf16 autocast, each
    decoder layer compiled and a fused AdamW, since a step of this small model costs its kernel launches,
    not its math."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from gpuval.finetune.data.batches import data_order, flatten_for_varlen, to_device
    from gpuval.finetune.data.packing import collate, pack
    from gpuval.finetune.optim import lr_factor
    from gpuval.finetune.parallel.modes import decoder_layers
    from gpuval.finetune.step.attention import use_varlen_attention

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(str(output))
    made_up_pieces = word_pieces(tokenizer) if pieces else ()
    plan = pretrain_plan(records, seed, made_up_pieces, rename_share, rename_functions)
    with multiprocessing.get_context("fork").Pool(
        min(16, os.cpu_count() or 1), _init_encoder, (str(output),)
    ) as workers:  # records are made, rendered and tokenized in the workers, in order
        docs = [doc for chunk in workers.map(_encode_records, _chunks(plan, 500)) for doc in chunk]
    packs = pack(docs, PRETRAIN_SEQ)
    made_s = time.monotonic() - started
    torch.manual_seed(seed)
    # float32 parameters, whatever dtype the folder's config names: a saved model's config says bfloat16, and
    # transformers builds that dtype, so a run repeated in the same folder would otherwise train (and step
    # AdamW on) bf16 weights, and on a CPU run its matmuls at a fraction of float32's speed.
    config = AutoConfig.from_pretrained(str(output))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device)
    log(
        f"pretrain: {len(docs)} documents in {len(packs)} packs of {PRETRAIN_SEQ} tokens on {device} "
        f"({made_s:.0f} s to make and tokenize); {steps} steps of {batch_size} packs, peak lr {lr:g}, "
        f"seed {seed}, {str(next(model.parameters()).dtype).removeprefix('torch.')} weights"
    )
    model.train()
    on_gpu = device.startswith("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, fused=on_gpu)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, PRETRAIN_WARMUP, steps)
    )
    # Attention per document, as fine-tuning does (attention.py): flash-attention varlen on a GPU, SDPA per
    # document on a CPU (faster there than one dense (seq, seq) mask); no mask exists at all.
    use_varlen_attention(model, "varlen")
    if on_gpu:
        for layer in decoder_layers(model):
            layer.compile()
    order = data_order(len(packs), seed, 0, steps * batch_size)
    for step in range(steps):
        batch = collate(
            [packs[i] for i in order[step * batch_size : (step + 1) * batch_size]],
            tokenizer.pad_token_id,
            PRETRAIN_SEQ,
            with_mask=False,
        )
        # one bound for the longest document, so the compiled layers never recompile for it
        flat = flatten_for_varlen(batch, max_length=PRETRAIN_SEQ if on_gpu else None)
        inputs = {key: to_device(value, device) for key, value in flat.items()}
        labels = inputs.pop("labels")
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=on_gpu):
            logits = model(**inputs, use_cache=False).logits  # a KV cache in training only recompiles
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.monotonic() - started
        if step % 100 == 0 or step == steps - 1:
            log(f"pretrain step {step + 1}/{steps} loss {loss.item():.4f} at {elapsed:.0f} s")
        # Stopping early keeps what is done (a device call's time limit, or a run that stopped so repeated)
        if time_limit_s is not None and elapsed > time_limit_s:
            log(f"pretrain stopped at step {step + 1}/{steps}: over the {time_limit_s:.0f} s time limit")
            break
        if stop_after is not None and step + 1 == stop_after:
            log(f"pretrain stopped at step {step + 1}/{steps} (--stop-after)")
            break
    model.to("cpu", torch.bfloat16).save_pretrained(str(output), safe_serialization=True)
    return output


_ENCODER: Any = None  # the tokenizer of a pretraining data worker (_init_encoder)


def _init_encoder(folder: str) -> None:
    global _ENCODER
    from transformers import AutoTokenizer

    _ENCODER = AutoTokenizer.from_pretrained(folder)


def _encode(text: str) -> dict[str, list[int]]:
    ids, labels = label_spans(_ENCODER, text, reply_spans(text))
    return {"input_ids": ids, "labels": labels}


def _encode_records(part: Part) -> list[dict[str, list[int]]]:
    return [_encode(text) for text in record_texts(*part)]


def write_tiny_model(output: Path = TINY_MODEL_DIR, hidden_size: int = TINY_CONFIG["hidden_size"]) -> Path:
    """Train the tokenizer and write it, its chat template and the model config to `output`."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(corpus_texts()),
        eos_token=IM_END,  # a reply ends with <|im_end|>, so generation stops there (as Qwen2.5-Instruct)
        pad_token=END_OF_TEXT,
        model_max_length=TINY_CONFIG["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = QWEN25_TOOL_TEMPLATE
    output.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(output))
    config = {
        **TINY_CONFIG,
        # Another width keeps the shape: heads of 32, an MLP three times as wide.
        "hidden_size": hidden_size,
        "intermediate_size": 3 * hidden_size,
        "num_attention_heads": hidden_size // 32,
        "num_key_value_heads": hidden_size // 64,
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.convert_tokens_to_ids(END_OF_TEXT),
        "eos_token_id": tokenizer.convert_tokens_to_ids(IM_END),
        "pad_token_id": tokenizer.convert_tokens_to_ids(END_OF_TEXT),
    }
    (output / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=TINY_MODEL_DIR)
    parser.add_argument("--pretrain-steps", type=int, default=PRETRAIN_STEPS)
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu")
    parser.add_argument("--records", type=int, default=PRETRAIN_RECORDS)
    parser.add_argument("--batch-size", type=int, default=PRETRAIN_BATCH)
    parser.add_argument("--time-limit", type=float, default=None, help="seconds; stop and save after them")
    parser.add_argument(
        "--stop-after", type=int, default=None, help="steps of the schedule to train, then save"
    )
    parser.add_argument(
        "--hidden-size", type=int, default=TINY_CONFIG["hidden_size"], help="a multiple of 64"
    )
    parser.add_argument(
        "--pieces", action="store_true", help="half the made-up values from the vocabulary's word pieces"
    )
    parser.add_argument(
        "--seed", type=int, default=PRETRAIN_SEED, help="records, initial weights and data order"
    )
    parser.add_argument("--lr", type=float, default=PRETRAIN_LR, help="AdamW's peak learning rate")
    parser.add_argument(
        "--rename-share",
        type=float,
        default=0.0,
        help="of the made-up-value records with functions, the share with made-up names (needs --pieces)",
    )
    parser.add_argument(
        "--rename-functions",
        type=float,
        default=0.5,
        help="of the renamed records' functions, the share renamed too (0: parameter names only)",
    )
    args = parser.parse_args()
    write_tiny_model(args.output, args.hidden_size)
    print(
        pretrain(
            args.output,
            args.pretrain_steps,
            args.device,
            args.records,
            args.batch_size,
            time_limit_s=args.time_limit,
            pieces=args.pieces,
            stop_after=args.stop_after,
            seed=args.seed,
            lr=args.lr,
            rename_share=args.rename_share,
            rename_functions=args.rename_functions,
        )
    )


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()

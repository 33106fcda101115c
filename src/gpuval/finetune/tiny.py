"""The bundled tiny model's files: a byte-level BPE tokenizer trained on synthetic Glaive conversations,
and a small Qwen2 config. Weights are not shipped: `model.load_model` builds them from the config.

Regenerate (deterministic; the output is committed under `tiny_model/`):
    python -m gpuval.finetune.tiny [--output DIR]

The tokenizer sees only the "train" part of every argument-value pool (catalogue.py), so values held out
for evaluation are not merged into single tokens it learned from them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gpuval.finetune.glaive import convert_record
from gpuval.finetune.synth import synth_records
from gpuval.finetune.template import (
    END_OF_TEXT,
    IM_END,
    IM_START,
    QWEN25_TOOL_TEMPLATE,
    TOOL_TAGS,
    qwen_tools,
)

TINY_MODEL_DIR = Path(__file__).parent / "tiny_model"
VOCAB_SIZE = 3000
CORPUS_RECORDS = 3000
CORPUS_SEED = 20261122
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)  # skipped by decode(skip_special_tokens=True)
# Qwen2's pre-tokenizer split (tokenizer.json of Qwen/Qwen2-7B-Instruct): digits one by one, so numbers
# never seen in training still tokenize the way seen ones do.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
TINY_CONFIG = {  # Qwen2 shape, scaled down: 4 heads of 32 and 2 KV heads, as GQA in Qwen2-7B (28/4)
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
    "attention_dropout": 0.0,
    "use_cache": True,
}


def corpus_texts(n: int = CORPUS_RECORDS, seed: int = CORPUS_SEED) -> list[str]:
    """Synthetic conversations rendered in the tool format, the text the tokenizer will meet in training."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # The same environment settings transformers uses for chat templates (trim/lstrip blocks, a tojson
    # that keeps non-ASCII characters).
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    template = environment.from_string(QWEN25_TOOL_TEMPLATE)
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
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
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


def write_tiny_model(output: Path = TINY_MODEL_DIR) -> Path:
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
    print(write_tiny_model(parser.parse_args().output))


if __name__ == "__main__":
    main()

"""model.py and the bundled tiny model: build, LoRA forward/backward, bad model paths and targets."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
from tiny_model import corpus_texts, train_tokenizer  # noqa: E402  (tools/, on pytest's pythonpath)

from gpuval.errors import UsageError  # noqa: E402
from gpuval.finetune.model import (  # noqa: E402
    TINY_MODEL_DIR,  # noqa: E402
    apply_lora,
    linear_module_names,
    load_model,
    load_tokenizer,
)
from gpuval.finetune.template import IGNORE_INDEX, encode  # noqa: E402

EXAMPLE = {
    "tools": [{"name": "check_prime", "parameters": {"type": "object", "properties": {"number": {}}}}],
    "messages": [
        {"role": "user", "content": "Is 7480 prime?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"name": "check_prime", "arguments": {"number": 7480}}],
        },
        {"role": "tool", "content": '{"result": "not prime"}'},
        {"role": "assistant", "content": "7480 is not prime."},
    ],
}


def test_bundled_files_are_a_few_megabytes_with_bf16_weights():
    names = sorted(path.name for path in TINY_MODEL_DIR.iterdir())
    assert names == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    # "a few MB at most" (issue 4): 6.7 MB since the base is 192 wide (3.2 M bf16 parameters), which took
    # held-out accuracy 0.895 -> 0.925 (benchmarks/results/2026-11-24-cpu-finetune-wider/)
    assert sum(path.stat().st_size for path in TINY_MODEL_DIR.iterdir()) < 7_000_000
    from safetensors import safe_open

    with safe_open(str(TINY_MODEL_DIR / "model.safetensors"), "pt") as weights:
        assert {weights.get_tensor(name).dtype for name in weights.keys()} == {torch.bfloat16}


def test_tiny_model_builds_the_same_weights_every_time_with_the_tokenizer_vocab():
    first, second = load_model("tiny", torch.float32), load_model(TINY_MODEL_DIR, torch.float32)
    assert type(first).__name__ == "Qwen2ForCausalLM"
    assert first.config.vocab_size == len(load_tokenizer("tiny"))
    assert all(
        torch.equal(a, b)
        for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True)
    )
    assert load_model("tiny", torch.bfloat16).dtype == torch.bfloat16


def test_lora_forward_backward_has_finite_loss_and_grads_only_on_adapters():
    tokenizer = load_tokenizer("tiny")
    encoded = encode(EXAMPLE, tokenizer, max_len=512)
    model = apply_lora(
        load_model("tiny", torch.float32), rank=8, alpha=16, dropout=0.0, target_modules=["q_proj", "v_proj"]
    )
    output = model(
        input_ids=torch.tensor([encoded.input_ids]),
        labels=torch.tensor([encoded.labels]),
    )
    assert torch.isfinite(output.loss) and encoded.label_count > 0
    output.loss.backward()
    with_grad = {name for name, parameter in model.named_parameters() if parameter.grad is not None}
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert with_grad == trainable and with_grad
    assert all("lora_" in name for name in with_grad)
    assert any("q_proj.lora_A" in name for name in with_grad) and any(
        "v_proj.lora_B" in name for name in with_grad
    )
    assert IGNORE_INDEX in encoded.labels


def test_lora_on_a_module_the_model_lacks_names_it_and_lists_the_linear_ones():
    model = load_model("tiny", torch.float32)
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} <= set(
        linear_module_names(model)
    )
    with pytest.raises(UsageError) as raised:
        apply_lora(model, rank=4, alpha=8, dropout=0.0, target_modules=["q_proj", "query_key_value"])
    message = str(raised.value)
    assert "'query_key_value'" in message and "q_proj" in message and "\n" not in message


@pytest.mark.parametrize("path", ["/nonexistent/qwen2-7b", "./no-such-model", "models/org/name"])
def test_a_model_path_that_does_not_exist_is_a_one_line_usage_error(path):
    for load in (load_model, load_tokenizer):
        with pytest.raises(UsageError, match="does not exist") as raised:
            load(path)
        assert "\n" not in str(raised.value)


@pytest.mark.slow  # 3-10 s on 2 cores (2026-11-27 profile of the inner loop)
def test_shipped_tokenizer_is_what_tiny_py_trains():
    shipped = json.loads((TINY_MODEL_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    trained = json.loads(train_tokenizer(corpus_texts()).to_str())
    assert trained["model"]["vocab"] == shipped["model"]["vocab"]
    assert trained["model"]["merges"] == shipped["model"]["merges"]


def test_gpuval_outside_finetune_does_not_import_transformers():
    heavy = ("transformers", "peft", "tokenizers")
    code = f"import sys, gpuval.cli; sys.exit(any(m in sys.modules for m in {heavy!r}))"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.slow
def test_pretraining_runs_on_a_cpu_and_learns_from_its_first_steps(tmp_path):
    """tiny.pretrain's whole path (made-up values from word pieces, records made and tokenized in worker
    processes, attention per document, saved weights) at a toy size: the loss falls and the saved model
    loads with the shipped tokenizer."""
    from tiny_model import pretrain, record_texts, write_tiny_model
    from transformers import AutoModelForCausalLM

    write_tiny_model(tmp_path)
    lines: list[str] = []
    pretrain(tmp_path, steps=6, records=300, batch_size=2, pieces=True, log=lines.append)
    assert lines[0].startswith("pretrain: ") and " documents in " in lines[0]
    assert sum(1 for text in record_texts("train", 5, 0, 20) if "USER:" in text) == 20
    losses = [float(line.split(" loss ")[1].split()[0]) for line in lines if " loss " in line]
    assert len(losses) == 2 and losses[1] < losses[0] - 0.2, losses
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert model.config.vocab_size == len(load_tokenizer(str(tmp_path)))
    # --stop-after: the first steps of a longer schedule, saved (how a run cut at a time limit is repeated)
    lines.clear()
    # the saved config now says bfloat16; a repeat in the same folder still trains float32 weights
    assert json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))["dtype"] == "bfloat16"
    pretrain(tmp_path, steps=6, records=300, batch_size=2, log=lines.append, stop_after=2)
    assert lines[0].endswith(", float32 weights"), lines[0]
    assert [line for line in lines if " loss " in line][-1].startswith("pretrain step 1/6")
    assert lines[-1] == "pretrain stopped at step 2/6 (--stop-after)"
    # --seed: another draw of the same recipe (records, initial weights, data order), so another first loss
    first = [line for line in lines if " loss " in line][0]
    lines.clear()
    pretrain(tmp_path, steps=6, records=300, batch_size=2, log=lines.append, stop_after=2, seed=7)
    assert [line for line in lines if " loss " in line][0] != first

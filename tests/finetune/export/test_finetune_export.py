"""Servable output: the adapter folder training writes, and `gpuval finetune export [--merge]`.

A tiny run is trained with a tokenizer whose own chat template is Qwen2-7B-Instruct's plain ChatML, which
drops `tools`: training renders with Qwen2.5's tool template instead, and every folder a server reads must
carry that template, or the served model never sees its tools.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
from conftest import assert_close_to_scale, is_launcher_variable  # noqa: E402
from safetensors import safe_open  # noqa: E402

from gpuval.finetune.checkpoint import FINAL_ADAPTER, checkpoint_dirs, save_tokenizer  # noqa: E402
from gpuval.finetune.config import finetune_config_from_dict  # noqa: E402
from gpuval.finetune.data.prepare import SourceRecord, convert_all  # noqa: E402
from gpuval.finetune.data.synth import synth_records  # noqa: E402
from gpuval.finetune.export.folder import export  # noqa: E402
from gpuval.finetune.model import TINY_MODEL_DIR, load_tokenizer  # noqa: E402
from gpuval.finetune.template import QWEN25_TOOL_TEMPLATE, qwen_tools, render, render_prompt  # noqa: E402

# Qwen2-7B-Instruct's chat template (tokenizer_config.json of Qwen/Qwen2-7B-Instruct): no `tools` at all.
QWEN2_PLAIN_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
STEPS = 3


def conversations(n: int, seed: int) -> list[dict]:
    records = [SourceRecord(f"record {i}", r) for i, r in enumerate(synth_records(n, seed=seed))]
    return convert_all(records)[0]


@pytest.fixture(scope="module")
def plain_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny tokenizer with Qwen2-7B-Instruct's template, as a folder a config's `tokenizer:` names."""
    folder = tmp_path_factory.mktemp("plain-tokenizer")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY_MODEL_DIR / name, folder / name)
    (folder / "chat_template.jinja").write_text(QWEN2_PLAIN_TEMPLATE, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def example() -> dict:
    """A conversation with tools and a tool call, as training reads it."""
    return next(c for c in conversations(8, seed=4) if c["tools"] and len(c["messages"]) > 2)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, plain_tokenizer: Path) -> Path:
    """A run folder of STEPS training steps (gpuval's own save path), a checkpoint at the last step."""
    from gpuval.finetune.trainer import train
    from gpuval.runtime import init_runtime

    data = tmp_path_factory.mktemp("data") / "train.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in conversations(8, seed=3)), encoding="utf-8")
    output = tmp_path_factory.mktemp("run")
    cfg = finetune_config_from_dict(
        {
            "model": "tiny",
            "tokenizer": str(plain_tokenizer),
            "dtype": "float32",
            "lora": {
                "rank": 8,
                "alpha": 16,
                "target_modules": "all-linear",
                "trainable_tokens": ["<tool_call>", "</tool_call>"],
            },
            "data": {"train": str(data), "max_seq_len": 256},
            "train": {
                "micro_batch_size": 1,
                "max_steps": STEPS,
                "optim": {"lr": 3e-3, "warmup_steps": 1},
                "save": {"every_steps": STEPS},
                "log": {"tensorboard": False},
            },
            "output": str(output),
        }
    )
    with pytest.MonkeyPatch.context() as patch:  # one process, whatever launcher runs pytest
        for key in [key for key in os.environ if is_launcher_variable(key)]:
            patch.delenv(key)
        runtime = init_runtime(timeout_s=30, backend="gloo")
        try:
            train(cfg, runtime, quiet=True)
        finally:
            runtime.shutdown()
    return output


@pytest.fixture(scope="module")
def merged(run: Path, gpuval, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("export") / "merged"
    result = gpuval(
        ["finetune", "export", "--merge", "--dtype", "float32", str(run), str(folder)], folder.parent
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wrote merged model (float32)" in result.stdout
    return folder


def token_batch(tokenizer, example: dict) -> torch.Tensor:
    return tokenizer(render_prompt(example, tokenizer), return_tensors="pt")["input_ids"]


def adapter_model(adapter: Path, dtype: torch.dtype = torch.float32):
    from peft import AutoPeftModelForCausalLM

    return AutoPeftModelForCausalLM.from_pretrained(str(adapter), dtype=dtype).eval()


@pytest.mark.slow
def test_the_adapter_folder_loads_with_plain_transformers_and_peft(run, example):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = run / FINAL_ADAPTER
    tokenizer = AutoTokenizer.from_pretrained(str(adapter))
    assert (adapter / "chat_template.jinja").read_text(encoding="utf-8") == QWEN25_TOOL_TEMPLATE
    ids = token_batch(tokenizer, example)
    with torch.no_grad():
        tuned = adapter_model(adapter)(ids).logits
        base = (
            AutoModelForCausalLM.from_pretrained(str(TINY_MODEL_DIR), dtype=torch.float32).eval()(ids).logits
        )
    assert (tuned - base).abs().max() > 1e-2  # the adapter trained: it changes what the model says
    # Each checkpoint's adapter is as servable, and no save left a temp folder behind.
    (checkpoint,) = checkpoint_dirs(run)
    assert (checkpoint / FINAL_ADAPTER / "chat_template.jinja").read_text(
        encoding="utf-8"
    ) == QWEN25_TOOL_TEMPLATE
    assert not [p for p in run.rglob(".tmp-*")]


@pytest.mark.slow
def test_the_merged_export_loads_with_plain_transformers_and_matches_the_adapter(run, merged, example):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert {"model.safetensors", "config.json", "chat_template.jinja", "tokenizer.json"} <= {
        p.name for p in merged.iterdir()
    }
    assert not (merged / "adapter_config.json").exists()  # a plain model: no PEFT needed to load it
    assert AutoModelForCausalLM.from_pretrained(str(merged)).dtype == torch.float32  # as exported
    ids = token_batch(AutoTokenizer.from_pretrained(str(merged)), example)
    # Both sides compute in float64, so the only difference left is the merge itself: W + s*B@A rounded
    # to float32 once when it was written. Computed in float32, each side also rounds every product in its
    # own order (the merged model's x@(W+sBA) against the adapter's x@W + s*(x@A)@B), and which order the
    # CPU's kernels take differs between machines (AVX2 against AVX-512): that noise, up to ~2e-4 on a
    # few of the ~1.2M logits, belongs to float32 arithmetic, not to the export. (Seen: 2.2e-4 and 2.9e-4
    # at most in float32 on two machines; 3.9e-5 in float64, for logits up to 31: 1.3e-6 of the largest,
    # the weights' one float32 rounding of 2^-24 each; rel 1e-5 leaves 8 times that.)
    model = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float64).eval()
    with torch.no_grad():
        expected = adapter_model(run / FINAL_ADAPTER, torch.float64)(ids).logits
        assert expected.dtype == torch.float64
        assert_close_to_scale(model(ids).logits, expected, rel=1e-5)


@pytest.mark.slow
def test_a_default_merge_is_bfloat16_and_stays_close_to_the_adapter(run, example, tmp_path):
    from transformers import AutoModelForCausalLM

    export(run, tmp_path / "merged-bf16", merge=True)
    with safe_open(str(tmp_path / "merged-bf16" / "model.safetensors"), framework="pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"BF16"}  # noqa: SIM118
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged-bf16"), dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(str(TINY_MODEL_DIR), dtype=torch.float32).eval()
    ids = token_batch(load_tokenizer(TINY_MODEL_DIR), example)
    with torch.no_grad():
        got, expected = model(ids).logits, adapter_model(run / FINAL_ADAPTER)(ids).logits
        adapter_effect = (expected - base(ids).logits).norm()
    # bf16 keeps 8 bits of mantissa (relative rounding 2**-9): the merged weights' rounding moves the logits
    # by ~0.2 % (measured), far less than the adapter moves them (~8 %); the greedy choice hardly ever.
    rounding = (got - expected).norm()
    assert rounding < 1e-2 * expected.norm() and rounding < adapter_effect / 10
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() > 0.95


@pytest.mark.slow
def test_every_servable_folder_renders_tools_exactly_as_training_did(
    run, merged, example, plain_tokenizer, tmp_path
):
    from transformers import AutoTokenizer

    trained_with = load_tokenizer(plain_tokenizer)
    expected, expected_prompt = render(example, trained_with), render_prompt(example, trained_with)
    tools = qwen_tools(example["tools"])
    own = trained_with.apply_chat_template(example["messages"], tools=tools, tokenize=False)
    assert "<tools>" not in own and "<tools>" in expected  # the base tokenizer alone would lose the tools
    export(run, tmp_path / "adapter-copy")
    for folder in (run / FINAL_ADAPTER, merged, tmp_path / "adapter-copy"):
        served = AutoTokenizer.from_pretrained(str(folder))
        text = served.apply_chat_template(example["messages"], tools=tools, tokenize=False)
        prompt = served.apply_chat_template(
            example["messages"], tools=tools, tokenize=False, add_generation_prompt=True
        )
        assert (text, prompt) == (expected, expected_prompt), folder
        assert served(text)["input_ids"] == trained_with(text)["input_ids"], folder


def test_save_tokenizer_writes_the_training_template_and_leaves_the_tokenizer_alone(tmp_path, example):
    from transformers import AutoTokenizer

    tokenizer = load_tokenizer("tiny")  # its own template renders tools: kept as it is
    save_tokenizer(tokenizer, tmp_path / "own")
    assert (tmp_path / "own" / "chat_template.jinja").read_text(encoding="utf-8") == tokenizer.chat_template
    tokenizer.chat_template = QWEN2_PLAIN_TEMPLATE  # one that drops tools: replaced in the saved copy only
    save_tokenizer(tokenizer, tmp_path / "plain")
    assert tokenizer.chat_template == QWEN2_PLAIN_TEMPLATE
    saved = AutoTokenizer.from_pretrained(str(tmp_path / "plain"))
    messages, tools = example["messages"], qwen_tools(example["tools"])
    assert saved.apply_chat_template(messages, tools=tools, tokenize=False) == render(example, tokenizer)


def fake_adapter(folder: Path, base: str) -> Path:
    """A rank-1 LoRA adapter folder on one module, as PEFT writes one, for the refusals that come before
    loading (it passes gpuval.finetune.export.adapter)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    config = {"peft_type": "LORA", "r": 1, "lora_alpha": 2, "target_modules": ["q_proj"]}
    (folder / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": base}), encoding="utf-8"
    )
    module = "base_model.model.model.layers.0.self_attn.q_proj"
    weights = {f"{module}.lora_A.weight": torch.zeros(1, 192), f"{module}.lora_B.weight": torch.zeros(192, 1)}
    save_file(weights, str(folder / "adapter_model.safetensors"))
    return folder


@pytest.mark.slow
def test_bad_export_input_is_one_line_exit_2_and_writes_nothing(tmp_path, gpuval, assert_usage_error):
    adapter = fake_adapter(tmp_path / "adapter", str(TINY_MODEL_DIR))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine", encoding="utf-8")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "adapter_config.json").write_text("{}", encoding="utf-8")
    (tmp_path / "broken" / "adapter_model.safetensors").write_text("not safetensors", encoding="utf-8")
    fake_adapter(tmp_path / "moved", str(tmp_path / "gone" / "base"))
    cases = [
        (["missing", "out"], "'missing' does not exist"),
        ([str(tmp_path / "full"), "out"], "is not a PEFT adapter folder"),
        (["--merge", str(adapter), "full"], "'full' already exists and is not an empty folder"),
        ([str(adapter), str(adapter / "inside")], "lies inside the adapter folder"),
        (["--merge", "broken", "out"], "adapter weights 'broken/adapter_model.safetensors' cannot be read"),
        (["--merge", "moved", "out"], "pass --base"),
    ]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for args, fragment in cases:
        assert_usage_error(gpuval(["finetune", "export", *args], tmp_path), "export:", fragment)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "full" / "keep.txt").read_text(encoding="utf-8") == "mine"


@pytest.mark.slow  # the module's training run, then two gpuval processes
def test_an_export_that_copies_and_one_refused_never_import_torch(run, tmp_path):
    """Copying the adapter folder and refusing bad input read files and headers alone: neither imports
    torch (2-3 s of a small machine's CPU); only --merge loads a model."""
    from conftest import cli_imports_torch

    code, stderr, imported = cli_imports_torch(["finetune", "export", run, tmp_path / "served"], tmp_path)
    assert (code, imported) == (0, False), stderr
    assert (tmp_path / "served" / "adapter_model.safetensors").is_file()
    code, stderr, imported = cli_imports_torch(["finetune", "export", run, tmp_path / "served"], tmp_path)
    assert "already exists and is not an empty folder" in stderr
    assert (code, imported) == (2, False), stderr


@pytest.mark.slow
def test_a_merge_onto_another_base_is_one_line_and_leaves_no_folder(run, tmp_path, gpuval):
    # A base of another width: refused before a model loads (export.adapter.check_fits), with no loading bar
    # or warning of the libraries before the line.
    other = tmp_path / "other-base"
    other.mkdir()
    config = json.loads((TINY_MODEL_DIR / "config.json").read_text(encoding="utf-8"))
    (other / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}), encoding="utf-8")
    result = gpuval(["finetune", "export", "--merge", str(run), "out", "--base", str(other)], tmp_path)
    assert result.returncode == 2 and not result.stdout, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("gpuval: export: adapter '") and "does not fit base model" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-base"]  # no DIR, no temp folder

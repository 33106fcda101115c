"""Issue 35, "same training, proven": gpuval's fine-tune step against plain transformers + PEFT on a CPU.

The bundled tiny model trains for 20 optimizer steps (float32, one process, LoRA dropout 0 so no random
stream is drawn in the step) twice: with `gpuval.finetune.trainer.train`, and with a reference written
here with transformers, PEFT and torch alone — `AutoModelForCausalLM.from_pretrained`, `get_peft_model`,
torch's AdamW, `get_cosine_schedule_with_warmup`, `clip_grad_norm_` and `F.cross_entropy`, the loss
Σ per-token cross-entropy over the step's labelled tokens / their count (trainer.py's normalisation). The
reference takes gpuval's packs and data order as its input (data is not the step) but runs every packed
document as a sequence of its own, so its per-document attention owes nothing to gpuval's. Every step's
loss must agree within 1e-4 relative, for each step switch that runs on a CPU, on and off.

Step switches that cannot run on a CPU, or change nothing there (one line each):
- compile: inductor builds C++ kernels for every layer on a CPU, minutes on two cores (finetune_speed.py
  compares the compiled step with the seeds' on a GPU).
- precision fp8-base (and fp8_*): needs a Hopper GPU; train() refuses it on a CPU (fp8.resolve_precision).
- kernels liger, loss_kernel liger: Liger-Kernel runs on CUDA GPUs only (kernels.resolve_kernels refuses).
- dropout_kernel packed: with dropout 0 (equal random streams) there is no dropout to replace, and with
  dropout its mask stream differs from nn.Dropout's by design (packed_dropout.py).
- row_kernel: applies only to rows that are one whole document each (bench train's fixed data); these
  packs hold several documents and padding, so every kernel runs the same varlen path.
- varlen_kernel fa4 / flash: both run SDPA once per document on a CPU (kernels.varlen_attention).
- parallel fsdp / deepspeed, several ranks: not step arithmetic; tests/finetune/test_finetune_train.py
  compares DDP and FSDP on two ranks with one process.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gpuval.finetune.config import finetune_config_from_dict  # noqa: E402
from gpuval.finetune.data.batches import data_order  # noqa: E402
from gpuval.finetune.data.packing import Pack, pack_with_stats  # noqa: E402
from gpuval.finetune.data.prepare import SourceRecord, convert_all, read_jsonl  # noqa: E402
from gpuval.finetune.data.synth import synth_records  # noqa: E402
from gpuval.finetune.model import TINY_MODEL_DIR, load_tokenizer  # noqa: E402
from gpuval.finetune.template import IGNORE_INDEX, encode  # noqa: E402
from gpuval.finetune.trainer import train  # noqa: E402
from gpuval.runtime import init_runtime  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 20
SEQ_LEN = 192  # tokens per pack
PACKS = 6  # train() and the reference on the first PACKS packs (train's max_packs): epochs of 3 steps
RELATIVE = 1e-4  # issue 35: per-step losses equal within 1e-4 relative
TOOL_TAGS = ["<tool_call>", "</tool_call>"]
LORA = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": "all-linear"}
TRAIN = {  # the baseline: every CPU switch at what `auto` resolves to, one pack a step
    "micro_batch_size": 1,
    "grad_accum_steps": 1,
    "lr": 3e-3,
    "warmup_steps": 3,
    "max_steps": STEPS,
    "weight_decay": 0.01,
    "grad_clip": 1.0,
    "seed": 11,
    "attention": "varlen",
    "kernels": "torch",
    "last_mlp_rows": "labelled",
    "fuse_qkv": False,
    "split_products": False,
    "activation_checkpointing": False,
    "tensorboard": False,
}
LORA_SWITCHES = ("target_modules", "trainable_tokens")  # switches under `lora`, the others under `train`
# the train section each flat name lives in (finetune/config.py); a name not here is train's own field
SECTIONS = {
    **dict.fromkeys(("lr", "warmup_steps", "weight_decay", "grad_clip"), "optim"),
    **dict.fromkeys(
        ("attention", "kernels", "last_mlp_rows", "fuse_qkv", "split_products", "activation_checkpointing"),
        "step",
    ),
    "fuse_gate_up": "experimental",
    "tensorboard": "log",
}


def _config(data: Path, output: Path, **switches: Any) -> dict[str, Any]:
    """The one place a fine-tune config is built: the baseline with `switches` (flat names) on top, each
    put in its section of the config (train.optim, train.step, …)."""
    lora = {**LORA, **{k: v for k, v in switches.items() if k in LORA_SWITCHES}}
    train: dict[str, Any] = {}
    for key, value in _flat(switches).items():
        section = SECTIONS.get(key)
        (train.setdefault(section, {}) if section else train)[key] = value
    return {
        "model": "tiny",
        "dtype": "float32",
        "lora": lora,
        "data": {"train": str(data), "max_seq_len": SEQ_LEN},
        "train": train,
        "output": str(output),
    }


def _flat(switches: dict[str, Any]) -> dict[str, Any]:
    """The baseline's train settings with `switches` on top, by flat name."""
    return {**TRAIN, **{k: v for k, v in switches.items() if k not in LORA_SWITCHES}}


# the train settings the reference reads; the step switches (attention, kernels, …) it has no use for
REFERENCE_SETTINGS = ("seed", "lr", "weight_decay", "warmup_steps", "max_steps", "grad_clip")


def _reference_key(lora: dict[str, Any], switches: dict[str, Any]) -> tuple[str, str]:
    """What the reference run depends on, as _reference_losses's cache key: the LoRA, the optimiser's
    settings and the packs a step (one micro-batch of two packs and two micro-batches of one are the same
    step to it). Switch sets equal in these share one reference run."""
    flat = _flat(switches)
    settings = {key: flat[key] for key in REFERENCE_SETTINGS}
    settings["packs_per_step"] = flat["micro_batch_size"] * flat["grad_accum_steps"]
    return json.dumps(lora, sort_keys=True), json.dumps(settings, sort_keys=True)


# id -> switches; each one changes the step's arithmetic and none the training it must give
SWITCHES: dict[str, dict[str, Any]] = {
    "baseline": {},
    "attention-sdpa": {"attention": "sdpa"},  # the dense document mask instead of SDPA per document
    "last-mlp-all-rows": {"last_mlp_rows": "all"},
    "fused-loss": {"kernels": "liger-loss"},  # gpuval's chunked linear + cross-entropy (linear_ce.py)
    "fuse-qkv": {"fuse_qkv": True},
    "split-products": {"split_products": True},  # hidden 192 = 128 + 64 column groups
    "activation-checkpointing": {"activation_checkpointing": True},
    "grad-accumulation-2": {"grad_accum_steps": 2},  # two micro-batches of one pack a step
    "micro-batch-2": {"micro_batch_size": 2},  # the same two packs a step as one micro-batch of two rows
    # the MLP's frozen gate and up as one product: only where LoRA leaves them frozen
    "fuse-gate-up": {"fuse_gate_up": True, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    "trainable-tokens": {"trainable_tokens": TOOL_TAGS},  # embedding rows of the tool tags train too
    "all-on": {  # every one at once, with two rows a micro-batch (labelled rows across rows)
        "kernels": "liger-loss",
        "fuse_qkv": True,
        "split_products": True,
        "activation_checkpointing": True,
        "micro_batch_size": 2,
    },
}


@pytest.fixture(scope="module")
def train_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Synthetic conversations cut to their first exchange (a request, then a tool call or an answer),
    without their tool list (the tiny tokenizer, one character a punctuation token, makes it a 300-token
    system prompt), of at most half a pack: two documents to a pack."""
    records = [SourceRecord(f"record {i}", r) for i, r in enumerate(synth_records(60, seed=3))]
    conversations = [{"tools": [], "messages": c["messages"][:2]} for c in convert_all(records)[0]]
    tokenizer = load_tokenizer("tiny")
    short = [c for c in conversations if len(encode(c, tokenizer, SEQ_LEN).input_ids) <= SEQ_LEN // 2]
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in short), encoding="utf-8")
    return path


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: on the shared 2-core machine two OpenMP threads, each waiting for the other
    while descheduled, made the same steps 5 to 20 times slower. Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def runtime(no_launcher_env):
    rt = init_runtime(timeout_s=30, backend="gloo")
    yield rt
    rt.shutdown()


@pytest.mark.parametrize("name", list(SWITCHES))
def test_gpuval_trains_as_transformers_and_peft_do(name, train_file, runtime, tmp_path):
    cfg = _config(train_file, tmp_path / "run", **SWITCHES[name])
    summary = train(finetune_config_from_dict(cfg), runtime, save_adapter=False, quiet=True, max_packs=PACKS)
    gpuval = [s["loss"] for s in summary["steps"]]
    reference = _reference_losses(*_reference_key(cfg["lora"], SWITCHES[name]), str(train_file))

    assert len(gpuval) == len(reference) == STEPS
    assert sum(reference[-4:]) < 0.9 * sum(reference[:4]), reference  # it trains: equal losses mean something
    worst = max(range(STEPS), key=lambda i: abs(gpuval[i] - reference[i]) / reference[i])
    deviation = abs(gpuval[worst] - reference[worst]) / reference[worst]
    assert deviation <= RELATIVE, (
        f"{name}: step {worst + 1} loss {gpuval[worst]:.7f}, transformers + PEFT {reference[worst]:.7f} "
        f"({deviation:.2e} relative)\ngpuval    {gpuval}\nreference {reference}"
    )
    # The switch ran (a switch silently off would compare the baseline twice).
    switches = SWITCHES[name]
    ran = {
        "attention": summary["attention"],
        "last_mlp_rows": summary["last_mlp_rows"],
        "kernels": summary["kernels"],
        "fuse_qkv": summary["fused_qkv"],
        "split_products": summary["split_products"],
        "fuse_gate_up": summary["fused_gate_up"],
        "activation_checkpointing": summary["activation_checkpointing"],
    }
    assert {k: ran[k] for k in switches if k in ran} == {k: v for k, v in switches.items() if k in ran}
    assert summary["fused_loss"] == (switches.get("kernels") == "liger-loss")
    assert any(s["grad_norm"] > TRAIN["grad_clip"] for s in summary["steps"])  # clipping took part


@functools.cache
def _reference_losses(lora_json: str, settings_json: str, data: str) -> list[float]:
    """Per-step losses of the same training with transformers, PEFT and torch alone (module docstring);
    memoised by _reference_key: the 12 switch sets need 4 distinct reference runs."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, get_cosine_schedule_with_warmup

    lora, settings = json.loads(lora_json), json.loads(settings_json)
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    packs = _packs(data, tokenizer)
    torch.manual_seed(settings["seed"])  # LoRA's A matrices are drawn from the global generator
    model = AutoModelForCausalLM.from_pretrained(TINY_MODEL_DIR, dtype=torch.float32)
    model.config.use_cache = False
    tokens = lora.get("trainable_tokens") or []
    model = get_peft_model(
        model,
        LoraConfig(
            r=lora["rank"],
            lora_alpha=lora["alpha"],
            lora_dropout=lora["dropout"],
            target_modules=lora["target_modules"],
            bias="none",
            task_type="CAUSAL_LM",
            trainable_token_indices=tokenizer.convert_tokens_to_ids(tokens) if tokens else None,
        ),
    )
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings["lr"], weight_decay=settings["weight_decay"])
    schedule = get_cosine_schedule_with_warmup(optimizer, settings["warmup_steps"], settings["max_steps"])
    per_step = settings["packs_per_step"]
    losses = []
    for step in range(settings["max_steps"]):
        documents = [
            document
            for index in data_order(len(packs), settings["seed"], step * per_step, per_step)
            for document in _documents(packs[index])
        ]
        labelled = sum(int((labels[1:] != IGNORE_INDEX).sum()) for _ids, labels in documents)
        step_loss = 0.0
        for input_ids, labels in documents:  # each document alone: attention never crosses documents
            logits = model(input_ids=input_ids[None]).logits[0]
            loss = F.cross_entropy(logits[:-1], labels[1:], ignore_index=IGNORE_INDEX, reduction="sum")
            (loss / labelled).backward()
            step_loss += loss.item()
        torch.nn.utils.clip_grad_norm_(trainable, settings["grad_clip"])
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(step_loss / labelled)
    return losses


def _packs(data: str, tokenizer: Any) -> list[Pack]:
    """gpuval's packs of the training file, the first PACKS of them (train's max_packs): the data."""
    encoded = [encode(example, tokenizer, SEQ_LEN) for _line, example in read_jsonl(data, "training data")]
    packs = pack_with_stats(encoded, SEQ_LEN).packs[:PACKS]
    assert len(packs) == PACKS and all(len(p.seq_lens) >= 2 for p in packs), [p.seq_lens for p in packs]
    return packs


def _documents(pack: Pack) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A pack's documents as (input ids, labels) each; a document's first label is never a target."""
    bounds = pack.cu_seqlens
    return [
        (torch.tensor(pack.input_ids[start:end]), torch.tensor(pack.labels[start:end]))
        for start, end in zip(bounds[:-1], bounds[1:], strict=True)
    ]

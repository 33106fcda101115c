"""`gpuval finetune eval`, `export` and `prepare` on bad input (issue 50): broken adapter folders, eval
splits of another shape, prompts past the model's context, outputs that cannot be written. The promise:
a refusal (UsageError, one `gpuval:` line, exit 2) naming the file and the field, never exit 3 ("internal
error"), never a traceback or a library's chatter on the console, and no folder left behind.

Property tests break one real adapter (trained here once, on the bundled tiny model) or one eval split
in generated ways and call the checks in this process, as the commands do before any model loads; a few
cases run the CLI as a child process, as users run it.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import cli_env, is_launcher_variable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")
pytest.importorskip("peft")

from gpuval.errors import UsageError  # noqa: E402
from gpuval.finetune.config import finetune_config_from_dict  # noqa: E402
from gpuval.finetune.data.prepare import SourceRecord, convert_all  # noqa: E402
from gpuval.finetune.data.synth import synth_records  # noqa: E402
from gpuval.finetune.eval.inputs import PromptFit, read_eval_split  # noqa: E402
from gpuval.finetune.export.adapter import (  # noqa: E402
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    check_adapter,
    check_fits,
)
from gpuval.finetune.export.folder import export  # noqa: E402
from gpuval.finetune.model import load_tokenizer  # noqa: E402

PROPERTY = settings(
    max_examples=100,
    deadline=None,
    database=None,  # no .hypothesis/ folder left behind
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
RANK = 4
CHATTER = re.compile(
    r"Warning|WARNING|warnings\.warn|Loading|Writing|it/s\]"
)  # the libraries' console output
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]  # trainable tokens: the adapter holds their rows too


def conversations(n: int, seed: int) -> list[dict[str, Any]]:
    return convert_all([SourceRecord(f"record {i}", r) for i, r in enumerate(synth_records(n, seed=seed))])[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One training step of a rank-4 LoRA adapter with trainable tokens on the tiny model, its eval split
    and a config that evaluates it."""
    from gpuval.finetune.trainer import train
    from gpuval.runtime import init_runtime

    root = tmp_path_factory.mktemp("trained")
    records = conversations(8, seed=3)
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    (root / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:4]), encoding="utf-8")
    settings = {
        "model": "tiny",
        "dtype": "float32",
        "lora": {"rank": RANK, "alpha": 8, "target_modules": "all-linear", "trainable_tokens": TOOL_TOKENS},
        "data": {"train": str(root / "train.jsonl"), "eval": str(root / "eval.jsonl"), "max_seq_len": 256},
        "train": {
            "micro_batch_size": 1,
            "max_steps": 1,
            "save": {"every_steps": 0},
            "log": {"tensorboard": False},
        },
        "eval": {"max_new_tokens": 64, "batch_size": 4, "base_model": False},
        "output": str(root / "run"),
    }
    with pytest.MonkeyPatch.context() as patch:  # one process, whatever launcher runs pytest
        for key in [key for key in os.environ if is_launcher_variable(key)]:
            patch.delenv(key)
        runtime = init_runtime(timeout_s=30, backend="gloo")
        try:
            train(finetune_config_from_dict(settings), runtime, quiet=True)
        finally:
            runtime.shutdown()
    config = root / "eval.yaml"
    config.write_text(json.dumps({**settings, "output": "run"}), encoding="utf-8")  # JSON is YAML
    return SimpleNamespace(adapter=root / "run" / "adapter", root=root, config=config, records=records)


def copy_of(adapter: Path, parent: Path) -> Path:
    """A fresh copy of the adapter folder (hypothesis runs every case of a test in one tmp_path)."""
    folder = Path(tempfile.mkdtemp(dir=parent)) / "adapter"
    shutil.copytree(adapter, folder)
    return folder


def refusal(folder: Path, base: str | None = None) -> str:
    """The one-line refusal of the adapter in `folder` by the checks `finetune export` makes (and, with
    `base`, those of `export --merge` and `eval`); an accepted adapter fails the test."""
    try:
        checked = check_adapter(folder, "export")
        if base is not None:
            check_fits(checked, base, "export")
    except UsageError as exc:
        message = str(exc)
    else:
        raise AssertionError(f"the broken adapter in {folder} was accepted")
    assert message.startswith("export: ") and "\n" not in message, message
    assert str(folder) in message, f"the refusal names no file of the adapter: {message}"
    return message


# --- adapter_config.json ----------------------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)  # gpuval.inputs refuses these apart
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


NOT_BOOL = JSON.filter(lambda v: not isinstance(v, bool))
# A value each field can never take: the wrong type, or a rank or a token count unlike the weights'.
BAD_FIELDS: dict[str, st.SearchStrategy] = {
    "peft_type": JSON.filter(lambda v: v != "LORA") | st.sampled_from(["lora", "ADALORA", "PROMPT_TUNING"]),
    "r": JSON.filter(lambda v: not (type(v) is int and v == RANK))
    | st.integers(-3, 64).filter(lambda v: v != RANK),
    "lora_alpha": JSON.filter(lambda v: not _is_number(v)),
    "target_modules": JSON.filter(lambda v: v is not None and not isinstance(v, str | list))
    | st.just([])
    | st.lists(st.integers() | st.none(), min_size=1, max_size=3),
    "rank_pattern": JSON.filter(lambda v: v is not None and not isinstance(v, dict))
    | st.dictionaries(
        st.sampled_from(["q_proj", "down_proj", ".*_proj", "layers.0.mlp.up_proj"]),
        st.integers(1, 64).filter(lambda v: v != RANK) | st.text(max_size=3) | st.floats(0.5, 9.5),
        min_size=1,
        max_size=2,
    ),
    "alpha_pattern": st.dictionaries(st.just("q_proj"), JSON.filter(lambda v: not _is_number(v)), min_size=1),
    "base_model_name_or_path": JSON.filter(lambda v: v is not None and not isinstance(v, str)),
    "bias": JSON.filter(lambda v: v not in ("none", "all", "lora_only")),
    "lora_dropout": JSON.filter(lambda v: not _is_number(v) or not 0 <= v <= 1),
    "use_dora": NOT_BOOL,
    "use_rslora": NOT_BOOL,
    "fan_in_fan_out": NOT_BOOL,
    "modules_to_save": JSON.filter(lambda v: v is not None and not isinstance(v, list))
    | st.lists(st.integers(), min_size=1, max_size=2),
    "layers_to_transform": st.integers(max_value=-1) | st.text(min_size=1, max_size=4),
    "trainable_token_indices": st.none()
    | st.lists(st.integers(0, 2999), max_size=5).filter(lambda v: len(v) != len(TOOL_TOKENS))
    | JSON.filter(lambda v: v is not None and not isinstance(v, list | dict)),
}


@PROPERTY
@given(data=st.data())
def test_a_config_field_no_lora_adapter_has_is_refused_naming_it(data, trained, tmp_path):
    folder = copy_of(trained.adapter, tmp_path)
    config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    field = data.draw(st.sampled_from(sorted(BAD_FIELDS)), label="field")
    if data.draw(st.booleans(), label="removed") and field in ("peft_type", "r", "lora_alpha"):
        del config[field]  # PEFT always writes these
    else:
        config[field] = data.draw(BAD_FIELDS[field], label="value")
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config), encoding="utf-8")
    assert ADAPTER_CONFIG in refusal(folder)  # named as the file with the field, or the one it contradicts


@PROPERTY
@given(data=st.data())
def test_a_config_that_is_no_json_object_is_refused(data, trained, tmp_path):
    folder = copy_of(trained.adapter, tmp_path)
    text = (folder / ADAPTER_CONFIG).read_text(encoding="utf-8").rstrip()
    broken = data.draw(
        st.one_of(
            st.text(" \t\r\n", max_size=4).map(str.encode),  # empty, or blank
            st.just(b"\xef\xbb\xbf" + text.encode()),  # a byte-order mark before it, as editors save
            st.integers(1, len(text) - 1).map(lambda cut: text[:cut].encode()),  # cut short
            JSON.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
            st.binary(max_size=64),
        ),
        label="text",
    )
    (folder / ADAPTER_CONFIG).write_bytes(broken)
    assert ADAPTER_CONFIG in refusal(folder)


# --- adapter_model.safetensors ----------------------------------------------------------------------------


def header_entries(data: bytes) -> tuple[int, int]:
    """The byte range of the header's tensor entries (after `__metadata__`, before the closing brace and
    the padding): any byte changed there changes a name, a dtype, a shape or an offset."""
    size = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + size]
    return 8 + header.index(b"}") + 2, 8 + header.rindex(b"}")


@PROPERTY
@given(data=st.data())
def test_weights_cut_short_overwritten_or_changed_in_their_header_are_refused(data, trained, tmp_path):
    folder = copy_of(trained.adapter, tmp_path)
    weights = (folder / ADAPTER_WEIGHTS).read_bytes()
    start, end = header_entries(weights)
    how = data.draw(st.sampled_from(["cut", "random", "header byte", "appended", "header size"]), label="how")
    if how == "cut":
        broken = weights[: data.draw(st.integers(0, len(weights) - 1), label="kept")]
    elif how == "random":
        broken = data.draw(st.binary(max_size=4096), label="bytes")
    elif how == "header byte":
        at = data.draw(st.integers(start, end - 1), label="at")
        byte = data.draw(st.integers(0, 255).filter(lambda b: b != weights[at]), label="byte")
        broken = weights[:at] + bytes([byte]) + weights[at + 1 :]
    elif how == "appended":
        broken = weights + data.draw(st.binary(min_size=1, max_size=64), label="tail")
    else:
        real = int.from_bytes(weights[:8], "little")
        size = data.draw(st.integers(0, 2**64 - 1).filter(lambda n: n != real), label="size")
        broken = size.to_bytes(8, "little") + weights[8:]
    (folder / ADAPTER_WEIGHTS).write_bytes(broken)
    refusal(folder, base="tiny")  # a key or shape changed to another valid one fits no module of the base


def test_the_real_adapter_passes_every_check(trained):
    check_fits(check_adapter(trained.adapter), "tiny")


def test_a_base_of_another_width_is_refused_before_it_loads(trained, tmp_path):
    from gpuval.finetune.model import TINY_MODEL_DIR

    other = tmp_path / "narrow"
    other.mkdir()
    config = json.loads((TINY_MODEL_DIR / "config.json").read_text(encoding="utf-8"))
    (other / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}), encoding="utf-8")
    message = refusal(trained.adapter, base=str(other))
    assert "does not fit base model" in message and "96 wide" in message


@pytest.mark.parametrize(
    "entry", ["fifo", "dangling link", "socket", "link loop", "no weights", "pickle only"]
)
def test_an_adapter_folder_holding_no_file_where_one_belongs_is_refused(entry, trained, tmp_path):
    folder = copy_of(trained.adapter, tmp_path)
    if entry == "fifo":
        os.mkfifo(folder / "pipe")
    elif entry == "dangling link":
        (folder / "tokenizer.json").unlink()
        (folder / "tokenizer.json").symlink_to(tmp_path / "gone.json")
    elif entry == "socket":
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(folder / "s"))
    elif entry == "link loop":
        (folder / "loop").symlink_to(folder / "loop")
    elif entry == "no weights":
        (folder / ADAPTER_WEIGHTS).unlink()
    else:
        (folder / ADAPTER_WEIGHTS).rename(folder / "adapter_model.bin")
    message = refusal(folder)
    target = tmp_path / "exported"
    with pytest.raises(UsageError, match="^export: adapter"):
        export(folder, target)
    assert not target.exists() and message


# --- export's target ------------------------------------------------------------------------------------


def test_export_under_a_file_or_into_an_unwritable_folder_is_refused_and_leaves_nothing(
    trained, tmp_path, monkeypatch
):
    (tmp_path / "a-file").write_text("mine", encoding="utf-8")
    with pytest.raises(UsageError, match=r"^export: '.*a-file/deep/out' lies under '.*a-file', which is not"):
        export(trained.adapter, tmp_path / "a-file" / "deep" / "out")
    before = sorted(tmp_path.rglob("*"))
    real_mkdir = Path.mkdir

    def read_only(self: Path, *args: Any, **kwargs: Any) -> None:
        if self.name.startswith(".tmp-"):  # the export's temp folder, in a folder it may not write
            raise PermissionError(13, "Permission denied", str(self))
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(UsageError, match=r"^export: cannot write '.*\.tmp-out-\d+' \(Permission denied\)"):
        export(trained.adapter, tmp_path / "new" / "deeper" / "out")
    monkeypatch.undo()

    def disk_full(source: Any, destination: Any, **_kwargs: Any) -> None:
        (Path(destination) / "adapter_model.safetensors").write_bytes(b"half")
        raise OSError(28, "No space left on device", str(destination))

    monkeypatch.setattr(shutil, "copytree", disk_full)
    with pytest.raises(UsageError, match=r"^export: cannot write .*\(No space left on device\)"):
        export(trained.adapter, tmp_path / "new" / "out")
    assert sorted(tmp_path.rglob("*")) == before  # no DIR, no temp folder, no parent made for them


# --- eval splits ----------------------------------------------------------------------------------------

TEXT = st.text(max_size=6)
NOT_TEXT = JSON.filter(lambda v: not isinstance(v, str))
NOT_OBJECT = JSON.filter(lambda v: not isinstance(v, dict))
NOT_LIST = JSON.filter(lambda v: v is not None and not isinstance(v, list))
CALL = st.fixed_dictionaries({"name": TEXT, "arguments": st.dictionaries(TEXT, TEXT, max_size=2)})
BAD_CALL = st.one_of(
    NOT_OBJECT,
    st.fixed_dictionaries({"name": NOT_TEXT, "arguments": st.just({})}),
    st.fixed_dictionaries({"name": TEXT, "arguments": JSON.filter(lambda v: not isinstance(v, dict))}),
    st.fixed_dictionaries({"name": TEXT}),
)


def user(text: str = "hi") -> dict[str, Any]:
    return {"role": "user", "content": text}


def reply(calls: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": calls}


@st.composite
def bad_records(draw: Any) -> Any:
    """A decoded line no prepared split holds: one part of another shape, the rest as prepare writes it."""
    tool = {"name": "f", "parameters": {"type": "object", "properties": {}}}
    kind = draw(st.sampled_from(["top", "tools", "tool", "messages", "message", "role", "content", "calls"]))
    if kind == "top":
        return draw(NOT_OBJECT)
    if kind == "tools":
        return {"tools": draw(NOT_LIST), "messages": [user(), reply([])]}
    if kind == "tool":
        odd = draw(st.one_of(NOT_OBJECT, st.fixed_dictionaries({"name": NOT_TEXT})))
        return {"tools": [tool, odd], "messages": [user(), reply([])]}
    if kind == "messages":
        record = {"tools": [tool]}
        if draw(st.booleans()):
            record["messages"] = draw(JSON.filter(lambda v: not isinstance(v, list)))
        return record
    if kind == "message":
        return {"tools": [tool], "messages": [user(), draw(NOT_OBJECT), reply([])]}
    if kind == "role":
        role = draw(JSON.filter(lambda v: v not in ("system", "user", "assistant", "tool")))
        return {"tools": [tool], "messages": [{"role": role, "content": "x"}, reply([])]}
    if kind == "content":
        content = draw(JSON.filter(lambda v: v is not None and not isinstance(v, str)))
        return {"tools": [tool], "messages": [{"role": "user", "content": content}, reply([])]}
    calls = draw(st.one_of(NOT_LIST, st.lists(CALL, max_size=1)))
    if isinstance(calls, list):  # a list of calls, one of them broken
        calls = [*calls, draw(BAD_CALL)]
    return {"tools": [tool], "messages": [user(), reply(calls)]}


@PROPERTY
@given(
    record=bad_records(), before=st.integers(0, 3), blanks=st.integers(0, 2), limit=st.sampled_from([None, 1])
)
def test_a_split_line_of_another_shape_is_refused_naming_the_line(
    record, before, blanks, limit, trained, tmp_path
):
    good = [json.dumps(r) for r in trained.records[:before]]
    lines = good + [""] * blanks + [json.dumps(record), json.dumps(trained.records[0])]
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "eval.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(UsageError) as refused:
        read_eval_split(path, limit)  # every line is checked, also past the limit
    message = str(refused.value)
    assert message.startswith(f"eval split '{path}' line {before + blanks + 1}: "), message
    assert "\n" not in message


def test_well_formed_records_are_read_as_before(trained, tmp_path):
    path = tmp_path / "eval.jsonl"
    odd = {
        "messages": [
            user(),
            {"role": "assistant", "content": None, "tool_calls": [{"name": "f", "arguments": {}}]},
        ]
    }
    no_target = {"tools": [], "messages": [user()]}
    wrapped = {"tools": [{"type": "function", "function": {"name": "f"}}], "messages": [user(), reply([])]}
    lines = [*trained.records[:2], odd, no_target, wrapped]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    records, too_long = read_eval_split(path, None)
    assert records == [*trained.records[:2], odd, wrapped] and too_long == []


def test_a_prompt_past_the_context_is_left_out_without_tokenizing_it(trained, tmp_path, monkeypatch):
    tokenizer = load_tokenizer("tiny")
    fit = PromptFit(tokenizer, context=4096, max_new_tokens=64)
    seen: list[int] = []
    real_call = type(tokenizer).__call__

    def counting(self: Any, text: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(len(text))
        return real_call(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", counting)
    huge = {"tools": [], "messages": [user("hello world " * 90_000), reply([])]}
    started = time.perf_counter()
    assert not fit(huge)
    assert time.perf_counter() - started < 2 and not seen  # told apart by its length alone
    assert fit(trained.records[0]) and seen and max(seen) < 50_000
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [trained.records[0], huge]), encoding="utf-8")
    assert read_eval_split(path, None, fit) == ([trained.records[0]], [2])
    assert "left out 1 record" in fit.note("eval", [2]) and "line 2" in fit.note("eval", [2])
    with pytest.raises(UsageError, match="eval.max_new_tokens 4096 leaves no room"):
        PromptFit(tokenizer, context=4096, max_new_tokens=4096)


# --- the commands, as users run them --------------------------------------------------------------------


def run(args: list[str], cwd: Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuval", *args],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def one_line(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit 2, nothing on stdout, exactly one `gpuval:` line on stderr holding every fragment."""
    shown = f"exit {result.returncode}\nstdout: {result.stdout[-2000:]}\nstderr: {result.stderr[-3000:]}"
    assert result.returncode == 2 and not result.stdout.strip(), shown
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuval: "), shown
    assert all(fragment in lines[0] for fragment in fragments), shown
    return lines[0]


def test_cli_export_refusals_and_a_merge_say_one_line_each(trained, tmp_path):
    from gpuval.finetune.model import TINY_MODEL_DIR

    folder = copy_of(trained.adapter, tmp_path)
    os.mkfifo(folder / "pipe")
    one_line(run(["finetune", "export", str(folder), "out"], tmp_path), "holds 'pipe', which is a FIFO")
    (folder / "pipe").unlink()
    # before: transformers' loading bar, a FutureWarning and DeepSpeed's accelerator warning around the line
    merged = run(["finetune", "export", "--merge", "--dtype", "float32", str(folder), "merged"], tmp_path)
    assert merged.returncode == 0 and not merged.stderr, merged.stderr[-3000:]
    assert merged.stdout.startswith("wrote merged model") and not CHATTER.search(merged.stdout), merged.stdout
    other = tmp_path / "other-base"
    other.mkdir()
    config = json.loads((TINY_MODEL_DIR / "config.json").read_text(encoding="utf-8"))
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": 96}), encoding="utf-8")
    # before: transformers' loading bar and a FutureWarning, then the line
    one_line(
        run(["finetune", "export", "--merge", str(folder), "out", "--base", str(other)], tmp_path),
        "does not fit",
    )
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".tmp-*"))


def test_cli_eval_refusals_leave_no_output_folder(trained, tmp_path):
    one_line(
        run(["finetune", "eval", "--config", str(trained.config), "--set", "output=missing/run"], tmp_path),
        "adapter 'missing/run/adapter' not found",
    )
    split = tmp_path / "split.jsonl"
    record = {"tools": [], "messages": [user(), reply({"name": "f", "arguments": {}})]}
    split.write_text(json.dumps(trained.records[0]) + "\n" + json.dumps(record) + "\n", encoding="utf-8")
    args = ["--adapter", str(trained.adapter), "--set", f"data.eval={split}", "--set", "output=missing/run"]
    one_line(
        run(["finetune", "eval", "--config", str(trained.config), *args], tmp_path),
        f"eval split '{split}' line 2: message 2's tool_calls is an object",
    )
    assert not (tmp_path / "missing").exists()


def test_cli_eval_leaves_out_a_megabyte_prompt_and_stops_at_sigterm(trained, tmp_path):
    huge = {"tools": [], "messages": [user("hello world " * 90_000), reply([])]}
    split = tmp_path / "split.jsonl"
    split.write_text(
        json.dumps(huge) + "\n" + "".join(json.dumps(r) + "\n" for r in trained.records * 20),
        encoding="utf-8",
    )
    args = [
        "--adapter",
        str(trained.adapter),
        "--set",
        f"data.eval={split}",
        "--set",
        "eval.max_new_tokens=256",
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuval", "finetune", "eval", "--config", str(trained.config), *args],
        cwd=tmp_path,
        env={**cli_env(), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        note = process.stdout.readline()  # before: minutes in one attention call, gigabytes resident
        if not note.startswith("eval eval: left out 1 record whose prompt is longer"):
            process.kill()
            raise AssertionError(f"{note}{process.communicate()[1][-3000:]}")
        assert note.rstrip().endswith("line 1"), note
        time.sleep(3)  # the model loads and generates
        process.send_signal(signal.SIGTERM)
        sent = time.perf_counter()
        _out, err = process.communicate(timeout=30)
        assert time.perf_counter() - sent < 5, "SIGTERM took more than a few seconds"
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == "gpuval: interrupted (SIGTERM)", err


def test_cli_prepare_that_cannot_write_leaves_no_folder(trained, tmp_path):
    source = tmp_path / "glaive.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in synth_records(40, seed=1)), encoding="utf-8")

    def small_files() -> None:  # in the child: writes past 2 kB fail with EFBIG instead of killing it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    result = run(
        ["finetune", "prepare", "--input", str(source), "--output", "made/deep/out"],
        tmp_path,
        preexec_fn=small_files,
    )
    one_line(result, "cannot write", "File too large")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["glaive.jsonl"]

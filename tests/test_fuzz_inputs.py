"""Property-based fuzzing of every input gpuval reads (issue 19): profile YAML, --set values, fine-tune
config YAML, Glaive dataset records, result.json for report/compare, checkpoint folders.

The promise under test (README, docs/guarantees.md): bad input exits 2 with ONE line `gpuval: ...` on
stderr, never a traceback, and leaves nothing behind; good input goes on. The CLI runs in this process
(gpuval.cli.main, SystemExit caught) so that >= 1,000 cases fit in CI's time; the work after input
validation (benchmarks, training) is replaced by a stub, since what is fuzzed is the gate in front of it. A
few cases at the end run as child processes, as users run gpuval.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import cli_env

hypothesis = pytest.importorskip("hypothesis")
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

# hypothesis caches what it learns under ./.hypothesis: keep the checkout clean (nothing left behind)
set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "gpuval-hypothesis"))
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import gpuval.cli as cli  # noqa: E402
import gpuval.launch as launch  # noqa: E402
from gpuval.errors import UsageError  # noqa: E402

FUZZ = settings(
    deadline=None,
    database=None,  # no .hypothesis/ folder left behind
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
SCALE = float(os.environ.get("GPUVAL_FUZZ_SCALE", "1"))  # e.g. 10 for a longer campaign than CI's
COUNTS: dict[str, int] = {}  # cases run per kind, reported by test_case_count
# test_case_count reads what the fuzz tests counted in this process: under parallel workers, all on one
pytestmark = pytest.mark.xdist_group("test_fuzz_inputs.py")


def invoke(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """`gpuval ARGS` in this process: (exit code, stdout, stderr). An exception escaping main() is a
    traceback a user would see: returned as exit -1 with the exception in stderr."""
    out, err = io.StringIO(), io.StringIO()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    old_argv, old_cwd = sys.argv, os.getcwd()
    sys.argv = ["gpuval", *args]
    os.chdir(cwd)
    code = -1
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException as exc:  # noqa: BLE001 - the very thing under test
                import traceback

                err.write("Traceback (in process)\n" + "".join(traceback.format_exception(exc)))
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return code, out.getvalue(), err.getvalue()


def assert_clean(result: tuple[int, str, str], allowed: set[int], case: Any, left: Path | None = None) -> int:
    """No traceback; an allowed exit; a refusal (2) is one `gpuval: ` line and leaves `left` absent."""
    code, out, err = result
    shown = f"case: {case!r}\nexit {code}\nstdout: {out[-1500:]}\nstderr: {err[-3000:]}"
    assert "Traceback" not in out + err, shown
    assert code in allowed, shown
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("gpuval: "), shown
        if left is not None:
            assert not left.exists(), f"{left} left behind\n{shown}"
    return code


def case_dir(tmp_path: Path) -> Path:
    """A fresh folder per generated case (hypothesis runs every case of a test in one tmp_path)."""
    import tempfile

    return Path(tempfile.mkdtemp(dir=tmp_path))


class _CachedApp:
    """cli.app with its click command built once (typer rebuilds it on every call: ~90 ms)."""

    def __init__(self, command: Any) -> None:
        self.command = command

    def __call__(self, **kwargs: Any) -> Any:
        return self.command.main(**kwargs)


@functools.cache
def _command() -> Any:
    import typer

    return typer.main.get_command(cli.app)


@pytest.fixture
def stub_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything up to the work runs (reading, validating, checking output paths); the work does not."""
    monkeypatch.setattr(launch, "run_distributed", lambda *args, **kwargs: 0)
    monkeypatch.setattr(cli, "app", _CachedApp(_command()))  # typer builds the click command per call
    for key in list(os.environ):
        if key in ("RANK", "WORLD_SIZE", "LOCAL_RANK") or key.startswith(("SLURM_", "TORCHELASTIC_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("GPUVAL_HISTORY", "none")
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("NO_COLOR", "1")


# --- values and byte mutations shared by every kind ------------------------------------------------------

NASTY_SCALARS = [
    None, True, False, 0, -1, 1, 2**63, -(2**64), 10**40, 1e308, -0.0, 0.5, 1e-300,
    float("nan"), float("inf"), float("-inf"), "", " ", "[/]", "[bold]x[/bold]", "[red", "\\", "abc",
    "1GiB", "-1", ".inf", ".nan", "1e400", "9" * 50, "é", "\x00", "\t", "{", "]", "a: b", "*x", "&a",
    "ü" * 300, "${HOME}", "{output}", "../../etc/passwd",
    "a\nb", "a\r\nb", "\x1b[31mred", "a\u2028b", "a\x85b", "\x0b\x0c",  # control characters, line breaks
]  # fmt: skip

scalars = st.one_of(
    st.sampled_from(NASTY_SCALARS),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(alphabet="abcxyz_.[/]", min_size=1, max_size=6), inner, max_size=3),
    ),
    max_leaves=6,
)


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(data, dict):
        for key, item in data.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(data, list):
        for index, item in enumerate(data):
            found += _paths(item, (*prefix, index))
    return found


@st.composite
def mutated(draw: Any, base: dict[str, Any]) -> dict[str, Any]:
    """`base` with a few places replaced, deleted or given unknown keys."""
    data = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(_paths(data)))
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if not path:
            if action == "add":
                data[draw(st.text(alphabet="abxyz_", min_size=1, max_size=5))] = draw(values)
            continue
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        if action == "delete":
            del parent[path[-1]]
        elif action == "add" and isinstance(parent[path[-1]], dict):
            parent[path[-1]][draw(st.text(alphabet="abxyz_", min_size=1, max_size=5))] = draw(values)
        else:
            parent[path[-1]] = draw(values)
    return data


@st.composite
def byte_mutation(draw: Any, text: str) -> bytes:
    """Bytes of `text`, maybe broken: invalid UTF-8, a duplicated line, deep nesting, a cut, a BOM, NUL."""
    data = text.encode("utf-8", "surrogatepass")
    kind = draw(
        st.sampled_from(["none", "none", "bad-utf8", "dup-line", "deep", "cut", "bom", "nul", "empty"])
    )
    at = draw(st.integers(0, len(data)))
    if kind == "bad-utf8":
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"])) + data[at:]
    elif kind == "dup-line":
        lines = data.splitlines(keepends=True)
        if lines:
            index = draw(st.integers(0, len(lines) - 1))
            lines.insert(index, lines[index])
        data = b"".join(lines)
    elif kind == "deep":
        depth = draw(st.sampled_from([70, 500, 5000]))
        data = b"x: " + b"[" * depth + b"]" * depth + b"\n" + data
    elif kind == "cut":
        data = data[:at]
    elif kind == "bom":
        data = b"\xef\xbb\xbf" + data
    elif kind == "nul":
        data = data[:at] + b"\x00" + data[at:]
    elif kind == "empty":
        data = b""
    return data


def _dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


# --- 1. profile YAML ---------------------------------------------------------------------------------------

BASE_PROFILE = {
    "name": "fuzz",
    "description": "a profile for the fuzzer",
    "expect": {"gpu_count": 0, "gpu_memory_gib": 1.5},
    "runtime": {"timeout_s": 60.0},
    "health": {"xid_window_s": 0, "skip": ["smoke"]},
    "history": {"window": 3, "tolerance_pct": 5.0},
    "checks": {
        "matmul.fp32_tflops": {"min": 0.001},
        "all_reduce.busbw_gbps": {"min": 0.01, "bytes": "1MiB", "level": "warn"},
    },
    "benchmarks": {"collectives": {"max_bytes": "1MiB"}},
}


@settings(FUZZ, max_examples=round(300 * SCALE))
@given(data=st.data())
def test_fuzz_profile_yaml(data, tmp_path, stub_work):
    tmp_path = case_dir(tmp_path)
    structure = data.draw(mutated(BASE_PROFILE))
    raw = data.draw(byte_mutation(_dump_yaml(structure)))
    profile, out = tmp_path / "p.yaml", tmp_path / "out"
    profile.write_bytes(raw)
    code = assert_clean(
        invoke(["accept", "--profile", str(profile), "--output", str(out)], tmp_path), {0, 2}, raw, out
    )
    COUNTS["profile"] = COUNTS.get("profile", 0) + 1
    shutil.rmtree(out, ignore_errors=True)
    if code == 0:  # accepted: then no number in it is NaN or infinite
        from gpuval.config import load_profile

        dumped = json.dumps(load_profile(str(profile)).model_dump(mode="json"), allow_nan=False)
        assert dumped


# --- 2. --set values ----------------------------------------------------------------------------------------

SET_KEYS = [
    "expect.gpu_count", "expect.gpu_memory_gib", "expect.gpu_name", "expect.pci_ids", "runtime.timeout_s",
    "checks.matmul.fp32_tflops.min", "checks.matmul.fp32_tflops.max", "checks.matmul.fp32_tflops",
    "checks.all_reduce.busbw_gbps.bytes", "checks.all_reduce.busbw_gbps.level",
    "benchmarks.collectives.extra_sizes",
    "benchmarks.collectives.max_bytes", "benchmarks.membw.bytes", "health.xid_window_s", "health.skip",
    "health.xid_since", "history.window", "name", "nosuch.key", "checks.x", "checks", "expect",
]  # fmt: skip
set_values = st.one_of(
    st.sampled_from(
        [str(v) for v in NASTY_SCALARS] + [".inf", "-.inf", ".nan", "9" * 5000, "[1, abc]", "{a: 1}"]
    ),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30),
    values.map(lambda v: json.dumps(v, allow_nan=True)),
)


@settings(FUZZ, max_examples=round(300 * SCALE))
@given(key=st.sampled_from(SET_KEYS), value=set_values, command=st.sampled_from(["accept", "bench"]))
@example(key="health.skip", value='["a\\nb"]', command="accept")  # YAML's escape: a newline in the name
@example(key="health.skip", value='["x\x1b[2J\\r\u2028"]', command="accept")
@example(key="checks.x", value="{min: 1}", command="accept")
def test_fuzz_set_values(key, value, command, tmp_path, stub_work):
    tmp_path = case_dir(tmp_path)
    out = tmp_path / "out"
    if command == "accept":
        args = ["accept", "--profile", "cpu", "--set", f"{key}={value}", "--output", str(out)]
    else:  # a benchmark's own options
        option = key.rsplit(".", 1)[-1]
        args = ["bench", "collectives", "--set", f"{option}={value}", "--output", str(out / "b.json")]
    assert_clean(invoke(args, tmp_path), {0, 2}, args, out)
    COUNTS["set"] = COUNTS.get("set", 0) + 1
    shutil.rmtree(out, ignore_errors=True)


# --- 3. fine-tune config YAML ------------------------------------------------------------------------------

BASE_CONFIG = {
    "model": "tiny",
    "lora": {"rank": 4, "alpha": 8.0, "dropout": 0.0},
    "data": {"train": "{output}/data/train.jsonl", "max_seq_len": 64},
    "train": {"micro_batch_size": 1, "max_steps": 2, "optim": {"lr": 0.001, "grad_clip": 1.0}},
    "output": "run",
    "synth": {"n": 4},
    "eval": {"batch_size": 2, "max_examples": 2},
}


@settings(FUZZ, max_examples=round(150 * SCALE))
@given(data=st.data())
def test_fuzz_finetune_config(data, tmp_path, stub_work):
    tmp_path = case_dir(tmp_path)
    structure = data.draw(mutated(BASE_CONFIG))
    raw = data.draw(byte_mutation(_dump_yaml(structure)))
    config = tmp_path / "ft.yaml"
    config.write_bytes(raw)
    assert_clean(
        invoke(["finetune", "train", "--config", str(config)], tmp_path), {0, 2}, raw, tmp_path / "run"
    )
    COUNTS["finetune-config"] = COUNTS.get("finetune-config", 0) + 1


# --- 4. Glaive dataset records -----------------------------------------------------------------------------

GOOD_RECORD = {
    "system": "SYSTEM: You are a helpful assistant with access to the following functions. Use them if "
    'required - {"name": "get_time", "description": "time", "parameters": {"type": "object", '
    '"properties": {"zone": {"type": "string"}}}}',
    "chat": "USER: What time is it in Paris? ASSISTANT: <functioncall> "
    '{"name": "get_time", "arguments": \'{"zone": "Europe/Paris"}\'} <|endoftext|> '
    'FUNCTION RESPONSE: {"time": "10:00"} ASSISTANT: It is 10:00. <|endoftext|>',
}
RAW_LINES = [
    '{"system": "\\ud800", "chat": "USER: hi ASSISTANT: hello"}',  # a lone surrogate
    '{"system": "x", "chat": "USER: \\ud83d\\ude00 ASSISTANT: ok <functioncall> {\\"name\\": \\"f\\", '
    '\\"arguments\\": \\"{\\\\\\"a\\\\\\": \\\\\\"\\\\ud800\\\\\\"}\\"}"}',  # a surrogate inside a call
    '{"system": NaN, "chat": Infinity}',
    '{"system": 1e400, "chat": "x"}',
    "[" * 3000 + "]" * 3000,
    '{"system": "a", "system": "b", "chat": "c"}',
    "null",
    '"just a string"',
    # JSON nested past Python's recursion limit inside a field that is JSON text of its own
    json.dumps({"system": GOOD_RECORD["system"], "chat": "USER: hi\n\nASSISTANT: <functioncall> "
                + "[" * 5000 + "]" * 5000 + " <|endoftext|>"}),
    json.dumps({"system": GOOD_RECORD["system"] + " " + '{"a": ' * 5000 + "1" + "}" * 5000,
                "chat": GOOD_RECORD["chat"]}),
]  # fmt: skip


@settings(FUZZ, max_examples=round(150 * SCALE))
@given(data=st.data())
def test_fuzz_glaive_records(data, tmp_path, stub_work):
    tmp_path = case_dir(tmp_path)
    lines = []
    for _ in range(data.draw(st.integers(1, 4))):
        how = data.draw(st.sampled_from(["good", "mutated", "raw", "value"]))
        if how == "good":
            lines.append(json.dumps(GOOD_RECORD))
        elif how == "mutated":
            lines.append(json.dumps(data.draw(mutated(GOOD_RECORD)), allow_nan=True))
        elif how == "raw":
            lines.append(data.draw(st.sampled_from(RAW_LINES)))
        else:
            lines.append(json.dumps(data.draw(values), allow_nan=True))
    as_list = data.draw(st.booleans())
    text = ("[" + ",\n".join(lines) + "]") if as_list else "\n".join(lines)
    raw = data.draw(byte_mutation(text))
    source, out = tmp_path / ("in.json" if as_list else "in.jsonl"), tmp_path / "prepared"
    source.write_bytes(raw)
    args = ["finetune", "prepare", "--input", str(source), "--output", str(out)]
    code = assert_clean(invoke(args, tmp_path), {0, 2}, raw, out)
    COUNTS["glaive"] = COUNTS.get("glaive", 0) + 1
    if code == 0:  # what was written reads back through the same gate training uses
        from gpuval.finetune.data.prepare import read_jsonl

        for name in ("train", "eval", "eval_unseen"):
            read_jsonl(out / f"{name}.jsonl", "prepared data")


# --- 5. result.json for report and compare -----------------------------------------------------------------


def _base_result() -> dict[str, Any]:
    measurement = {"name": "all_reduce", "scope": "cluster", "params": {"bytes": 1048576, "dtype": "float32"},
                   "metrics": {"busbw_gbps": 10.0, "time_us": 100.0}, "samples": 5}  # fmt: skip
    return {
        "schema": "gpuval.result/v1",
        "verdict": "PASS",
        "started_at": "2026-01-01T00:00:00+00:00",
        "duration_s": 1.0,
        "profile": "cpu",
        "world": {"size": 2, "nodes": 1, "backend": "gloo"},
        "inventory": {"nodes": [{"node": "n1", "gpus": [{"name": "H100"}], "software": {"torch": "2.11"}}]},
        "measurements": [
            measurement,
            {"name": "membw", "scope": "gpu:n1/0", "params": {}, "metrics": {"copy_tbps": 3.0}, "samples": 3},
            {
                "name": "p2p",
                "scope": "link:n1/0-1",
                "params": {"src": 0, "dst": 1},
                "metrics": {"copy_gbps": 300.0},
            },
            {
                "name": "train",
                "scope": "cluster",
                "params": {"model": "tiny", "mode": "ddp", "seq_len": 64},
                "metrics": {"tokens_per_s_per_gpu": 1000.0, "mfu_pct": 1.0},
            },
        ],  # fmt: skip
        "checks": [
            {
                "name": "all_reduce.busbw_gbps",
                "status": "PASS",
                "value": 10.0,
                "threshold": {"min": 1.0, "bytes": 1048576},
                "unit": "GB/s",
                "scope": "cluster",
                "detail": "",
            },
            {
                "name": "gpu.count",
                "status": "FAIL",
                "value": None,
                "threshold": {},
                "detail": "[/] one GPU missing",
            },
        ],  # fmt: skip
        "settings": {"profile": {"checks": {"all_reduce.busbw_gbps": {"min": 1.0, "bytes": 1048576}}}},
    }


BASE_RESULT = _base_result()
RESULT_EDITS = [
    ("schema", "gpuval.result/v2"), ("schema", "gpuval.result/v0"), ("schema", "something/else"),
    ("inventory", {"nodes": ["x"]}), ("inventory", {"nodes": "x"}), ("verdict", "ERROR"),
    ("settings", {"profile": {"checks": {"all_reduce.busbw_gbps": "fast"}}}),
    ("settings", {"profile": {"checks": {"all_reduce.busbw_gbps": {"min": "1", "bytes": "big"}}}}),
    ("settings", {"profile": "x"}), ("measurements", []),
]  # fmt: skip


@st.composite
def result_documents(draw: Any) -> bytes:
    data = draw(mutated(BASE_RESULT))
    if draw(st.booleans()) and isinstance(data, dict):
        key, value = draw(st.sampled_from(RESULT_EDITS))
        data[key] = value
    if draw(st.integers(0, 4)) == 0 and isinstance(data, dict):
        data.pop("schema", None)
    text = json.dumps(data, allow_nan=True)  # NaN and Infinity as a careless writer would put them
    if draw(st.integers(0, 5)) == 0:
        text = text.replace("10.0", draw(st.sampled_from(["NaN", "-Infinity", "1e999", "-5", "9" * 5000])), 1)
    return draw(byte_mutation(text))


@settings(FUZZ, max_examples=round(40 * SCALE))
@given(document=result_documents())
def test_fuzz_report(document, tmp_path, stub_work):
    tmp_path = case_dir(tmp_path)
    source, page = tmp_path / "result.json", tmp_path / "page.html"
    source.write_bytes(document)
    assert_clean(invoke(["report", str(source), "--output", str(page)], tmp_path), {0, 2}, document, page)
    COUNTS["report"] = COUNTS.get("report", 0) + 1


@settings(FUZZ, max_examples=round(150 * SCALE))
@given(document=result_documents(), later_first=st.booleans())
def test_fuzz_compare(document, later_first, tmp_path, stub_work):
    tmp_path = case_dir(tmp_path)
    good, fuzzed = tmp_path / "good.json", tmp_path / "fuzzed.json"
    good.write_text(json.dumps(BASE_RESULT))
    fuzzed.write_bytes(document)
    before, after = (fuzzed, good) if later_first else (good, fuzzed)
    code = assert_clean(invoke(["compare", str(before), str(after), "--fail-on-regression", "5"], tmp_path),
                        {0, 1, 2}, document)  # fmt: skip
    COUNTS["compare"] = COUNTS.get("compare", 0) + 1
    if code == 0 and not later_first:  # the later run neither ERROR nor missing what the earlier one had
        later = json.loads(document)
        assert later["verdict"] != "ERROR"
        assert len(later["measurements"]) >= len(BASE_RESULT["measurements"])


# --- 6. checkpoint folders (finetune --resume) -------------------------------------------------------------


class _NoParallel:
    def load_state(self, folder: Path) -> None:
        pass


@settings(FUZZ, max_examples=round(100 * SCALE))
@given(
    names=st.lists(
        st.sampled_from(
            [
                "step-00000002",
                "step-00000010",
                "step-2",
                "step-",
                "step-x",
                ".tmp-step-00000003",
                "other",
                "step-99999999999999999999",
            ]
        ),
        max_size=3,
        unique=True,
    ),  # fmt: skip
    as_file=st.booleans(),
    state=st.one_of(
        st.just(None),
        values.map(lambda v: json.dumps(v, allow_nan=True)),
        st.sampled_from(
            [
                '{"step": 2, "world_size": 1}',
                '{"step": 10, "world_size": 1}',
                "[" * 5000,
                '{"step": 1e999, "world_size": 1}',
                "\udcff",
            ]
        ),
    ),  # fmt: skip
)
def test_fuzz_checkpoint_folders(names, as_file, state, tmp_path):
    tmp_path = case_dir(tmp_path)
    from gpuval.finetune.checkpoint import load_checkpoint, resume_checkpoint

    root = tmp_path / "checkpoints"
    root.mkdir()
    for index, name in enumerate(names):
        entry = root / name
        if as_file and index == 0:
            entry.write_text("x")
        else:
            entry.mkdir(exist_ok=True)
            if state is not None:
                (entry / "state.json").write_bytes(state.encode("utf-8", "surrogateescape"))
    COUNTS["checkpoint"] = COUNTS.get("checkpoint", 0) + 1
    try:
        checkpoint = resume_checkpoint(tmp_path)
        load_checkpoint(checkpoint, _NoParallel(), rank=0, world_size=1)
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc), exc


# --- 7. paths longer than the OS allows (issue 34) ----------------------------------------------------------

# Where a path the user gives goes: LONG stands for the too-long path, DIR for the case's folder.
PATH_COMMANDS = [
    ["accept", "--profile", "cpu", "--output", "LONG"],
    ["accept", "--profile", "LONG", "--output", "DIR/out"],
    ["accept", "--profile", "cpu", "--output", "DIR/out", "--history", "LONG"],
    ["health", "--profile", "cpu", "--output", "LONG"],
    ["bench", "membw", "--output", "LONG"],
    ["finetune", "train", "--config", "LONG"],
    ["finetune", "train", "--config", "DIR/ft-long-output.yaml"],  # the config's output: LONG
    ["finetune", "prepare", "--input", "LONG", "--output", "DIR/prepared"],
    ["finetune", "prepare", "--input", "DIR/in.jsonl", "--output", "LONG"],
    ["report", "LONG"],
    ["report", "DIR/good.json", "--output", "LONG"],
    ["compare", "DIR/good.json", "LONG"],
]


@st.composite
def long_paths(draw: Any) -> str:
    """A path the OS refuses for its length (ENAMETOOLONG): one name of more than 255 bytes (multi-byte
    characters count as several), or more than 4096 bytes of short names."""
    kind = draw(st.sampled_from(["name", "name-multibyte", "path", "name-inside"]))
    if kind == "name":
        return "a" * draw(st.integers(256, 2000)) + draw(st.sampled_from(["", ".yaml", ".json", ".jsonl"]))
    if kind == "name-multibyte":
        return "ü" * draw(st.integers(128, 600))  # 2 bytes each: over 255 bytes, under 255 characters
    if kind == "path":
        return "/".join(["d" * 200] * draw(st.integers(21, 40)))
    return "a" * draw(st.integers(256, 400)) + "/x.json"


@settings(FUZZ, max_examples=round(120 * SCALE))
@given(command=st.sampled_from(PATH_COMMANDS), long=long_paths(), relative=st.booleans())
@example(command=PATH_COMMANDS[1], long="p" * 300 + ".yaml", relative=False)  # --profile FILE
@example(command=PATH_COMMANDS[4], long="b" * 300 + "/x.json", relative=False)  # bench --output
@example(command=PATH_COMMANDS[7], long="i" * 300 + ".jsonl", relative=False)  # dataset input
@example(command=PATH_COMMANDS[8], long="o" * 300, relative=False)  # prepare --output
# --history whose folder the OS makes but whose file it refuses (4,020 bytes of folders, 4,221 in all): the
# folders made on the way are removed again (found by this test, 2026-11-28)
@example(command=PATH_COMMANDS[2], long="/".join(["d" * 200] * 21), relative=True)
def test_fuzz_paths_too_long(command, long, relative, tmp_path, stub_work):
    tmp_path = case_dir(tmp_path)
    path = long if relative else str(tmp_path / long)
    (tmp_path / "ft-long-output.yaml").write_text(_dump_yaml(dict(BASE_CONFIG, output=path)))
    (tmp_path / "in.jsonl").write_text(json.dumps(GOOD_RECORD) + "\n")
    (tmp_path / "good.json").write_text(json.dumps(BASE_RESULT))
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [path if part == "LONG" else part.replace("DIR", str(tmp_path)) for part in command]
    result = invoke(args, tmp_path)
    assert_clean(result, {2}, args)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, f"{args}: something was written"
    assert "shorter path" in result[2] or "too long" in result[2], result[2]
    COUNTS["long-path"] = COUNTS.get("long-path", 0) + 1


# --- child processes: as a user runs gpuval ----------------------------------------------------------------


def _child(args: list[str], cwd: Path, **env: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "gpuval", *args], cwd=cwd, env=cli_env(**env),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.slow
def test_child_process_refusals(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    dup = tmp_path / "dup.yaml"
    dup.write_text("name: a\nname: b\n")
    for args, fragment in [
        (["accept", "--profile", str(fifo)], "FIFO"),
        (["accept", "--profile", str(latin)], "not UTF-8 text (byte 9: 0xe9)"),
        (["accept", "--profile", str(dup)], "duplicate key 'name'"),
        (["accept", "--profile", "cpu", "--set", "runtime.timeout_s=.inf"], "runtime.timeout_s"),
        (["accept", "--profile", "cpu", "--set", "expect.gpu_count=" + "9" * 5000], "too large"),
        (["bench", "membw", "--output", str(tmp_path)], "is a directory"),
        (["accept", "--bogus"], "No such option: --bogus (see gpuval accept --help)"),
    ]:
        result = _child(args, tmp_path)
        assert_clean(result, {2}, args, tmp_path / "gpuval-results")
        assert fragment in result[2], (args, result[2])


def test_child_process_markup_in_a_node_name(tmp_path):
    # Markup a node name may hold (no blank, ':', '/' or '+'): the run gives its verdict and shows it as text.
    out = tmp_path / "out"
    code, stdout, stderr = _child(["health", "--profile", "cpu", "--output", str(out)], tmp_path,
                                  GPUVAL_NODE_NAME="[bold]x[red]")  # fmt: skip
    assert "Traceback" not in stdout + stderr and "MarkupError" not in stderr, stderr
    assert code in (0, 1), stderr  # its verdict, not a crash
    assert "[bold]x[red]" in stdout
    # A closing tag holds '/', which no node name can (it would split the scope gpu:NODE/INDEX apart):
    # refused at the gate in one line naming the variable, before anything is written.
    refused = tmp_path / "out2"
    code, stdout, stderr = _child(["health", "--profile", "cpu", "--output", str(refused)], tmp_path,
                                  GPUVAL_NODE_NAME="[/]")  # fmt: skip
    assert "Traceback" not in stdout + stderr and "MarkupError" not in stderr, stderr
    assert code == 2 and "GPUVAL_NODE_NAME '[/]': a node name holds no blank" in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1 and not refused.exists()


def test_case_count():
    """>= 1,000 generated cases per run (when the fuzz tests above ran in this session)."""
    total = sum(COUNTS.values())
    if total == 0:
        pytest.skip("the fuzz tests were not run in this session")
    print(f"fuzz cases: {total} {COUNTS}")
    assert total >= 1000 * min(SCALE, 1) or len(COUNTS) < 7, COUNTS


# --- each guarantee once, by name (docs/guarantees.md's table points here) ----------------------------------


@pytest.mark.parametrize(
    ("assignment", "fragment"),
    [
        ("checks.matmul.fp32_tflops.min=.nan", "finite number"),
        ("runtime.timeout_s=.inf", "finite number"),
        ("checks.membw.read_tbps.level=warn", "give min or max"),
        ("benchmarks.collectives.extra_sizes=abc", "extra_sizes"),
        ("checks.all_reduce.busbw_gbps.bytes=.inf", "not a byte size"),
        ("expect.gpu_count=" + "9" * 5000, "integer of 5000 digits is too large"),
    ],
)
def test_refused_values(assignment, fragment, tmp_path, stub_work):
    out = tmp_path / "out"
    result = invoke(["accept", "--profile", "cpu", "--set", assignment, "--output", str(out)], tmp_path)
    assert_clean(result, {2}, assignment, out)
    assert fragment in result[2], result[2]


def test_finetune_lr_inf_is_refused(tmp_path, stub_work):
    config = tmp_path / "ft.yaml"
    config.write_text(_dump_yaml(BASE_CONFIG))
    result = invoke(["finetune", "train", "--config", str(config), "--set", "train.optim.lr=.inf"], tmp_path)
    assert_clean(result, {2}, "train.optim.lr=.inf")
    assert "train.optim.lr" in result[2]


@pytest.mark.parametrize("schema", ["gpuval.result/v2", "gpuval.result/v0", "something/else", None])
def test_report_and_compare_refuse_another_schema(schema, tmp_path, stub_work):
    document = dict(BASE_RESULT)
    if schema is None:
        del document["schema"]
    else:
        document["schema"] = schema
    other, good = tmp_path / "other.json", tmp_path / "good.json"
    other.write_text(json.dumps(document))
    good.write_text(json.dumps(BASE_RESULT))
    for args in (
        ["report", str(other), "--output", str(tmp_path / "r.html")],
        ["compare", str(good), str(other)],
    ):
        result = invoke(args, tmp_path)
        assert_clean(result, {2}, args, tmp_path / "r.html")
        assert "expected gpuval.result/v1" in result[2], result[2]


def test_a_result_past_its_size_limit_is_refused_before_it_is_read(tmp_path, stub_work):
    """A result file is read up to results.MAX_RESULT_BYTES (a 1,000-node result is ~164 MiB, past the
    64 MiB of other inputs): one byte more is refused by its size alone (a sparse file: nothing read)."""
    from gpuval.results import MAX_RESULT_BYTES

    huge, good = tmp_path / "huge.json", tmp_path / "good.json"
    good.write_text(json.dumps(BASE_RESULT))
    with huge.open("wb") as handle:
        handle.truncate(MAX_RESULT_BYTES + 1)
    for args in (
        ["report", str(huge), "--output", str(tmp_path / "r.html")],
        ["compare", str(good), str(huge)],
    ):
        result = invoke(args, tmp_path)
        assert_clean(result, {2}, args, tmp_path / "r.html")
        assert f"{MAX_RESULT_BYTES + 1} bytes is more than the {MAX_RESULT_BYTES} allowed" in result[2]


@pytest.mark.parametrize("change", ["lost", "error"])
def test_compare_fails_when_the_later_run_lost_measurements_or_is_error(change, tmp_path, stub_work):
    later = json.loads(json.dumps(BASE_RESULT))
    if change == "lost":
        later["measurements"] = later["measurements"][:1]
    else:
        later["verdict"] = "ERROR"
    before, after = tmp_path / "a.json", tmp_path / "b.json"
    before.write_text(json.dumps(BASE_RESULT))
    after.write_text(json.dumps(later))
    result = invoke(["compare", str(before), str(after), "--fail-on-regression", "5"], tmp_path)
    assert_clean(result, {1}, change)
    assert result[2].count("\n") == 1 and result[2].startswith("gpuval: "), result[2]
    assert invoke(["compare", str(before), str(after)], tmp_path)[0] == 0  # without the flag: a table


def test_report_renders_odd_but_valid_content(tmp_path, stub_work):
    document = json.loads(json.dumps(BASE_RESULT))
    document["inventory"] = {"nodes": ["x", {"gpus": "many", "software": 3}]}
    document["measurements"][1]["metrics"]["copy_tbps"] = -5.0
    document["measurements"][2]["params"] = {"src": "a", "dst": -1}
    document["checks"][0]["threshold"] = {"min": "1", "bytes": "big"}
    document["settings"] = {"profile": {"checks": {"all_reduce.busbw_gbps": "fast"}}}
    source, page = tmp_path / "result.json", tmp_path / "page.html"
    source.write_text(json.dumps(document))
    assert_clean(invoke(["report", str(source), "--output", str(page)], tmp_path), {0}, document)
    assert page.read_text().startswith("<!DOCTYPE html>")


def test_rich_markup_in_names_is_printed_as_text():
    from rich.console import Console

    from gpuval.report.console import print_result
    from gpuval.results import Result

    result = Result.model_validate({**BASE_RESULT, "profile": "[/]"})
    console = Console(file=io.StringIO(), width=200)
    print_result(result, console, title="gpuval health · [/] · profile [/]")
    text = console.file.getvalue()
    assert "profile [/]" in text and "[/] one GPU missing" in text


def test_usage_errors_of_click_are_one_line(tmp_path, stub_work):
    for args, line in [
        (["accept", "--bogus"], "gpuval: No such option: --bogus (see gpuval accept --help)"),
        (["compare", "a.json"], "gpuval: Missing argument 'AFTER' (see gpuval compare --help)"),
        (["no-such-command"], "gpuval: No such command 'no-such-command' (see gpuval --help)"),
    ]:
        result = invoke(args, tmp_path)
        assert_clean(result, {2}, args)
        assert result[2].strip() == line


def test_a_profile_of_nested_aliases_is_refused_before_it_expands(tmp_path, stub_work):
    """Nine levels of nine aliases are nine lines and 9^9 values once followed ("billion laughs"):
    refused in one line and at once, while an ordinary alias still works."""
    import time

    levels = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("name: bomb\nbenchmarks:\n  matmul:\n    " + "\n    ".join(levels) + "\n")
    began = time.monotonic()
    result = invoke(["accept", "--profile", str(bomb), "--output", str(tmp_path / "out")], tmp_path)
    assert_clean(result, {2}, "alias bomb", tmp_path / "out")
    assert "expands to more than 100,000 values" in result[2] and time.monotonic() - began < 10

    plain = tmp_path / "plain.yaml"
    plain.write_text(
        "name: plain\nchecks:\n  matmul.fp32_tflops: &floor {min: 0.001}\n  matmul.bf16_tflops: *floor\n"
    )
    assert invoke(["accept", "--profile", str(plain), "--output", str(tmp_path / "ok")], tmp_path)[0] == 0


# --- nesting past Python's recursion limit, control characters in a value: each once, by name -------------

DEEP = 100_000  # levels: far past the recursion limit of json's and PyYAML's parsers


@pytest.mark.parametrize(
    "where",
    ["call-arguments", "tool-schema", "dataset-line", "dataset-list", "result", "profile", "finetune-config"],
)
def test_nesting_past_the_recursion_limit_is_refused_naming_the_file(where, tmp_path, stub_work):
    deep_list = "[" * DEEP + "]" * DEEP
    records = {
        "call-arguments": {"system": GOOD_RECORD["system"],
                           "chat": f"USER: hi\n\nASSISTANT: <functioncall> {deep_list} <|endoftext|>"},
        "tool-schema": {"system": GOOD_RECORD["system"] + " " + '{"a": ' * DEEP + "1" + "}" * DEEP,
                        "chat": GOOD_RECORD["chat"]},
    }  # fmt: skip
    if where in records:
        source = tmp_path / "in.jsonl"
        source.write_text(json.dumps(records[where]) + "\n")
        args = ["finetune", "prepare", "--input", str(source), "--output", str(tmp_path / "out")]
        fragment = "line 1: nested too deeply for the parser"
    elif where in ("dataset-line", "dataset-list"):
        source = tmp_path / "in.jsonl"
        source.write_text(deep_list + "\n" if where == "dataset-line" else "[" + deep_list + "]")
        args = ["finetune", "prepare", "--input", str(source), "--output", str(tmp_path / "out")]
        fragment = "nested"
    elif where == "result":
        source = tmp_path / "result.json"
        source.write_text('{"schema": "gpuval.result/v1", "x": ' + deep_list + "}")
        args = ["report", str(source), "--output", str(tmp_path / "out")]
        fragment = "nested more than 64 levels deep"
    else:
        source = tmp_path / "in.yaml"
        source.write_text("name: deep\nbenchmarks: " + "{a: " * DEEP + "1" + "}" * DEEP + "\n")
        args = (
            ["accept", "--profile", str(source), "--output", str(tmp_path / "out")]
            if where == "profile"
            else ["finetune", "train", "--config", str(source)]
        )
        fragment = "nested more than 64 levels deep"
    result = invoke(args, tmp_path)
    assert_clean(result, {2}, where, tmp_path / "out")
    assert str(source) in result[2] and fragment in result[2], result[2]


@pytest.mark.parametrize(
    ("profile_text", "fragment"),
    [
        ('name: x\nhealth: {skip: ["a\\nb"]}\n', "unknown health check 'a\\nb'"),
        ('name: x\nhealth: {skip: ["\\e[2J\\r"]}\n', "unknown health check '\\x1b[2J\\r'"),
        ('name: x\nhealth: {skip: ["a\\Lb"]}\n', "unknown health check 'a\\u2028b'"),  # YAML's \L: U+2028
        ('name: x\n"x\\ny": 1\n', "unknown key 'x\\ny'"),
        ('name: x\nchecks: {"a\\nb.c": {min: 1}}\n', "'a\\nb.c' must look like"),
    ],
)
def test_control_characters_in_a_profile_are_echoed_escaped_on_one_line(
    profile_text, fragment, tmp_path, stub_work
):
    profile = tmp_path / "p.yaml"
    profile.write_text(profile_text)
    result = invoke(["accept", "--profile", str(profile), "--output", str(tmp_path / "out")], tmp_path)
    assert_clean(result, {2}, profile_text, tmp_path / "out")
    assert fragment in result[2], result[2]


def test_an_option_value_with_a_newline_is_echoed_escaped(tmp_path, stub_work):
    for args, fragment in [
        (["accept", "--profile", "cpu\nx"], "unknown profile 'cpu\\nx'"),
        (["bench", "nosuch\nx"], "unknown benchmark 'nosuch\\nx'"),
    ]:
        result = invoke(args, tmp_path)
        assert_clean(result, {2}, args, tmp_path / "gpuval-results")
        assert fragment in result[2], result[2]


@pytest.mark.parametrize(
    ("raised", "fragment"),
    [
        (
            OSError(36, "File name too long", "/x/" + "n" * 300),
            "the name is longer than the file system allows",
        ),
        (RecursionError("maximum recursion depth exceeded"), "nested deeper than Python's parser can follow"),
    ],
)
def test_the_net_under_every_gate_turns_a_long_name_or_deep_nesting_into_one_line(
    raised, fragment, tmp_path, stub_work, monkeypatch
):
    """Should a check of a path or a parser without its own gate meet either, main() still says one line."""
    import errno

    assert errno.ENAMETOOLONG == 36

    def fails(*args, **kwargs):
        raise raised

    monkeypatch.setattr(launch, "run_distributed", fails)
    result = invoke(["accept", "--profile", "cpu", "--output", str(tmp_path / "out")], tmp_path)
    assert_clean(result, {2}, raised)
    assert fragment in result[2], result[2]

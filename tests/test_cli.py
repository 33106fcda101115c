"""The CLI on bad input, as a user meets it: exit 2, one 'gpuval: ...' line, no traceback, no result files.

Every case here is rejected before any rank starts, so each child process lives well under a second or two.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gpuval.results import json_schema


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out"


def _no_results(out: Path) -> None:
    assert not (out / "result.json").exists()
    assert not (out / "junit.xml").exists()


def test_broken_yaml_profile(gpuval, assert_usage_error, write_profile, tmp_path, out):
    path = write_profile("name: x\nexpect:\n  gpu_count: 8: 9\n", "broken.yaml")
    proc = gpuval(["accept", "--profile", str(path), "--output", str(out), "--nproc", "1"], tmp_path)
    line = assert_usage_error(proc, "broken YAML at line 3, column 15", str(path))
    assert proc.stdout == ""
    assert line.count("gpuval:") == 1
    _no_results(out)


def test_unknown_key_in_profile(gpuval, assert_usage_error, write_profile, tmp_path, out):
    path = write_profile("name: x\nexpect:\n  gpu_cout: 8\n")
    proc = gpuval(["accept", "--profile", str(path), "--output", str(out), "--nproc", "1"], tmp_path)
    assert_usage_error(proc, "unknown key 'expect.gpu_cout'", "did you mean 'gpu_count'")
    assert proc.stdout == ""
    _no_results(out)


def test_unknown_key_in_a_check_threshold(gpuval, assert_usage_error, write_profile, tmp_path, out):
    path = write_profile("name: x\nchecks:\n  matmul.bf16_tflops: {mni: 700}\n")
    proc = gpuval(["accept", "--profile", str(path), "--output", str(out), "--nproc", "1"], tmp_path)
    assert_usage_error(proc, "unknown key 'checks.matmul.bf16_tflops.mni'", "did you mean 'min'")
    _no_results(out)


def test_unknown_benchmark_name(gpuval, assert_usage_error, tmp_path):
    proc = gpuval(["bench", "matmull", "--nproc", "1"], tmp_path)
    assert_usage_error(
        proc, "unknown benchmark 'matmull'", "did you mean 'matmul'", "collectives, matmul, membw"
    )
    assert proc.stdout == ""


def test_unknown_benchmark_name_with_default_nproc(gpuval, assert_usage_error, tmp_path):
    proc = gpuval(["bench", "matmull"], tmp_path)
    assert_usage_error(proc, "did you mean 'matmul'")


def test_missing_profile_file(gpuval, assert_usage_error, tmp_path, out):
    missing = tmp_path / "missing.yaml"
    proc = gpuval(["accept", "--profile", str(missing), "--output", str(out), "--nproc", "1"], tmp_path)
    assert_usage_error(proc, str(missing), "does not exist")
    _no_results(out)


def test_unknown_profile_name(gpuval, assert_usage_error, tmp_path, out):
    proc = gpuval(["accept", "--profile", "h200-sx", "--output", str(out), "--nproc", "1"], tmp_path)
    assert_usage_error(proc, "unknown profile 'h200-sx'", "did you mean 'h200-sxm'")
    _no_results(out)


def test_set_wrong_type(gpuval, assert_usage_error, tmp_path, out):
    proc = gpuval(
        ["accept", "--profile", "cpu", "--set", "expect.gpu_count=many", "--output", str(out)], tmp_path
    )
    assert_usage_error(proc, "'expect.gpu_count'", "'many'")
    _no_results(out)


@pytest.mark.slow
def test_set_wrong_type_with_detected_profile_and_default_nproc(gpuval, assert_usage_error, tmp_path, out):
    # no --profile: the CPU profile is picked; the parent rejects the value before it starts the ranks
    proc = gpuval(["accept", "--set", "expect.gpu_count=many", "--output", str(out)], tmp_path)
    assert_usage_error(proc, "'expect.gpu_count'")
    _no_results(out)


def test_set_unknown_key(gpuval, assert_usage_error, tmp_path, out):
    proc = gpuval(
        ["accept", "--profile", "cpu", "--set", "checks.matmul.fp32_tflops.mni=3", "--output", str(out)],
        tmp_path,
    )
    assert_usage_error(proc, "unknown key 'checks.matmul.fp32_tflops.mni'", "did you mean 'min'")
    _no_results(out)


def test_set_without_equals(gpuval, assert_usage_error, tmp_path, out):
    proc = gpuval(["accept", "--profile", "cpu", "--set", "expect.gpu_count", "--output", str(out)], tmp_path)
    assert_usage_error(proc, "key.path=value")
    _no_results(out)


@pytest.mark.slow
def test_check_on_something_nothing_measures(gpuval, assert_usage_error, write_profile, tmp_path, out):
    path = write_profile("name: x\nchecks:\n  warp_drive.speed_gbps: {min: 1}\n")
    proc = gpuval(["accept", "--profile", str(path), "--output", str(out), "--nproc", "1"], tmp_path)
    assert_usage_error(proc, "warp_drive.speed_gbps", "nothing measures 'warp_drive'")
    _no_results(out)


@pytest.mark.slow
def test_bench_option_of_wrong_type(gpuval, assert_usage_error, tmp_path):
    proc = gpuval(["bench", "matmul", "--set", "repeats=many", "--nproc", "1"], tmp_path)
    assert_usage_error(proc, "bench matmul", "'repeats'", "'many'")


# --- output that cannot be written (tests may run as root: a path under a regular file blocks even root) ---


@pytest.mark.parametrize("nproc", [["--nproc", "1"], []], ids=["one-rank", "default-ranks"])
@pytest.mark.slow
def test_accept_output_under_a_regular_file(gpuval, assert_usage_error, tmp_path, nproc):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    out = blocker / "results"
    proc = gpuval(["accept", "--quick", "--output", str(out), *nproc], tmp_path)
    assert_usage_error(proc, f"output directory '{out}' cannot be written", "--output")
    assert proc.stdout == ""
    assert blocker.read_text() == "not a directory"


def test_errors_with_json_flag_keep_stdout_empty(gpuval, assert_usage_error, tmp_path, out):
    proc = gpuval(["accept", "--json", "--profile", "cpuu", "--output", str(out), "--nproc", "1"], tmp_path)
    assert_usage_error(proc, "unknown profile 'cpuu'")
    assert proc.stdout == ""


def test_console_script_behaves_like_python_m(gpuval, assert_usage_error, tmp_path):
    script = Path(sys.executable).parent / "gpuval"
    if not script.exists():
        pytest.skip("no console script next to this interpreter")
    proc = gpuval(["bench", "matmull"], tmp_path, program=[str(script)])
    assert_usage_error(proc, "unknown benchmark 'matmull'", "did you mean 'matmul'")


# --- option parsing errors belong to click: still exit 2 and no traceback -------------------------


@pytest.mark.parametrize("args", [["accept", "--nproc", "two"], ["accept", "--bogus"], ["no-such-command"]])
def test_option_parsing_errors_exit_2(gpuval, tmp_path, args):
    proc = gpuval(args, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "gpuval-results").exists()


# --- the informational commands -------------------------------------------------------------------


def test_schema_command_prints_the_shipped_schema(gpuval, tmp_path):
    proc = gpuval(["schema"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json_schema()


def test_schema_bench_prints_the_shipped_bench_schema(gpuval, tmp_path):
    proc = gpuval(["schema", "bench"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json_schema("bench")
    assert json.loads(proc.stdout)["$id"] == "gpuval.bench/v1"


def test_help_lists_every_command_group(gpuval, tmp_path):
    """One module per group under gpuval/cli/: each still registers its commands on the one app."""
    from conftest import cli_env

    proc = gpuval(["--help"], tmp_path, env=cli_env(COLUMNS="250"))
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("│ ") and line[2:3] != " "]
    listed = [line.strip("│ ").split()[0] for line in rows]  # a help text's wrapped lines start blank
    assert [name for name in listed if name not in ("--help", "--version")] == [
        "accept", "bench", "discover", "health", "monitor", "report", "compare", "fleet", "history",
        "schema", "profiles", "finetune",
    ], proc.stdout  # fmt: skip
    proc = gpuval(["profiles", "--help"], tmp_path, env=cli_env(COLUMNS="250"))
    assert "│ derive " in proc.stdout, proc.stdout
    proc = gpuval(["finetune", "--help"], tmp_path, env=cli_env(COLUMNS="250"))
    for name in ("synth", "prepare", "train", "eval", "run"):
        assert f"│ {name} " in proc.stdout, proc.stdout


def test_version_prints_the_installed_packages_version(gpuval, tmp_path):
    from importlib.metadata import version

    proc = gpuval(["--version"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"gpuval {version('gpuval')}"


@pytest.mark.parametrize(
    ("args", "code", "status"),
    [
        # accept's path for an option and the short form, side by side
        (
            ["collectives", "--set", "benchmarks.collectives.max_bytes=65536", "--set", "ops=[all_reduce]"],
            0,
            "OK",
        ),
        (["p2p", "--nproc", "1"], 3, "SKIP"),  # no GPU here: the document still says why
    ],
    ids=["ran", "skipped"],
)
@pytest.mark.slow
def test_bench_output_validates_against_the_bench_schema(gpuval, tmp_path, args, code, status):
    import jsonschema

    from gpuval.results import BenchDocument

    out = tmp_path / "bench.json"
    proc = gpuval(["bench", *args, "--quick", "--output", str(out)], tmp_path)
    assert proc.returncode == code, proc.stdout + proc.stderr
    document = json.loads(out.read_text(encoding="utf-8"))
    jsonschema.validate(document, json_schema("bench"))
    assert document["schema"] == "gpuval.bench/v1" and document["status"] == status
    # the fields and their order are those of the untyped document earlier versions wrote
    assert list(document) == [
        "schema", "benchmark", "started_at", "duration_s", "world", "status", "detail", "options",
        "command", "inventory", "measurements",
    ]  # fmt: skip
    assert BenchDocument.model_validate(document).benchmark == args[0]
    assert bool(document["measurements"]) == (status == "OK")
    if status == "OK":
        assert document["options"]["max_bytes"] == 65536 and document["options"]["ops"] == ["all_reduce"]


def test_bench_refuses_another_benchmarks_accept_path(gpuval, assert_usage_error, tmp_path):
    proc = gpuval(["bench", "matmul", "--set", "benchmarks.membw.device_bytes=1024"], tmp_path)
    assert_usage_error(proc, "this runs benchmark 'matmul'", "benchmarks.matmul.KEY=VALUE")


def test_profiles_command_lists_the_builtins(gpuval, tmp_path):
    proc = gpuval(["profiles"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in ("cpu", "h100-sxm", "h200-sxm"):
        assert f"{name}:" in proc.stdout


def test_bench_without_a_name_lists_benchmarks(gpuval, tmp_path):
    proc = gpuval(["bench"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in ("collectives", "matmul", "membw", "p2p"):
        assert f"{name}:" in proc.stdout


@pytest.mark.parametrize(
    ("command", "stated"),
    [
        (["accept"], "2 on a machine without NVIDIA GPUs"),
        (["bench"], "2 on a machine without NVIDIA GPUs"),
        (["finetune", "train"], "1 on a CPU"),
    ],
)
def test_nproc_help_states_the_default_each_command_uses(gpuval, tmp_path, command, stated):
    """accept and bench start 2 gloo ranks on a machine without GPUs, the fine-tune 1: each --help says
    its own (a second option of the same name once gave every command the fine-tune's text)."""
    from conftest import cli_env

    proc = gpuval([*command, "--help"], tmp_path, env=cli_env(COLUMNS="250"))
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.replace("│", " ").split())
    assert stated in text, text
    if command != ["finetune", "train"]:
        from gpuval.launch import default_nproc

        assert default_nproc() == 2  # what the help states, on this machine without NVIDIA GPUs


def _commands(group, path=()):
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # a group (typer may carry its own copy of click)
            yield from _commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def test_output_means_a_folder_or_a_file_and_every_help_says_which():
    """One meaning per kind of thing written: DIR where a command writes several files, FILE where it
    writes one document; the help of every command that takes --output names which."""
    import typer.main

    from gpuval.cli import app

    kinds = {}
    for name, command in _commands(typer.main.get_command(app)):
        for param in command.params:
            if "--output" in getattr(param, "opts", ()):
                assert param.metavar in ("DIR", "FILE"), (name, param.metavar)
                said = "folder to write" if param.metavar == "DIR" else "file to write"
                assert param.help.startswith(said), (name, param.help)
                kinds[name] = param.metavar
    assert kinds == {
        "accept": "DIR", "health": "DIR", "fleet": "DIR", "finetune prepare": "DIR", "finetune run": "DIR",
        "bench": "FILE", "discover": "FILE", "report": "FILE", "finetune synth": "FILE",
        "profiles derive": "FILE", "profiles table": "FILE",
    }  # fmt: skip


def _every_command(group, path=()):
    """Every group and command of the app, with its path ('' for the app itself)."""
    yield " ".join(path), group
    for name, command in getattr(group, "commands", {}).items():
        yield from _every_command(command, (*path, name))


def _help_at_80_columns(path: str) -> str:
    from typer.testing import CliRunner

    from gpuval.cli import app

    result = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.output


def test_every_help_at_80_columns_shows_what_goes_where_and_cuts_nothing():
    """A flag shows no metavar (typer's rich help printed `--json <bool>`, `--help <bool>`); a value shows
    one that says what goes there (NAME|FILE, KEY=VALUE, N), never typer's type (`<str>`, `<list[str]>`);
    and at 80 columns no word is cut (`~/.local/share/gpuval/history.sq…`) and no line is longer."""
    import re

    import typer.main

    from gpuval.cli import app

    for path, command in _every_command(typer.main.get_command(app)):
        text = _help_at_80_columns(path)
        assert "…" not in text, (path, text)
        assert all(len(line) <= 80 for line in text.splitlines()), (path, text)
        assert not re.search(r"<(bool|str|int|float|path|list|Path)\b", text), (path, text)
        for param in [*command.params, command.get_help_option(typer.Context(command))]:
            if getattr(param, "is_flag", False):
                assert param.metavar == "", (path, param.name)
                continue
            assert param.metavar, (path, param.name)
            choices = getattr(getattr(param, "type_descriptor", None), "choices", None) or getattr(
                getattr(param, "type", None), "choices", None
            )
            if choices and param.param_type_name == "option":  # the choices, as typed, or the help's
                named = param.metavar == "|".join(choices) or all(c in param.help for c in choices)
                assert named, (path, param.name, param.metavar)
            elif param.param_type_name == "option":
                assert re.fullmatch(r"[A-Z\[\]:=|]+|FILE\|none", param.metavar), (path, param.metavar)


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("accept", ["default: gpuval-results/accept-<UTC time>", "~/.local/share/gpuval/history.sqlite"]),
        ("health", ["default: gpuval-results/health-<UTC time>"]),
        ("history", ["~/.local/share/gpuval/history.sqlite"]),
        ("report", ["default: report.html beside RESULT"]),
    ],
)
def test_defaults_are_stated_whole_at_80_columns(command, said):
    """Where a command writes and reads when not told is stated, and a path is never split or cut."""
    text = _help_at_80_columns(command)
    prose = " ".join(text.replace("│", " ").split())
    for words in said:
        assert words in prose, (command, text)
    assert "~/.local/share/gpuval/history.sqlite" in text or command not in ("accept", "history")


def test_profiles_help_lists_the_list_that_profiles_alone_runs(gpuval, tmp_path):
    """`gpuval profiles` lists the profiles: its help says so, as the `list` command it runs."""
    text = _help_at_80_columns("profiles")
    assert "│ list " in text and "[COMMAND]" in text, text
    alone, listed = gpuval(["profiles"], tmp_path), gpuval(["profiles", "list"], tmp_path)
    assert alone.returncode == listed.returncode == 0, alone.stderr + listed.stderr
    assert alone.stdout == listed.stdout and "cpu:" in listed.stdout


@pytest.fixture
def accept_stderr(monkeypatch, tmp_path):
    """`gpuval accept --profile cpu --quick --nproc 2` in this process, its ranks never started: (the
    CliRunner result, what stderr said when the ranks would have started, all stderr said)."""
    import io

    from conftest import is_launcher_variable
    from rich.console import Console
    from typer.testing import CliRunner

    from gpuval import launch
    from gpuval.cli import app, options

    for name in [name for name in os.environ if is_launcher_variable(name)]:
        monkeypatch.delenv(name)
    said = io.StringIO()
    monkeypatch.setattr(options, "err_console", Console(file=said, width=200, color_system=None))
    before_ranks: list[str] = []
    monkeypatch.setattr(launch, "launch_local", lambda *a, **k: before_ranks.append(said.getvalue()) or 0)

    def run():
        args = ["accept", "--profile", "cpu", "--quick", "--nproc", "2", "--history", "none"]
        result = CliRunner().invoke(app, [*args, "--output", str(tmp_path / "out")])
        return result, before_ranks, said.getvalue()

    return run


def test_accept_says_what_it_starts_before_its_ranks_start(accept_stderr):
    """The screen stayed blank for the seconds the ranks take to start (torch's import, the process
    group): the process the user started now says profile, ranks, backend and benchmarks first."""
    result, before_ranks, _ = accept_stderr()
    assert result.exit_code == 0, result.output
    assert before_ranks == [
        "gpuval accept: profile cpu, 2 ranks, gloo, benchmarks: collectives, matmul, membw, train\n"
    ]


def test_a_refusal_of_the_launcher_is_still_its_one_line_without_the_header(accept_stderr, monkeypatch):
    """The header comes once nothing can refuse the run any more: a refusal stays one `gpuval:` line."""
    from gpuval import launch
    from gpuval.errors import UsageError

    def refused(ranks):
        raise UsageError(f"--nproc {ranks} asks for more ranks than the 1 GPU(s) visible here")

    monkeypatch.setattr(launch, "check_gpus_for", refused)
    result, before_ranks, said = accept_stderr()
    assert isinstance(result.exception, UsageError) and before_ranks == [] and said == ""


def test_a_path_in_the_home_folder_is_said_from_the_tilde(tmp_path):
    from gpuval.cli.options import home_short

    assert (
        home_short(Path.home() / ".local/share/gpuval/history.sqlite")
        == "~/.local/share/gpuval/history.sqlite"
    )
    outside = Path("/nonexistent-root-folder/history.sqlite")
    assert home_short(outside) == str(outside)


def test_bench_lists_every_option_with_what_it_does_at_80_columns(gpuval, tmp_path):
    """`gpuval bench` (which bench's help points to) at 80 columns: an option a row, its description
    wrapped under its own column, and none without one (`--set ops=…` and five others said nothing)."""
    from gpuval.bench.registry import all_benchmarks
    from gpuval.cli.bench import _option_lines

    proc = gpuval(["bench"], tmp_path)  # cli_env: an 80-column terminal
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in proc.stdout, proc.stdout
    for benchmark in all_benchmarks().values():
        section = lines[next(i for i, line in enumerate(lines) if line.startswith(f"{benchmark.name}: ")) :]
        for field, description in _option_lines(benchmark.options):
            assert description, f"{benchmark.name}: option {field} says nothing"
            row = next(line for line in section if line.startswith(f"  {field} "))
            assert description.split()[0] in row, (field, row)


@pytest.mark.parametrize(
    "args",
    [
        ["accept", "--quick"],
        ["accept", "--quick", "--nproc", "2"],
        ["bench", "matmul"],
        ["health"],
    ],
    ids=["accept", "accept-2-ranks", "bench", "health"],
)
def test_a_refusal_on_a_cpu_build_of_torch_never_imports_torch(args, tmp_path):
    """torch's import takes 2-3 s of a small machine's CPU: a command refused for bad input says so before
    anything imports it where torch is a CPU build (which sees no GPU without being asked)."""
    from conftest import cli_imports_torch

    from gpuval.discover.gpus import cpu_build_of_torch

    if not cpu_build_of_torch():
        pytest.skip("a CUDA build of torch: whether CUDA can use a GPU is torch's to say")
    (tmp_path / "file").write_text("", encoding="utf-8")
    refused = [*args, "--history", str(tmp_path / "file" / "history.sqlite")]
    if args[0] != "accept":
        refused = [*args, "--output", str(tmp_path / "file" / "out")]
    code, stderr, imported = cli_imports_torch(refused, tmp_path)
    assert stderr.startswith("gpuval: "), stderr
    assert (code, imported) == (2, False), stderr

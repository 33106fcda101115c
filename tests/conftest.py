"""Shared fixtures: running the `gpuval` CLI as a user would (a child process), and small profiles.

Every CLI test runs in a clean environment: no launcher variables (RANK, SLURM_*, ...) leak in from
the test runner, no GPU is visible (CPU-only tests behave the same on a GPU machine), and the terminal
is 80 columns wide, as in most CI logs, so messages that wrap are caught.

Tiers (markers registered in pyproject.toml, `--strict-markers` makes a mistyped one an error):

    pytest                   everything (the README's command, .ci/run); 8 to 12 minutes on 2 cores
    pytest -m "not slow"     the inner loop, <= 2 minutes on 2 cores: every module's formulas, verdicts,
                             parsing, configs and quick fuzzing, in-process or through quick CLI calls

`slow` takes more than about a second (trains a model, runs `gpuval accept`, starts many processes);
`dist` starts torchrun or several cooperating processes; `slurm` runs the real local Slurm
(test_slurm.py); `browser` opens headless Chromium (test_report.py). A `dist`, `slurm` or `browser` test
is `slow` as well (pytest_collection_modifyitems below), so a test is marked with what it does, once.
A whole module of one kind says so with `pytestmark = pytest.mark.dist`; a mixed module marks its tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest_plugins = ("pytester",)  # test_tiers.py runs pytest on small test files in-process

DIST = Path(__file__).parent / "dist"  # workers the tests start under torchrun
LAUNCHER_PREFIXES = ("SLURM_", "TORCHELASTIC_", "PMI_", "OMPI_")
LAUNCHER_VARIABLES = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GPUVAL_EXIT_DIR",
    "FORCE_COLOR",
    "TERMINAL_WIDTH",
    "COLUMNS",
    "LINES",
}


def is_launcher_variable(key: str) -> bool:
    """A variable a launcher or the test runner's terminal sets, which must not reach the code under test."""
    return key in LAUNCHER_VARIABLES or key.startswith(LAUNCHER_PREFIXES)


def cli_env(**extra: str) -> dict[str, str]:
    """os.environ without launcher variables, no GPU visible, an 80-column terminal, no history; then
    `extra`.

    Other test modules import it (`from conftest import cli_env`) for the child processes they start.
    """
    env = {key: value for key, value in os.environ.items() if not is_launcher_variable(key)}
    env.update({"CUDA_VISIBLE_DEVICES": "", "COLUMNS": "80", "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"})
    env["GPUVAL_HISTORY"] = "none"  # no test reads or grows the user's history unless it asks (test_history)
    env.update(extra)
    return env


def run_dist_worker(worker: str, *args: str, nproc: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    """tests/dist/WORKER with ARGS under `torchrun --standalone` as NPROC gloo ranks; asserts exit 0."""
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run(
        [str(torchrun), "--standalone", f"--nproc_per_node={nproc}", str(DIST / worker), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(OMP_NUM_THREADS="1"),
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


ALSO_SLOW = ("dist", "slurm", "browser")  # markers that imply `slow`


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked dist, slurm or browser is slow too, so `-m "not slow"` leaves it out."""
    for item in items:
        if item.get_closest_marker("slow") is None and any(item.get_closest_marker(m) for m in ALSO_SLOW):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def no_launcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every launcher variable from os.environ for this test (restored afterwards)."""
    for key in list(os.environ):
        if is_launcher_variable(key):
            monkeypatch.delenv(key)


def run_cli(
    args: list[str],
    cwd: Path,
    timeout: float = 120,
    program: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`gpuval ARGS` in a child process; `python -m gpuval` unless `program` names another way to start it.

    The environment is `cli_env()` unless `env` is given.
    """
    command = program or [sys.executable, "-m", "gpuval"]
    return subprocess.run(
        [*command, *args],
        cwd=cwd,
        env=cli_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def gpuval() -> Callable[..., subprocess.CompletedProcess[str]]:
    """gpuval(args, cwd) -> CompletedProcess; session-scoped so module-scoped fixtures can use it."""
    return run_cli


@pytest.fixture
def write_profile(tmp_path: Path) -> Callable[[str, str], Path]:
    """write_profile(text, filename='profile.yaml') -> path of a profile YAML in the test's tmp dir."""

    def write(text: str, filename: str = "profile.yaml") -> Path:
        path = tmp_path / filename
        path.write_text(text, encoding="utf-8")
        return path

    return write


def _assert_usage_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit 2, a short 'gpuval: ...' message on stderr holding every fragment, and no traceback.

    Returns the message line. The fragments must sit on the first line: a message wrapped over several
    lines cannot be grepped out of a CI log.
    """
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    assert proc.returncode == 2, f"exit {proc.returncode}, expected 2 (usage error)\n{output}"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 2, f"expected a one or two line message, got:\n{proc.stderr}"
    assert lines[0].startswith("gpuval: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in the message line {lines[0]!r}"
    return lines[0]


@pytest.fixture(scope="session")
def assert_usage_error() -> Callable[..., str]:
    """assert_usage_error(proc, *fragments): see _assert_usage_error."""
    return _assert_usage_error


def cpu_rowwise_scaled_mm() -> bool:
    """Whether this torch multiplies float8 with row-wise scales on the CPU (`torch._scaled_mm`, from 2.12;
    2.11's CPU kernel takes one scale per tensor). The FP8 layer's CPU tests need it; on a GPU the layer
    uses CUDA's kernel, which has had row-wise scales since before 2.11 (docs/torch-versions.md)."""
    import torch

    if not hasattr(torch, "float8_e4m3fn"):
        return False
    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(
            a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16
        )
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return True


NEEDS_CPU_ROWWISE_FP8 = "this torch's CPU _scaled_mm takes per-tensor scales only (row-wise from torch 2.12)"

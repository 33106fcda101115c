"""The supported torch range is one fact, said in five places that must agree: src/gpuval/versions.py,
pyproject's requirement, the README's "Supported versions" line, what .ci/run installs and runs, and the
torch the image pins (issue 34: pyproject admitted torch 2.4 while every multi-rank run crashed on 2.11)."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

from gpuval.versions import TORCH_BELOW, TORCH_CI, TORCH_LOWEST, parse, supported_torch

REPO = Path(__file__).resolve().parents[1]


def _dotted(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def test_pyproject_requires_the_supported_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (torch,) = [req for req in project["dependencies"] if re.match(r"torch\b", req)]
    assert torch == f"torch>={_dotted(TORCH_LOWEST)},<{_dotted(TORCH_BELOW)}"


def test_the_readme_states_the_range_ci_enforces() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    (line,) = [line for line in text.splitlines() if line.startswith("**Supported versions:**")]
    last = (TORCH_BELOW[0], TORCH_BELOW[1] - 1)
    assert f"torch {_dotted(TORCH_LOWEST)} to {_dotted(last)}" in line
    for version in TORCH_CI:
        assert version in line


def _locked(name: str) -> dict[str, str]:
    """The packages of one of CI's lock files (.ci/locks/NAME.txt), lower-case name -> version."""
    text = (REPO / ".ci" / "locks" / f"{name}.txt").read_text(encoding="utf-8")
    pins = [line.split("==", 1) for line in text.splitlines() if line and not line.startswith("#")]
    assert all(len(pin) == 2 for pin in pins), f"{name}.txt: every line NAME==VERSION"
    return {package.lower(): version for package, version in pins}


def test_ci_runs_the_suite_on_one_end_and_what_can_differ_between_releases_on_the_lowest() -> None:
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    lock = (REPO / ".ci" / "lock").read_text(encoding="utf-8")
    dockerfile = (REPO / "deploy" / "docker" / "Dockerfile").read_text(encoding="utf-8")
    (pinned,) = re.findall(r"^ARG TORCH_VERSION=(\S+)$", dockerfile, re.M)
    assert parse(pinned) == TORCH_LOWEST and pinned in TORCH_CI  # the image runs the lowest, tested
    # what the venvs are made of (.ci/lock's recipes) and what they hold (the locks .ci/run installs)
    assert "install -q torch==2.13.0" in lock and "2.13.0" in TORCH_CI
    assert _locked("main")["torch"].split("+")[0] == "2.13.0"
    assert "sed -n 's/^ARG TORCH_VERSION=//p' deploy/docker/Dockerfile" in lock
    assert _locked("lowest")["torch"].split("+")[0] == pinned
    assert "install_lock .venv main" in ci and "install_lock .venv-lowest lowest" in ci
    assert ".venv-lowest/bin/python -m pytest -m" in ci
    assert re.search(r"^\.venv/bin/python -m pytest$", ci, re.M)
    for version in TORCH_CI:
        assert TORCH_LOWEST <= parse(version) < TORCH_BELOW


def test_the_lowest_venv_holds_the_lowest_releases_pyproject_declares() -> None:
    """pyproject's `>=` for the packages .ci/lower-bounds names are what the lowest venv's lock holds, so
    a bound raised or lowered in pyproject without a new lock fails here (issue 48: the bounds had never
    been installed anywhere)."""
    import subprocess
    import sys

    from packaging.version import Version

    bounds = subprocess.run(
        [sys.executable, str(REPO / ".ci" / "lower-bounds")], capture_output=True, text=True, check=True
    ).stdout.split()
    assert {b.split("==")[0] for b in bounds} >= {"numpy", "pydantic", "transformers", "peft", "datasets"}
    locked = _locked("lowest")
    for bound in bounds:
        name, version = bound.split("==")
        assert Version(locked[name.lower()]) == Version(version), (name, locked[name.lower()], version)
    main = _locked("main")
    assert "deepspeed" in main and "mkdocs" in main and "trl" in main  # every extra CI's suite uses
    assert "trl" not in locked  # the lowest venv takes `test`, not `dev` (TRL asks for a newer datasets)


def test_the_readme_runs_the_tests_as_ci_does_and_the_torch_version_modules_exist() -> None:
    """Every pytest command .ci/run runs is one the README gives (less -p no:cacheprovider, which keeps CI's
    second run from writing the first one's cache), and each module the lowest torch runs by name is there:
    a renamed one would silently leave that torch."""
    from conftest import TORCH_VERSION_MODULES

    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    ran = [
        line.strip().replace(" -p no:cacheprovider", "")
        for line in ci.splitlines()
        if re.match(r"\s*\.venv(-lowest)?/bin/python -m pytest\b", line)
    ]
    block = (REPO / "README.md").read_text(encoding="utf-8").split("```bash\n", 1)[1].split("```", 1)[0]
    given = [line.split("#")[0].strip() for line in block.splitlines() if " -m pytest" in line]
    assert len(ran) == 2 and set(ran) <= set(given), (ran, given)
    assert sorted(name for name in TORCH_VERSION_MODULES if not list((REPO / "tests").rglob(name))) == []


def test_each_test_the_lowest_torch_leaves_out_is_there() -> None:
    """A renamed test would silently come back to the lowest torch's run: each name still names one."""
    from conftest import NOT_ON_THE_LOWEST, TORCH_VERSION_MODULES, module_path

    for name in sorted(NOT_ON_THE_LOWEST):
        module, test = name.split("::")
        assert module in TORCH_VERSION_MODULES, name
        source = module_path(module).read_text(encoding="utf-8")
        assert re.search(rf"^def {re.escape(test.split('[')[0])}\(", source, re.M), name


def test_the_readme_setup_makes_the_venv_then_puts_ci_s_torch_in_it_as_the_cpu_build() -> None:
    """The setup once said to install torch "before the line above", the line that makes the venv, and the
    bare pin took a CUDA build wherever no CPU wheel lay on disk (issue 36): now the venv comes first, then
    the torch CI runs, from PyTorch's CPU index as pytorch.org writes it, then gpuval."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")  # continued lines joined
    (setup,) = [line for line in block.splitlines() if line.startswith("python3 -m venv .venv")]
    steps = [step.strip() for step in setup.split("#")[0].split("&&")]
    pinned = "torch==" + _locked("main")["torch"].split("+")[0]  # the CPU build's local tag left to the index
    assert steps[:3] == [
        "python3 -m venv .venv",
        f".venv/bin/pip install {pinned} --index-url https://download.pytorch.org/whl/cpu",
        ".venv/bin/pip install -e '.[dev,finetune]'",
    ]


def test_the_range_reads_as_people_write_it() -> None:
    assert supported_torch() == f"torch >= {_dotted(TORCH_LOWEST)}, < {_dotted(TORCH_BELOW)}"

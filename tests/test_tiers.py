"""The test tiers (tests/conftest.py): the markers are registered, a mistyped one is an error, and a dist,
slurm or browser test is slow as well, so `pytest -m "not slow"` leaves it out.

Each case runs pytest in-process (pytester) on a small test file, under this repository's pytest settings
(pyproject.toml) and conftest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

TESTS = Path(__file__).parent
PYPROJECT = TESTS.parent / "pyproject.toml"

TIERS = """
import pytest

def test_quick():
    pass

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.dist
def test_dist():
    pass

@pytest.mark.slurm
def test_slurm():
    pass

@pytest.mark.browser
def test_browser():
    pass
"""


def _pytest(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makeconftest((TESTS / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_inner=source)
    # -n 0: the inner run stays in this process (pyproject's addopts ask for parallel workers)
    settings = ["-c", str(PYPROJECT), "--rootdir", str(pytester.path), "-p", "no:cacheprovider", "-n", "0"]
    # hypothesis' plugin would import hypothesis afresh in every inner run (pytester restores sys.modules)
    return pytester.runpytest_inprocess(*settings, "-p", "no:hypothesispytest", *args, "test_inner.py")


def test_the_tier_markers_are_registered(pytestconfig):
    registered = {line.split(":", 1)[0].strip() for line in pytestconfig.getini("markers")}
    assert {"slow", "dist", "slurm", "browser"} <= registered


def test_a_mistyped_marker_is_a_collection_error(pytester):
    result = _pytest(pytester, "import pytest\n\n@pytest.mark.dsit\ndef test_x():\n    pass\n")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*'dsit' not found in `markers` configuration option*"])


def test_not_slow_leaves_out_dist_slurm_and_browser_tests(pytester):
    _pytest(pytester, TIERS, "-m", "not slow").assert_outcomes(passed=1, deselected=4)


@pytest.mark.parametrize("tier", ["slow", "dist", "slurm", "browser"])
def test_each_tier_selects_its_own_tests(pytester, tier):
    # slow takes the dist, slurm and browser tests too; each of those only itself
    expected = 4 if tier == "slow" else 1
    _pytest(pytester, TIERS, "-m", tier).assert_outcomes(passed=expected, deselected=5 - expected)


def test_a_module_level_mark_reaches_every_test(pytester):
    source = (
        "import pytest\npytestmark = pytest.mark.dist\ndef test_a():\n    pass\ndef test_b():\n    pass\n"
    )
    _pytest(pytester, source, "-m", "not slow").assert_outcomes(deselected=2)


SPANS = """
import json, os, time
import json
from pathlib import Path

import pytest


def _stay(name):
    began = time.time()
    time.sleep(0.4)
    Path(os.environ["GPUVAL_TEST_SPANS"], name).write_text(json.dumps([began, time.time()]))


@pytest.mark.serial
def test_alone():
    _stay("alone")


@pytest.mark.parametrize("n", range(6))
def test_beside(n):
    _stay(f"beside{n}")


@pytest.fixture(scope="module")
def made_for_the_module():
    return os.environ["PYTEST_XDIST_WORKER"]


@pytest.mark.parametrize("n", range(4))
def test_sharing(made_for_the_module, n):
    Path(os.environ["GPUVAL_TEST_SPANS"], f"sharing{n}").write_text(json.dumps(made_for_the_module))
"""


@pytest.mark.slow
def test_under_workers_a_serial_test_runs_alone_and_a_modules_fixture_is_made_once(
    pytester, monkeypatch, tmp_path
):
    monkeypatch.setenv("GPUVAL_TEST_SPANS", str(tmp_path))
    # the inner run's locks are its own: under a lock shared with this run (.ci/run's GPUVAL_TESTS_LOCKS),
    # its serial test would wait for this test, which holds that lock's shared side while it waits for it
    monkeypatch.delenv("GPUVAL_TESTS_LOCKS", raising=False)
    pytester.makeconftest((TESTS / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_inner=SPANS)
    settings = ["-c", str(PYPROJECT), "--rootdir", str(pytester.path), "-p", "no:cacheprovider"]
    result = pytester.runpytest_subprocess(*settings, "-p", "no:hypothesispytest", "-n", "3", "test_inner.py")
    result.assert_outcomes(passed=11)
    spans = {path.name: json.loads(path.read_text()) for path in tmp_path.iterdir()}
    # the tests of a module-scoped fixture run on one worker, so it is made once
    assert len({spans.pop(f"sharing{n}") for n in range(4)}) == 1
    alone = spans.pop("alone")
    assert [name for name, (start, end) in spans.items() if start < alone[1] and end > alone[0]] == []
    # the other tests did run side by side, so the workers were there to run beside the serial one
    ordered = sorted(spans.values())
    assert any(later[0] < earlier[1] for earlier, later in zip(ordered, ordered[1:], strict=False))


def test_the_inner_loop_runs_a_worker_per_core_and_the_full_run_four(monkeypatch):
    """pyproject's `-n auto`: tests/conftest.py's pytest_xdist_auto_num_workers."""
    from conftest import FULL_RUN_WORKERS, pytest_xdist_auto_num_workers

    def workers(markexpr: str, cores: int | None) -> int:
        monkeypatch.setattr("os.cpu_count", lambda: cores)
        return pytest_xdist_auto_num_workers(SimpleNamespace(getoption=lambda name: markexpr))

    assert FULL_RUN_WORKERS == 4
    assert [workers("", 2), workers("", 64), workers("dist or slurm", 2)] == [4, 4, 4]
    assert [workers("not slow", 2), workers("not slow", 1), workers("not slow", None)] == [2, 1, 1]
    assert workers("not slow and not browser", 64) == 4


BUSY = """
import json, os, time
from pathlib import Path

import pytest


@pytest.mark.parametrize("n", range(24))
def test_busy(n):
    began = time.time()
    time.sleep(1.0)
    Path(os.environ["GPUVAL_TEST_SPANS"], f"busy{n}").write_text(json.dumps([began, time.time()]))
"""

ALONE = """
import json, os, time
from pathlib import Path

import pytest


@pytest.mark.serial
def test_alone():
    began = time.time()
    time.sleep(0.4)
    Path(os.environ["GPUVAL_TEST_SPANS"], "alone").write_text(json.dumps([began, time.time()]))
"""


@pytest.mark.slow
def test_two_runs_that_name_one_lock_never_run_a_serial_test_beside_the_others_tests(pytester, tmp_path):
    """.ci/run's two torch versions at once (GPUVAL_TESTS_LOCKS): a serial test of the second run, started
    while the first run's tests are running, runs after they end and before its next ones start."""
    pytester.makeconftest((TESTS / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_busy=BUSY, test_alone=ALONE)
    settings = ["-c", str(PYPROJECT), "--rootdir", str(pytester.path), "-p", "no:cacheprovider"]

    def start(module: str, spans: Path) -> subprocess.Popen:
        spans.mkdir()
        env = {**os.environ, "GPUVAL_TESTS_LOCKS": str(tmp_path / "locks"), "GPUVAL_TEST_SPANS": str(spans)}
        args = [sys.executable, "-m", "pytest", *settings, "-p", "no:hypothesispytest", "-n", "2", module]
        return subprocess.Popen(
            args, cwd=pytester.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    busy = start("test_busy.py", tmp_path / "busy")
    deadline = time.monotonic() + 120
    while not any((tmp_path / "busy").iterdir()):  # its first tests have run: the others are running now
        assert time.monotonic() < deadline and busy.poll() is None, busy.communicate()[0].decode()[-3000:]
        time.sleep(0.05)
    alone = start("test_alone.py", tmp_path / "alone")
    for proc in (busy, alone):
        out = proc.communicate(timeout=180)[0].decode()
        assert proc.returncode == 0, out[-3000:]
    began, ended = json.loads((tmp_path / "alone" / "alone").read_text())
    spans = [json.loads(path.read_text()) for path in (tmp_path / "busy").iterdir()]
    assert len(spans) == 24
    assert [span for span in spans if span[0] < ended and span[1] > began] == []
    # the serial test came while the other run's tests were running, not after all of them
    assert any(span[0] > ended for span in spans), (began, ended, sorted(spans))

"""result.json is the verdict the process exits with, written last; whatever can refuse a run refuses it
before any rank starts (issue 19).

Real `gpuval accept`/`health` child processes on this CPU; tests/dist/reporthook holds or breaks rank 0
while it writes its reports. As root, the permission cases run without the capabilities that let root
write anything (setpriv), so a read-only file is read-only to gpuval as it is to any other user.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
from conftest import cli_env, run_cli

from gpuval.history import open_history

HOOK = Path(__file__).parent / "dist" / "reporthook"
PROFILE = (
    "name: tiny\n"
    "expect: {gpu_count: 0}\n"
    "runtime: {timeout_s: 60}\n"
    "checks:\n"
    "  matmul.fp32_tflops: {min: 0.000001}\n"
    "benchmarks:\n"
    "  matmul: {dtypes: [fp32], slow_shapes: [[64, 64, 64]], warmup: 1, repeats: 1, warmup_s: 0,"
    " min_time_s: 0, window_s: 0}\n"
)
GPUVAL = [sys.executable, "-m", "gpuval"]


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(PROFILE)
    return path


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    hook = os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")]))
    return cli_env(PYTHONPATH=hook, OMP_NUM_THREADS="1", TMPDIR=str(temp), **extra)


def _unprivileged() -> list[str]:
    """How to start gpuval so that file permissions hold for it: as is, or as root without the DAC
    capabilities."""
    if os.geteuid() != 0:
        return GPUVAL
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a read-only file is writable here")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", *GPUVAL]


@pytest.mark.parametrize("nproc", ["1", "2"])
@pytest.mark.dist
def test_rank_0_killed_while_writing_reports_leaves_no_verdict(nproc, profile, tmp_path):
    """SIGKILL to rank 0 (the only process with --nproc 1) while it renders report.html: no result.json at
    all, not even the PASS an earlier run left in the same folder; the reports before it are there."""
    out, marker = tmp_path / "out", tmp_path / "writing"
    out.mkdir()
    (out / "result.json").write_text('{"verdict": "PASS"}')  # an earlier run's verdict
    env = _env(tmp_path, GPUVAL_TEST_HOLD_REPORT=str(marker))
    args = ["accept", "--profile", str(profile), "--nproc", nproc, "--output", str(out)]
    proc = subprocess.Popen(
        [*GPUVAL, *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 90
        while not (marker.exists() and marker.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=30)
            time.sleep(0.05)
        os.kill(int(marker.read_text()), signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if nproc == "1":
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 3, stderr
        assert "rank 0" in stderr.strip().splitlines()[-1], stderr
    assert not (out / "result.json").exists()
    assert (out / "junit.xml").exists()  # written before report.html, where rank 0 died
    assert not list((tmp_path / "tmp").glob("gpuval-*"))  # the launcher's exit folder went too


@pytest.mark.slow  # 3-10 s on 2 cores (2026-11-27 profile of the inner loop)
@pytest.mark.parametrize("command", ["accept", "health"])
def test_a_report_that_cannot_be_written_makes_the_verdict_error(command, profile, tmp_path):
    out = tmp_path / "out"
    args = ["--profile", str(profile if command == "accept" else "cpu"), "--output", str(out)]
    extra = ["--nproc", "1"] if command == "accept" else []
    proc = run_cli([command, *args, *extra], tmp_path, env=_env(tmp_path, GPUVAL_TEST_FAIL_REPORT="1"))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["verdict"] == "ERROR"
    (problem,) = [c for c in result["checks"] if c["name"] == "report.write"]
    assert problem["status"] == "ERROR"
    assert problem["detail"].startswith("report.html could not be written (No space left on device")
    assert "report.write" in (out / "junit.xml").read_text()


@pytest.mark.slow
def test_a_history_that_fails_after_the_verdict_makes_it_error_in_every_report(profile, tmp_path):
    """Work done and judged PASS, then the history write fails: exit 3, and result.json and junit.xml
    say ERROR and why; no PASS anywhere, no traceback."""
    out, db = tmp_path / "out", tmp_path / "history.sqlite"
    args = ["accept", "--profile", str(profile), "--nproc", "1", "--output", str(out), "--history", str(db)]
    proc = run_cli(args, tmp_path, env=_env(tmp_path, GPUVAL_TEST_FAIL_HISTORY="1"))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["verdict"] == "ERROR"
    (problem,) = [c for c in result["checks"] if c["name"] == "report.write"]
    assert problem["detail"] == (
        f"history database {db}: the run could not be recorded (attempt to write a readonly database): "
        "the run's reports are incomplete"
    )
    assert "report.write" in (out / "junit.xml").read_text()
    assert "report.write" in (out / "report.html").read_text()


def _readonly_file(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "history.sqlite"
    open_history(db)
    db.chmod(0o444)
    return db, "attempt to write a readonly database"


def _readonly_folder(tmp_path: Path) -> tuple[Path, str]:
    folder = tmp_path / "ro"
    folder.mkdir()
    open_history(folder / "history.sqlite")  # SQLite cannot make its journal beside it
    folder.chmod(0o555)
    return folder / "history.sqlite", "attempt to write a readonly database"


def _new_in_readonly_folder(tmp_path: Path) -> tuple[Path, str]:
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    return folder / "history.sqlite", "unable to open database file"


def _not_sqlite(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "history.sqlite"
    db.write_text("runs: 3\n")
    return db, "file is not a database"


@pytest.mark.parametrize("make", [_readonly_file, _readonly_folder, _new_in_readonly_folder, _not_sqlite])
@pytest.mark.slow
def test_a_history_that_cannot_record_the_run_is_refused_before_any_rank(
    make, profile, tmp_path, assert_usage_error
):
    db, reason = make(tmp_path)
    out = tmp_path / "out"
    args = ["accept", "--profile", str(profile), "--nproc", "2", "--output", str(out), "--history", str(db)]
    try:
        proc = run_cli(args, tmp_path, program=_unprivileged(), env=_env(tmp_path))
    finally:
        db.parent.chmod(0o755)
    line = assert_usage_error(proc, f"history database {db}: {reason}: pass --history PATH (or none)")
    assert len(proc.stderr.strip().splitlines()) == 1, line
    assert not out.exists()  # no rank started, nothing was made


def test_the_history_probe_leaves_a_writable_database_as_it_was(tmp_path):
    db = tmp_path / "history.sqlite"
    open_history(db)
    open_history(db)
    with closing(sqlite3.connect(db)) as handle:
        assert handle.execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)  # the probe row rolled back


@pytest.mark.slow
def test_an_output_folder_that_cannot_be_written_is_refused_before_any_rank(
    profile, tmp_path, assert_usage_error
):
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o555)
    args = ["accept", "--profile", str(profile), "--nproc", "2", "--output", str(parent / "out")]
    try:
        proc = run_cli(args, tmp_path, program=_unprivileged(), env=_env(tmp_path))
    finally:
        parent.chmod(0o755)
    assert_usage_error(proc, f"output directory '{parent / 'out'}' cannot be written (Permission denied)")
    assert not (parent / "out").exists()


def test_an_unknown_health_skip_name_stops_accept_before_any_rank(profile, tmp_path, assert_usage_error):
    out = tmp_path / "out"
    args = ["accept", "--profile", str(profile), "--nproc", "2", "--output", str(out), "--set"]
    proc = run_cli([*args, "health.skip=[nope]"], tmp_path, env=_env(tmp_path))
    assert_usage_error(proc, "health.skip: unknown health check 'nope'")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


def test_the_train_benchmarks_scratch_folder_lies_where_the_launcher_removes_it(tmp_path, monkeypatch):
    """Under gpuval's launcher the synthetic data goes inside its exit folder (removed in the launcher's
    `finally`, whatever killed the rank); otherwise in the temp directory; gone after an exception."""
    from gpuval.bench.train_step import _scratch
    from gpuval.launch import EXIT_DIR_VARIABLE

    exit_dir = tmp_path / "gpuval-exit-x"
    exit_dir.mkdir()
    monkeypatch.setenv(EXIT_DIR_VARIABLE, str(exit_dir))
    with _scratch() as folder:
        assert Path(folder).parent == exit_dir and Path(folder).name.startswith("gpuval-train-")
    monkeypatch.delenv(EXIT_DIR_VARIABLE)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / "tmp" / f"gpuval-train-{gone.pid}-left"  # a rank SIGKILLed under srun left it
    stale.mkdir()
    with pytest.raises(RuntimeError), _scratch() as folder:
        assert Path(folder).parent == tmp_path / "tmp"
        assert Path(folder).name.startswith(f"gpuval-train-{os.getpid()}-")
        raise RuntimeError("a rank's error")
    assert list((tmp_path / "tmp").iterdir()) == [] and list(exit_dir.iterdir()) == []

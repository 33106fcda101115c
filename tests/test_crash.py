"""An exception gpuval did not foresee ends as ERROR (exit 3) with one line and result files saying so,
never as exit 1 (FAIL) with a traceback (issue 34: torch 2.11's LaunchConfig crashed every multi-rank
run that way). tests/dist/crashhook raises the exception where the test asks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import cli_env, run_cli

HOOK = Path(__file__).parent / "dist" / "crashhook"
PROFILE = (
    "name: tiny\n"
    "expect: {gpu_count: 0}\n"
    "runtime: {timeout_s: 5}\n"
    "checks:\n"
    "  matmul.fp32_tflops: {min: 0.000001}\n"
    "benchmarks:\n"
    "  matmul: {dtypes: [fp32], slow_shapes: [[64, 64, 64]], warmup: 1, repeats: 1, warmup_s: 0,"
    " min_time_s: 0, window_s: 0}\n"
)


def _hook_env(tmp_path: Path, where: str) -> dict[str, str]:
    """The environment of a run with tests/dist/crashhook active at `where`, its TMPDIR in tmp_path."""
    (tmp_path / "tmp").mkdir()
    return cli_env(
        PYTHONPATH=os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")])),
        GPUVAL_TEST_CRASH=where,
        OMP_NUM_THREADS="1",
        TMPDIR=str(tmp_path / "tmp"),
    )


def _crash(tmp_path: Path, where: str, nproc: int, profile: str = PROFILE):
    (tmp_path / "tiny.yaml").write_text(profile)
    env = _hook_env(tmp_path, where)
    args = ["accept", "--profile", "tiny.yaml", "--nproc", str(nproc), "--output", "out"]
    return run_cli(args, cwd=tmp_path, env=env, timeout=120)


def _gpuval_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("gpuval:")]


def _assert_error_files(tmp_path: Path, proc, fragment: str) -> None:
    assert proc.returncode == 3, proc.stderr[-3000:]
    lines = _gpuval_lines(proc)
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "internal error, TypeError" in lines[0] and fragment in lines[0]
    assert "Traceback" not in proc.stderr
    kept = tmp_path / "out" / "gpuval-error.log"
    assert str(kept) in lines[0] or "gpuval-error.log" in lines[0]
    assert fragment in kept.read_text() and "Traceback" in kept.read_text()
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["verdict"] == "ERROR"
    (error,) = [c for c in result["checks"] if c["name"] == "run.error"]
    assert error["status"] == "ERROR" and fragment in error["detail"]
    junit = (tmp_path / "out" / "junit.xml").read_text()
    assert "run.error" in junit


@pytest.mark.dist
def test_an_unforeseen_error_in_the_launcher_is_exit_3_with_an_error_result(tmp_path: Path) -> None:
    proc = _crash(tmp_path, "launcher", nproc=2)
    _assert_error_files(tmp_path, proc, "unexpected keyword argument 'from_the_test'")


@pytest.mark.dist
def test_an_unforeseen_error_in_rank_0_is_exit_3_with_an_error_result(tmp_path: Path) -> None:
    proc = _crash(tmp_path, "rank0", nproc=2)
    _assert_error_files(tmp_path, proc, "this torch does not take")


@pytest.mark.dist
def test_an_unforeseen_error_in_another_rank_is_exit_3_in_one_line(tmp_path: Path) -> None:
    proc = _crash(tmp_path, "rank1", nproc=2)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = _gpuval_lines(proc)
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "rank 1 of 2: internal error, TypeError" in lines[0] and "this torch does not take" in lines[0]
    _assert_not_pass(tmp_path)


def _assert_not_pass(tmp_path: Path) -> None:
    assert (
        not (tmp_path / "out" / "result.json").exists()
        or json.loads((tmp_path / "out" / "result.json").read_text())["verdict"] != "PASS"
    )


@pytest.mark.dist
def test_errors_on_several_ranks_are_gathered_into_the_launchers_one_line(tmp_path: Path) -> None:
    """Each rank's error once, with the ranks that met it, in one `gpuval:` line (issue 50): neither a
    line per rank nor a rank's error lost (a foreseen error on rank 1 was said by no one: only rank 0
    said its errors)."""
    proc = _crash(tmp_path, "usage-rank1,rank0", nproc=2)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = _gpuval_lines(proc)
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "rank 0 of 2: internal error, TypeError" in lines[0], lines[0]
    assert "rank 1 of 2: GPU 1: a setting this rank cannot use (from the test); change it" in lines[0]
    _assert_not_pass(tmp_path)


# (hook mode, what rank 0's line says of that step)
START_UP_STOPS = {
    "stop-start-rank1": "rank 1 never started joining",
    "stop-join-rank1": "every rank started joining, so one stopped or hung inside it",
    "stop-first-rank1": "its first collective did not complete",
}


@pytest.mark.dist
@pytest.mark.parametrize("where", list(START_UP_STOPS))
def test_a_rank_stopped_while_the_group_forms_ends_the_run_within_a_minute_saying_error(
    tmp_path: Path, where: str
) -> None:
    """Rank 1 stops (SIGSTOP) as it starts, just before it joins the process group, or once the group formed
    but before its first collective, under the default collective timeout (300 s): the join's own deadline
    (runtime.join_deadline_s) ends the run with exit 3 within 60 s of the stop, one line naming the step and
    rank 1 (the launcher stops it), and rank 0 leaves result.json saying ERROR with its line (issue 51)."""
    import time

    from gpuval.runtime import DEFAULT_TIMEOUT_S, join_deadline_s

    assert join_deadline_s(DEFAULT_TIMEOUT_S) < 50  # what the bound below leaves room for
    proc = _crash(tmp_path, where, nproc=2, profile=PROFILE.replace("runtime: {timeout_s: 5}\n", ""))
    stopped_at = float((tmp_path / "tmp" / "stopped-rank1").read_text())  # written by the hook as it stopped
    assert time.time() - stopped_at < 60, proc.stderr[-3000:]
    assert proc.returncode == 3, proc.stderr[-3000:]
    lines = _gpuval_lines(proc)
    assert len(lines) == 1 and START_UP_STOPS[where] in lines[0], proc.stderr[-3000:]
    assert "rank 1" in lines[0] and "stopped by gpuval" in lines[0], lines[0]
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["verdict"] == "ERROR" and result["world"]["size"] == 2
    (check,) = result["checks"]
    assert check["name"] == "run.ranks" and START_UP_STOPS[where] in check["detail"]
    assert check["detail"] in lines[0]


@pytest.mark.dist
def test_a_rank_stopped_in_the_join_under_external_torchrun_ends_it_within_a_minute(tmp_path: Path) -> None:
    """Not gpuval's launcher: rank 0's join ends at its deadline, rank 0 says so in its line and SIGKILLs the
    stopped rank of its host as it leaves (torchrun would give it 30 s between SIGTERM and SIGKILL); torchrun
    ends within 60 s of the stop; result.json says ERROR."""
    import re
    import subprocess
    import time

    (tmp_path / "tiny.yaml").write_text(PROFILE.replace("runtime: {timeout_s: 5}\n", ""))
    env = _hook_env(tmp_path, "stop-join-rank1")
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    command = [torchrun, "--standalone", "--nproc-per-node=2", "-m", "gpuval", "accept"]
    proc = subprocess.run(
        [*command, "--profile", "tiny.yaml", "--output", "out"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    stopped_at = float((tmp_path / "tmp" / "stopped-rank1").read_text())
    assert time.time() - stopped_at < 60, proc.stderr[-3000:]
    # torchrun's own exit code (1) and summary: it names whichever rank's end it saw first
    assert proc.returncode != 0 and re.search(r"exitcode\s*:\s*(3|-9)\b", proc.stderr), proc.stderr[-3000:]
    lines = _gpuval_lines(proc)
    assert len(lines) == 1 and START_UP_STOPS["stop-join-rank1"] in lines[0], proc.stderr[-3000:]
    assert lines[0].endswith("; rank 1 (stopped by a signal), stopped by gpuval"), lines[0]
    assert json.loads((tmp_path / "out" / "result.json").read_text())["verdict"] == "ERROR"


def test_the_gathered_line_says_each_error_once_with_its_ranks() -> None:
    from gpuval.rank_lines import gathered_line

    assert gathered_line({}, 8) == ""
    every = {r: ("gloo timed out", False, 1.0) for r in range(4)}
    assert gathered_line(every, 4) == "gloo timed out"  # every rank, alike: as it is
    assert gathered_line({3: ("GPU 3: ECC", False, 1.0)}, 8) == "rank 3 of 8: GPU 3: ECC"
    lines = {0: "a", 1: "a", 2: "a", 3: "a", 5: "b", 6: "a", 7: "b  \n"}
    said = {r: (line, False, 4.0 if line.startswith("b") else 5.0) for r, line in lines.items()}
    assert gathered_line(said, 8) == "ranks 5, 7 of 8: b; ranks 0-3, 6 of 8: a"  # the first said first
    # the ranks that only lost their peers come after the error that caused it, in a few words
    lost = {0: ("lost contact", True, 1.0), 1: ("lost contact", True, 1.0), 2: ("GPU 2: Xid 79", False, 2.0)}
    assert gathered_line(lost, 3) == "rank 2 of 3: GPU 2: Xid 79 (ranks 0, 1 of 3 then lost contact)"
    # no rank said more than that it lost its peers: that is the news
    assert gathered_line({1: ("lost contact", True, 1.0)}, 2) == "rank 1 of 2: lost contact"
    many = {rank: (f"GPU {rank} lost", False, float(rank)) for rank in range(6)}
    assert gathered_line(many, 8) == (
        "rank 0 of 8: GPU 0 lost; rank 1 of 8: GPU 1 lost; rank 2 of 8: GPU 2 lost; "
        "3 other errors on 3 more ranks"
    )


def test_the_exit_code_after_ranks_said_errors_keeps_rank_0s_verdict_and_is_never_a_pass() -> None:
    from gpuval.rank_lines import ended_with

    said = {1: ("matmul failed on rank 1: TypeError", False, 1.0)}
    assert ended_with({0: 1, 1: 0}, said, 2) == (1, "rank 1 of 2: matmul failed on rank 1: TypeError")  # FAIL
    assert ended_with({0: 3, 1: 0}, said, 2)[0] == 3
    assert ended_with({0: 0, 1: 0}, said, 2)[0] == 3  # rank 0 passed beside an error: never a pass
    assert ended_with({1: 2}, {1: ("bad setting", False, 1.0)}, 2)[0] == 2  # rank 0 gone: the speaker's
    assert ended_with({}, said, 2)[0] == 3


def test_the_one_line_names_the_torch_when_it_is_outside_the_range(monkeypatch) -> None:
    from gpuval import crash

    monkeypatch.setattr("importlib.metadata.version", lambda name: "2.9.1+cu128")
    line = str(crash.unforeseen(TypeError("x"), None))
    assert "torch 2.9.1+cu128 is outside the supported range (torch >= 2.11, < 2.15)" in line
    monkeypatch.setattr("importlib.metadata.version", lambda name: "2.13.0")
    assert "a gpuval bug" in str(crash.unforeseen(TypeError("x"), None))


def test_the_version_range_reads_releases() -> None:
    from gpuval.versions import parse, torch_problem

    assert (
        parse("2.11.0+cu130") == (2, 11) and parse("2.14.1") == (2, 14) and parse("2.15.0a0+git") == (2, 15)
    )
    assert torch_problem("2.11.0+cu130") is None and torch_problem("2.14.1") is None
    assert "outside" in torch_problem("2.10.0") and "outside" in torch_problem("2.15.0")
    assert "cannot read" in torch_problem("banana")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))


@pytest.mark.slow
def test_an_unforeseen_error_in_bench_is_exit_3_with_its_document_saying_error(tmp_path: Path) -> None:
    env = _hook_env(tmp_path, "rank0")
    args = ["bench", "matmul", "--nproc", "1", "--set", "dtypes=[fp32]", "--output", "out/bench.json"]
    proc = run_cli(args, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gpuval: ")]
    assert len(lines) == 1 and lines[0].startswith("gpuval: internal error, TypeError"), proc.stderr
    document = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert document["status"] == "ERROR" and "this torch does not take" in document["detail"]
    assert document["benchmark"] == "matmul" and document["measurements"] == []
    assert "Traceback" in (tmp_path / "out" / "gpuval-error.log").read_text()

"""gpuval.forked: work done in a forked child comes back as its value or its exception, a child that dies
or is left behind is never waited on, and nothing the parent printed is printed twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gpuval.forked
from gpuval.errors import RunError, UsageError
from gpuval.forked import in_child, waiting_child

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def forking(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pytest worker runs threads, which alone keep in_child in this process: say there are none."""
    monkeypatch.setattr(gpuval.forked.threading, "active_count", lambda: 1)
    if not gpuval.forked.can_fork():
        pytest.skip("one CPU or no fork() here: in_child runs the work in this process")


def _pid_and(value: int) -> tuple[int, int]:
    return os.getpid(), value * 2


def _refuse(path: str) -> None:
    raise UsageError(f"result file '{path}': not JSON (line 1, column 2: expected value); fix it there")


def _unpicklable() -> object:
    return lambda: None


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_the_work_runs_in_another_process_and_its_value_comes_back(forking):
    with in_child(_pid_and, 21) as later:
        assert later.in_child
        pid, value = later.result()
    assert value == 42 and pid != os.getpid()


def _warm_marker() -> None:
    Path(os.environ["GPUVAL_TEST_WARM"]).write_text(str(os.getpid()))


def _warm_fails() -> None:
    raise ImportError("no such module")


def _pid_and_warmed(value: int) -> tuple[int, int, str]:
    return os.getpid(), value + 1, Path(os.environ["GPUVAL_TEST_WARM"]).read_text()


def test_a_child_forked_early_warms_up_then_works_on_what_is_sent(forking, tmp_path, monkeypatch):
    """Forked while this process is small: warm() runs at once, the work when its arguments come."""
    marker = tmp_path / "warmed-by"
    monkeypatch.setenv("GPUVAL_TEST_WARM", str(marker))
    with waiting_child(_pid_and_warmed, warm=_warm_marker) as later:
        for _ in range(200):  # the child warms up before anything is sent
            if marker.exists() and marker.read_text():
                break
            time.sleep(0.05)
        assert marker.read_text() != str(os.getpid())
        later.send(41)
        pid, value, warmed_by = later.result()
    assert value == 42 and pid == int(warmed_by) != os.getpid()


def test_a_warm_up_that_fails_is_only_a_lost_head_start(forking):
    with waiting_child(_pid_and, warm=_warm_fails) as later:
        later.send(5)
        assert later.result()[1] == 10


def test_the_result_of_work_never_sent_its_arguments_is_a_mistake_not_a_hang(forking):
    began = time.monotonic()
    with waiting_child(_pid_and) as later:
        with pytest.raises(RuntimeError, match=r"before send\(\)"):
            later.result()
    assert time.monotonic() - began < 10


def test_without_a_second_cpu_or_with_threads_the_work_runs_here(monkeypatch):
    monkeypatch.setattr(gpuval.forked.threading, "active_count", lambda: 2)
    with in_child(_pid_and, 1) as later:
        assert not later.in_child
        assert later.result() == (os.getpid(), 2)
    with waiting_child(_pid_and, warm=_warm_fails) as later:  # no warm-up here: the work does what it needs
        later.send(3)
        assert later.result() == (os.getpid(), 6)


def test_the_childs_usage_error_is_raised_here_as_it_was(forking):
    with pytest.raises(UsageError, match=r"^result file 'b.json': not JSON \(line 1, column 2"):
        with in_child(_refuse, "b.json") as later:
            later.result()


def test_a_value_that_cannot_come_back_is_a_run_error(forking):
    with pytest.raises(RunError, match="a child process of gpuval failed: .*pickle"):
        with in_child(_unpicklable) as later:
            later.result()


def test_a_child_that_dies_without_answering_is_a_run_error_not_a_hang(forking):
    began = time.monotonic()
    with pytest.raises(RunError, match=r"ended without answering \(exit status -9\)"):
        with in_child(_die) as later:
            later.result()
    assert time.monotonic() - began < 10


def test_a_child_left_behind_is_killed_when_the_block_is_left(forking):
    began = time.monotonic()
    with pytest.raises(KeyError):
        with in_child(_sleep, 60) as later:
            process = later._process
            raise KeyError("the command failed on its own side")
    assert time.monotonic() - began < 10 and not process.is_alive()


def test_what_the_parent_printed_before_the_fork_is_printed_once(tmp_path):
    """Buffered output (a pipe) is flushed before the fork: the child, which flushes its copy of the
    buffers when it ends, has nothing left to print."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from gpuval.forked import in_child\n"
        "print('before the fork')\n"
        "with in_child(sum, [1, 2]) as later:\n"
        "    print('child', later.in_child, later.result())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(REPO / "src")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    can = (os.cpu_count() or 1) >= 2 and len(os.sched_getaffinity(0)) >= 2
    assert proc.stdout == f"before the fork\nchild {can} 3\n"


def test_a_child_whose_parent_is_killed_ends_when_its_work_is_done(tmp_path):
    """SIGKILL leaves no clean-up to the parent: the child, which holds no copy of the parent's end of the
    pipe, finds it broken when it answers (or waits for arguments) and ends without a word."""
    script = (
        "import os, signal, sys, time; sys.path.insert(0, sys.argv[1])\n"
        "from gpuval.forked import in_child, waiting_child\n"
        "busy = in_child(time.sleep, 1.0)\n"
        "idle = waiting_child(time.sleep)\n"
        "print(busy._process.pid, idle._process.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(REPO / "src")], capture_output=True, text=True, timeout=60
    )
    if not proc.stdout.strip():
        pytest.skip("one CPU or no fork() here: no child to leave behind")
    assert proc.returncode == -signal.SIGKILL and proc.stderr == "", proc.stderr
    children = [int(pid) for pid in proc.stdout.split()]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in children)


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan is reaped by init, which may take a moment)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"

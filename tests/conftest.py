"""Shared fixtures: running the `gpuval` CLI as a user would (a child process), and small profiles.

Every CLI test runs in a clean environment: no launcher variables (RANK, SLURM_*, ...) leak in from
the test runner, no GPU is visible (CPU-only tests behave the same on a GPU machine), and the terminal
is 80 columns wide, as in most CI logs, so messages that wrap are caught.

Tiers (markers registered in pyproject.toml, `--strict-markers` makes a mistyped one an error):

    pytest                   everything (the README's command, .ci/run)
    pytest -m "not slow"     the inner loop, ~1.5 min on 2 cores: every module's formulas, verdicts,
                             parsing, configs and quick fuzzing, in-process or through quick CLI calls
    pytest -m torch_version  what can differ between torch releases: .ci/run's run on the lowest torch

`slow` takes more than about a second (trains a model, runs `gpuval accept`, starts many processes);
`dist` starts torchrun or several cooperating processes; `slurm` runs the real local Slurm
(test_slurm.py); `browser` opens headless Chromium (test_report.py). A `dist`, `slurm` or `browser` test
is `slow` as well (pytest_collection_modifyitems below), so a test is marked with what it does, once.
A whole module of one kind says so with `pytestmark = pytest.mark.dist`; a mixed module marks its tests.
`serial` asserts a wall-clock bound within about a second of what it times (calls per 20 ms window, a stop
within 0.55 s), which other tests' load could break, so it runs with no other test beside it; bounds with
seconds of slack over a deadline (test_lifecycle, test_soak) run beside others. `torch_version` (given
here, by module: TORCH_VERSION_MODULES) tests code whose behaviour depends on the torch release; the
two-rank accept and health runs carry it by hand, so the lowest torch runs gpuval end to end once.

Parallel workers (pytest-xdist; pyproject's addopts say `-n auto --dist loadgroup`: 4 workers for the
full run, one per core for `-m "not slow"`, pytest_xdist_auto_num_workers; `-n 0` runs in this process):
much of the suite waits on child processes (torchrun ranks, gpuval runs, Slurm jobs, Chromium), so 4
workers share 2 cores well. "Parallel workers" below says what keeps that safe.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


# Modules whose code behaves differently from one torch release to the next (docs/torch-versions.md): the
# launcher and runtime (LaunchConfig's fields), collective deadlines (_set_pg_timeout), the fine-tune
# trainer, its parallel modes and kernels (varlen attention, compiled dropout, FP8 _scaled_mm), and the
# benchmarks' collectives (timed through gpuval.timing's `measure` on the release). .ci/run runs them, with
# every dist test, on the lowest torch too. Not test_timing.py: its tests are wall-clock arithmetic, and
# `serial`: beside the full suite each would hold every test of both runs back until the running ones end.
TORCH_VERSION_MODULES = frozenset(
    {
        "test_runtime.py",
        "test_lifecycle.py",
        "test_crash.py",
        "test_deadline.py",
        "test_finetune_train.py",
        "test_finetune_kernels.py",
        "test_finetune_fp8.py",
        "test_finetune_fused_mlp.py",
        "test_finetune_packed_dropout.py",
        "test_collectives.py",
        "test_bench_train.py",
        "test_versions.py",
    }
)


# Tests of those modules that the lowest torch leaves out: each one's torch-facing part is what a test that
# does run there already proves of the release (named on its line), and the rest is gpuval's own logic,
# which the CPU build's run tests. `module::test` or `module::test[parameters]`; test_versions.py checks that
# each still names a test.
NOT_ON_THE_LOWEST = {
    # FSDP2 on the release: test_ddp_and_fsdp_on_two_ranks...; the fused loss: test_finetune_kernels.py
    "test_finetune_train.py::test_the_fused_loss_and_split_products_under_sharding_equal_one_process[fsdp]",
    # two gloo ranks stopping together: test_ddp_and_fsdp_on_two_ranks...; the rest is the trainer's logic
    "test_finetune_train.py::test_two_ranks_diverging_both_stop_at_the_same_step_with_exit_3",
    # the launcher's signal handling (LaunchConfig's signals_to_handle): the SIGTERM case
    "test_lifecycle.py::test_a_signal_to_the_launcher_stops_every_rank_with_one_line[2-130]",
    # a rank that stops answering: the [stop] case; a rank that dies: test_runtime's dead_rank_accept
    "test_lifecycle.py::test_a_hung_rank_ends_a_self_launched_accept_with_exit_3[sleep]",
    "test_lifecycle.py::test_a_stopped_rank_ends_gpuval_bench_with_exit_3",
    "test_lifecycle.py::test_a_stopped_rank_ends_a_two_rank_finetune_with_exit_3",
    "test_lifecycle.py::test_a_stopped_rank_ends_accept_under_external_torchrun",
    # gpuval's error reports; a rank that fails under the launcher: test_dead_rank_accept
    "test_crash.py::test_an_unforeseen_error_in_the_launcher_is_exit_3_with_an_error_result",
    "test_crash.py::test_an_unforeseen_error_in_rank_0_is_exit_3_with_an_error_result",
    "test_crash.py::test_an_unforeseen_error_in_another_rank_is_exit_3_in_one_line",
    "test_crash.py::test_an_unforeseen_error_in_bench_is_exit_3_with_its_document_saying_error",
    # the join's deadline on the release (init_process_group's timeout, the agent's store): the [stop-join]
    # case and the one under torchrun; a stop before the join or before the first collective ends by the same
    # timeout, and gloo's collective timeout is every deadline test's
    "test_crash.py::test_a_rank_stopped_while_the_group_forms_ends_the_run_within_a_minute_saying_error[stop-start-rank1]",
    "test_crash.py::test_a_rank_stopped_while_the_group_forms_ends_the_run_within_a_minute_saying_error[stop-first-rank1]",
    "test_runtime.py::test_dead_rank_bench",
    "test_runtime.py::test_local_turns_let_one_rank_per_node_work_at_a_time",  # file locks, not torch
    # gloo's collectives and subgroups at 3 ranks: test_every_op_exact_at_three_ranks and the world3 tests
    "test_collectives.py::test_scope_node_splits_two_nodes",
    "test_collectives.py::test_scope_node_isolates_the_faulty_node",
    "test_collectives.py::test_world_scope_after_node_groups",
    # the trainer on the release: test_finetune_train.py; the benchmark's own arithmetic runs in-process
    "test_bench_train.py::test_bench_train_on_cpu_trains_and_reports",
    # resuming: test_finetune_train.py; the packed dropout's own arithmetic: this module's in-process tests
    "test_finetune_packed_dropout.py::test_a_run_with_packed_dropout_resumes_to_the_uninterrupted_runs_losses_and_weights",
    # inductor's CPU code, which the defaults never use (compile's auto is on only on a GPU, where the GPU
    # machines run 2.11 in every speed run): the CPU build's run keeps it; 160-228 s on 2.11 in CI
    "test_finetune_packed_dropout.py::test_the_compiled_dropout_drops_at_the_drawn_rate_and_its_gradient_follows_its_mask",
}


# Modules whose quick tests exercise gpuval's use of the packages the lowest venv holds at their lowest
# declared releases (.ci/lower-bounds): pydantic's models and schemas, typer's CLI, NVML's bindings, the
# datasets loader, numpy. Their quick tier is `lowest_bounds`, which .ci/run runs there beside torch_version,
# so each of those bounds in pyproject is a tested truth (issue 48).
LOWEST_BOUND_MODULES = frozenset(
    {
        "test_config.py",
        "test_results.py",
        "test_cli.py",
        "test_nvml.py",
        "test_health.py",
        "test_discover.py",
        "test_derive.py",
        "test_finetune_data.py",
        "test_finetune_formats.py",
        "test_finetune_glaive.py",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked dist, slurm or browser is slow too, so `-m "not slow"` leaves it out; a test of a
    TORCH_VERSION_MODULES module is torch_version, less NOT_ON_THE_LOWEST; a quick one of a
    LOWEST_BOUND_MODULES module is lowest_bounds. Under parallel workers: _share_out."""
    for item in items:
        if item.get_closest_marker("slow") is None and any(item.get_closest_marker(m) for m in ALSO_SLOW):
            item.add_marker(pytest.mark.slow)
        names = {f"{item.path.name}::{item.name}", f"{item.path.name}::{item.originalname}"}
        left_out = names & NOT_ON_THE_LOWEST
        if item.path.name in TORCH_VERSION_MODULES and not left_out:
            item.add_marker(pytest.mark.torch_version)
        if item.path.name in LOWEST_BOUND_MODULES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.lowest_bounds)
    if hasattr(config, "workerinput"):  # an xdist worker: each collects, and all order alike
        _share_out(config, items)


# --- parallel workers ------------------------------------------------------------------------------------
# Under `-n N` each worker is a pytest process of its own, with its own module- and session-scoped
# fixtures. So: tests that share a module-scoped fixture (an accept run, a 4-rank torchrun) go to one
# worker, which makes it once, and so do the Slurm tests, which share one local cluster (--dist loadgroup, by
# _share_out's groups); a `serial` test runs alone (pytest_runtest_protocol); a run that tests of several
# modules read is made once per test run, across workers (made_once); and every worker computes on one
# thread, since 4 workers share 2 cores.

# The longest tests (--durations on 2 cores, 20 s and more) start first, so no worker is left running one
# alone at the end; only the order depends on this list.
LONGEST = (
    "test_finetune_learning.py::",
    "test_finetune_train.py::test_resume_from_a_checkpoint_matches_the_uninterrupted_run",
    "test_finetune_train.py::test_ddp_and_fsdp_on_two_ranks",
    "test_lifecycle.py::",
    "test_slurm.py::",
    "test_soak.py::test_a_slowdown_in_iteration_2",
    "test_finetune_packed_dropout.py::test_the_compiled_dropout",
    "test_finetune_model.py::test_pretraining_runs_on_a_cpu",
    "test_kernel_paths.py::test_the_numerical_tests_pass",
)


def _run_files(testrunuid: str) -> Path:
    """The stem of one parallel run's files in the temporary folder: its locks and its groups."""
    return Path(tempfile.gettempdir()) / f"gpuval-tests-{testrunuid}"


def _share_out(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the items for the scheduler below and order them: the longest first, then the other slow ones,
    then the rest, and the serial tests last, as one group: by then the other workers are finishing, so a
    serial test waits for a quick test to end, not for a long one."""
    groups = {}
    for item in items:
        names = item._fixtureinfo.name2fixturedefs  # the fixtures it uses, with their scopes
        if item.get_closest_marker("serial"):
            groups[item.nodeid] = "serial"
        elif (group := item.get_closest_marker("xdist_group")) is not None:
            groups[item.nodeid] = str(group.args[0])  # tests that read each other's in-process state
        elif item.get_closest_marker("slurm"):
            groups[item.nodeid] = "slurm"  # one local cluster (tests/test_slurm.py's fixture) for all
        elif any(defs[-1].scope in ("module", "class", "package") for defs in names.values()):
            groups[item.nodeid] = item.path.name  # its module's shared fixtures are made once, on one worker

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("serial"):
            return 3
        if any(part in item.nodeid for part in LONGEST):
            return 0
        return 1 if item.get_closest_marker("slow") else 2

    items.sort(key=rank)  # stable: the collection order within each rank
    written = _run_files(config.workerinput["testrunuid"]).with_suffix(f".groups.{os.getpid()}")
    written.write_text(json.dumps(groups), encoding="utf-8")  # every worker writes the same groups
    written.replace(written.with_suffix(".json"))


FULL_RUN_WORKERS = 4  # plain `pytest`: its slow tests mostly wait on child processes, so 4 share 2 cores


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many workers pyproject's `-n auto` starts. The full run: FULL_RUN_WORKERS. The inner loop
    (`-m "not slow"`), whose tests compute in the worker itself: one per core, at most FULL_RUN_WORKERS, since
    a worker more than the cores only adds its own collection (about 10 s of CPU each) and switching. On
    2 cores 2 workers ran it in 155 s of CPU against 182 s for 4 (2026-11-27)."""
    if "not slow" in (config.getoption("markexpr") or ""):
        return max(1, min(os.cpu_count() or 1, FULL_RUN_WORKERS))
    return FULL_RUN_WORKERS


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """--dist loadgroup by the groups the workers wrote (_share_out): pytest-xdist's own loadgroup reads a
    suffix it adds to each test's node id, which pytest 9.2's nodes no longer take, so it groups nothing."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    groups_file = _run_files(config.option.testrunuid).with_suffix(".groups.json")

    class ByGroup(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:  # called once every worker has collected
            if self.groups is None:
                self.groups = json.loads(groups_file.read_text(encoding="utf-8"))
            return self.groups.get(nodeid, nodeid)

    return ByGroup(config, log)


def pytest_configure(config: pytest.Config) -> None:
    # inductor's CPU code (the compiled-dropout and split-product tests) first builds and runs a small
    # program per vector ISA the CPU lists, 10 compiler runs: on torch 2.11 in every process, cache or not.
    # Trust /proc/cpuinfo instead, as inductor's own switch allows (2026-11-28, 2 cores: the compiled tests
    # of two modules took 43 s of CPU with the probes and 25 s without on 2.11, 21 s and 10 s on 2.13).
    os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
    # The tests start about a thousand Python processes; with PYTHONDONTWRITEBYTECODE set (some shells and
    # images set it) each one compiles every module it imports again. Let them cache bytecode, as .ci/run
    # does (2026-11-28, 2 cores: `pytest -m "not slow"` 102-106 s with it set, 76 s without).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if hasattr(config, "workerinput"):  # an xdist worker: its children inherit one thread too
        os.environ["OMP_NUM_THREADS"] = "1"
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)
    elif config.getoption("numprocesses", None) and not config.getoption("testrunuid", None):
        config.option.testrunuid = uuid.uuid4().hex  # the workers' too: names the run's files
    _check_kernel_path()


EXPECT_CPU_CAPABILITY = "GPUVAL_EXPECT_CPU_CAPABILITY"  # tests/test_kernel_paths.py's child runs set it


def _check_kernel_path() -> None:
    """Where GPUVAL_EXPECT_CPU_CAPABILITY is set (test_kernel_paths.py's child runs), torch must run the
    vectorised kernels it names, before any test: a run left on another path (ATEN_CPU_CAPABILITY mistyped,
    or naming a path this CPU lacks) would pass as a test of the wrong one."""
    expected = os.environ.get(EXPECT_CPU_CAPABILITY)
    if not expected:
        return
    import torch

    actual = torch.backends.cpu.get_cpu_capability()
    if actual != expected:
        raise pytest.UsageError(
            f"{EXPECT_CPU_CAPABILITY}={expected}, but torch runs its {actual} kernels "
            f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', '')!r})"
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and config.getoption("testrunuid", None):
        for path in _run_files(config.option.testrunuid).parent.glob(
            f"gpuval-tests-{config.option.testrunuid}.*"
        ):
            path.unlink(missing_ok=True)


def _lock(path: Path, operation: int) -> int:
    """An open descriptor of PATH holding flock OPERATION; closing it releases the lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, operation)
    return fd


SHARED_LOCKS = "GPUVAL_TESTS_LOCKS"  # a path stem: test runs started with the same one share the CPU lock


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Where workers run, each test's setup, call and teardown hold the run's CPU lock: shared, or alone for
    a `serial` test, so no other test runs beside it. A test takes the turnstile before the CPU lock, and a
    serial one keeps it while it waits, so new tests cannot keep it waiting. Runs started with the same
    GPUVAL_TESTS_LOCKS share one lock (.ci/run's two torch versions at once)."""
    if not hasattr(item.config, "workerinput"):
        yield
        return
    alone = item.get_closest_marker("serial") is not None
    # .ci/run runs the lowest torch's tests beside the full suite: both take the locks it names
    shared = os.environ.get(SHARED_LOCKS)
    base = Path(shared) if shared else _run_files(item.config.workerinput["testrunuid"])
    turnstile = _lock(base.with_suffix(".turnstile"), fcntl.LOCK_EX)
    cpu = _lock(base.with_suffix(".cpu"), fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    if not alone:
        os.close(turnstile)
    else:  # no other test runs now; what they started (children, daemons) may still be ending
        _wait_for_quiet_cpu()
    try:
        yield
    finally:
        os.close(cpu)
        if alone:
            os.close(turnstile)


QUIET_BUSY = 0.25  # share of all cores busy that still counts as a quiet machine for a serial test
QUIET_WAIT_S = 30.0  # at most this long; a machine never quiet runs the test anyway (and it may fail)


def _cpu_busy(interval_s: float = 0.2) -> float | None:
    """The share of all cores busy over `interval_s`, from /proc/stat (None where there is none)."""

    def sample() -> tuple[int, int] | None:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    first = sample()
    time.sleep(interval_s)
    second = sample()
    if first is None or second is None or second[0] == first[0]:
        return None
    return 1.0 - (second[1] - first[1]) / (second[0] - first[0])


def _wait_for_quiet_cpu() -> None:
    """Before a `serial` test: wait (up to QUIET_WAIT_S) until the machine's cores are mostly idle, so the
    wall-clock bound it asserts measures its own work, not the tail of a test that just ended."""
    deadline = time.monotonic() + QUIET_WAIT_S
    while time.monotonic() < deadline:
        busy = _cpu_busy()
        if busy is None or busy <= QUIET_BUSY:
            return


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], dict]) -> dict:
    """make(FOLDER) -> a JSON-able dict, run once per test run: the first worker to get here makes it in a
    folder beside every worker's own temporary folder, under a lock; the others wait and read its dict."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder, done = root / name, root / f"{name}.json"
    lock = _lock(root / f"{name}.lock", fcntl.LOCK_EX)
    try:
        if not done.exists():
            folder.mkdir()
            done.write_text(json.dumps(make(folder)), encoding="utf-8")
    finally:
        os.close(lock)
    return json.loads(done.read_text(encoding="utf-8"))


@pytest.fixture(autouse=True)
def _launcher_variables_restored() -> Iterator[None]:
    """After each test, os.environ's launcher variables are what they were before it. A rank run in this
    process sets some (finetune/parallel/modes.py sets RANK, LOCAL_RANK and WORLD_SIZE for DeepSpeed), and
    under parallel workers any test may come next: TRL's SFTConfig, seeing LOCAL_RANK, starts a process
    group."""
    before = {key: value for key, value in os.environ.items() if is_launcher_variable(key)}
    yield
    for key in [key for key in os.environ if is_launcher_variable(key) and key not in before]:
        del os.environ[key]
    os.environ.update(before)


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


def cli_imports_torch(args: list[str], cwd: Path) -> tuple[int, str, bool]:
    """`gpuval ARGS` in a child process that says at its end whether anything imported torch: (its exit
    code, its stderr, whether torch was imported). What needs no tensor should not pay torch's 2-3 s."""
    child = (
        "import sys\n"
        f"sys.argv = ['gpuval', *{[str(a) for a in args]!r}]\n"
        "code = 0\n"
        "try:\n    from gpuval.cli import main\n    main()\n"  # the program, less its exit (gpuval.exiting)
        "except SystemExit as exit:\n    code = exit.code\n"
        "print(code, 'torch' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", child], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=60
    )
    code, imported = proc.stdout.split()[-2:]
    return int(code), proc.stderr, imported == "True"


@pytest.fixture(scope="session")
def gpuval() -> Callable[..., subprocess.CompletedProcess[str]]:
    """gpuval(args, cwd) -> CompletedProcess; session-scoped so module-scoped fixtures can use it."""
    return run_cli


def module_path(name: str) -> Path:
    """The test module of that file name, wherever it lies under tests/ (conftest's lists name modules by
    file name; the fine-tune's follow its subpackages: tests/finetune/step/, ...)."""
    (found,) = Path(__file__).parent.rglob(name)
    return found


# One shortened `finetune run` of the shipped CPU config (synth -> prepare -> LoRA -> eval, ~130 s of CPU on
# one thread), read by the tests that mark themselves with TINY_CPU_RUN: the learning test, and the tests of
# the run's files and of its console. The mark puts them on one worker, which makes the run once.
TINY_CPU_RUN = pytest.mark.xdist_group("tiny-cpu-run")
TINY_CPU_CONFIG = Path(__file__).parents[1] / "configs" / "finetune" / "tiny-cpu.yaml"
TINY_CPU_SHORT = {  # fewer records and steps, fewer examples scored
    "synth.n": 600,
    "synth.holdout_n": 80,
    "train.max_steps": 100,
    "train.save.every_steps": 0,
    "eval.max_examples": 40,
    "eval.base_max_examples": 16,  # the base, which never stops before max_new_tokens: one batch a split
}


@pytest.fixture(scope="session")
def tiny_cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """(the finished `gpuval finetune run`, its output folder) for TINY_CPU_SHORT; its exit status is the
    reading test's to check."""
    cwd = tmp_path_factory.mktemp("tiny-cpu-run")
    args = ["finetune", "run", "--config", str(TINY_CPU_CONFIG), "--output", "run"]
    for key, value in TINY_CPU_SHORT.items():
        args += ["--set", f"{key}={value}"]
    # tests/dist/warnhook: peft warns as a library does, whatever its release (test_finetune_quiet.py)
    hook = str(DIST / "warnhook")
    path = os.pathsep.join(p for p in (hook, os.environ.get("PYTHONPATH", "")) if p)
    env = cli_env(PYTHONPATH=path, GPUVAL_TEST_LIBRARY_WARNING="1")
    return run_cli(args, cwd, timeout=900, env=env), cwd / "run"


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


# --- floats summed in another order ------------------------------------------------------------------------
# Two computations of one quantity that add the same terms in another order (a product of other rows or
# columns, fused against unfused, chunked, sharded; another CPU's kernels or another thread count) agree to
# rounding, not bit for bit: they are compared by assert_close_to_scale. Bitwise equality is right only for
# values copied, selected or computed by the very same operations on the same shapes.

FLOAT64_REORDERED = 1e-9  # rel of assert_close_to_scale between two float64 computations of one quantity


def assert_close_to_scale(actual: Any, expected: Any, *, rel: float, msg: str | None = None) -> None:
    """`actual` equals `expected` within `rel` of the expected tensor's largest |value| plus `rel` of each
    element's own: torch.testing.assert_close with atol = rel × max|expected| and rtol = rel.

    Why scaled to the tensor: each addition of a sum rounds by at most the unit roundoff u (2^-24 ≈ 6e-8 in
    float32, 2^-53 ≈ 1.1e-16 in float64), so K products summed in another order differ by up to about
    K·u·Σ|terms| (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §3.1), typically
    √K·u·Σ|terms| as the roundings' signs are random (Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019).
    Σ|terms| is of the size of the tensor's values, not of 1: an absolute atol (torch.testing.assert_close's
    default is 1e-5 for float32) fails for gradients of size 40 on a CPU whose kernels add in another order
    (AVX-512 against AVX2, another thread count) and says nothing about values of size 1e-3. An element that
    is a cancellation (a gradient near zero, Σ|terms| ≫ |value|) errs by u times the size of its
    neighbours, not of itself: hence the tensor's largest value, besides each element's own (rtol).

    rel: where two algorithms agree exactly in exact arithmetic (fewer rows against all rows, fused against
    unfused, sharded against whole), run both in float64 and pass FLOAT64_REORDERED: 1e-9 is about 10^7 u,
    far above any reordering, and far below a real fault (a row dropped or counted twice moves values by a
    percent or more), whatever the kernels. A comparison that must stay in float32 or bfloat16 (a kernel
    that exists only there) states its rel beside it, from the dtype and the reduction's length.
    """
    import torch

    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    atol = rel * scale

    def message(generated: str) -> str:
        allowed = (
            f"allowed: {rel:g} of each value + {atol:.3g} ({rel:g} of the largest |expected|, {scale:.3g})"
        )
        return f"{msg + ': ' if msg else ''}{generated}\n{allowed}"

    torch.testing.assert_close(actual, expected, rtol=rel, atol=atol, msg=message)


ADAMW_STEPS_REL = (
    3e-2  # assert_close_to_adamw_steps: the share of the summed steps two trainings may differ by
)


def assert_close_to_adamw_steps(actual: Any, expected: Any, *, lr_sum: float, msg: str | None = None) -> None:
    """Weights that AdamW trained from one start, through float32 sums in another order (the trainer runs in
    float32 or bf16 only): every element within ADAMW_STEPS_REL of `lr_sum`, the steps' learning rates
    summed.

    Why that scale: AdamW moves a weight by lr·m/√v a step, a ratio of size about 1 whatever the gradient's,
    so training can move any weight by about lr_sum, not by a share of the weight (a LoRA A matrix keeps its
    random start, ~0.07 here, and moves by lr_sum at most; a B matrix starts at zero). The same ratio turns
    float32's rounding of a gradient element near zero (~1e-6 of the gradients' size) into a share of that
    element's step: seen up to 5e-4 of lr_sum after 3 steps (fused against unfused q/k/v on AVX2 kernels) and
    ~1.4e-2 after FSDP's reduce-scatter over 4 steps (test_finetune_train). A fault moves weights by whole
    steps: an adapter left untrained in one run differs by ~0.4 of lr_sum after 3 steps.
    """
    import torch

    atol = ADAMW_STEPS_REL * lr_sum

    def message(generated: str) -> str:
        allowed = (
            f"allowed: {atol:.3g} ({ADAMW_STEPS_REL:g} of the steps' summed learning rate, {lr_sum:.3g})"
        )
        return f"{msg + ': ' if msg else ''}{generated}\n{allowed}"

    torch.testing.assert_close(actual, expected, rtol=0, atol=atol, msg=message)


@pytest.fixture(scope="session")
def cpu_accept_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """(proc, OUT) of `gpuval accept --quick --output OUT --set health.shared_dir=OUT/../shared` on this
    machine (the cpu profile, two gloo ranks, a shared directory to check), which test_accept, test_metrics
    and test_report read: made once per test run (made_once). Every worker reads the same folder: copy a
    file before changing it or writing beside it."""

    def make(folder: Path) -> dict:
        out, shared = folder / "out", folder / "shared"
        shared.mkdir()
        args = ["accept", "--quick", "--output", str(out), "--set", f"health.shared_dir={shared}"]
        proc = run_cli(args, folder, timeout=240)
        return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr, "out": str(out)}

    run = made_once(tmp_path_factory, "cpu-accept", make)
    proc = subprocess.CompletedProcess(["gpuval", "accept"], run["returncode"], run["stdout"], run["stderr"])
    return proc, Path(run["out"])


@contextlib.contextmanager
def ends_within(seconds: int) -> Iterator[None]:
    """Fails the test, rather than hanging it, when the block runs longer (a loop that never ends)."""

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- the fine-tune's tests (tests/finetune/, by subpackage as src/gpuval/finetune/) -------------------------


@pytest.fixture(scope="module")
def train_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twelve synthetic Glaive records, prepared: one module's training file."""
    from gpuval.finetune.data.prepare import SourceRecord, convert_all
    from gpuval.finetune.data.synth import synth_records

    records = [SourceRecord(f"record {i}", r) for i, r in enumerate(synth_records(12, seed=3))]
    conversations, _skipped = convert_all(records)
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in conversations), encoding="utf-8")
    return path


@pytest.fixture
def runtime(no_launcher_env: None) -> Iterator[Any]:
    """A gloo process group of one in this process, shut down after the test."""
    from gpuval.runtime import init_runtime

    rt = init_runtime(timeout_s=30, backend="gloo")
    yield rt
    rt.shutdown()

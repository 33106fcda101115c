"""Starting one process per local GPU through torchrun's own engine (torch.distributed.launcher).

`gpuval accept` on a node with 8 GPUs, started without torchrun, runs itself under torchrun's elastic
agent with 8 local ranks — exactly what `torchrun --standalone --nproc-per-node=8 -m gpuval ...` does.
Workers report their exit code through a file, because the agent turns any non-zero worker exit into
its own failure and would blur FAIL (1) into a crash; a worker that really dies is reported as ERROR.

Process lifecycle (issue 19): every worker registers its pid in the exit folder and dies with the
launcher (PR_SET_PDEATHSIG); a watchdog thread in the launcher stops ranks that are still running a grace
period after another rank ended (a hung or stopped rank would otherwise keep the agent waiting for ever);
SIGINT/SIGTERM to the launcher stop every worker and end the run as `Interrupted` (exit 130/143).

`run_distributed` is what every command that runs ranks calls: it picks the number of local ranks
(`default_nproc`), refuses more ranks than GPUs, and either runs the work here or relaunches under the agent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from gpuval.errors import EXIT_ERROR, GpuvalError, Interrupted, LostPeers, RunError, UsageError, one_line
from gpuval.procstate import STATES, STOPPED, alive_child, state
from gpuval.rank_lines import (
    DECIDED,
    ENDED_PREFIX,
    EXIT_DIR_VARIABLE,
    ended_with,
    errors_said,
    gathered_line,
    report_error,
    report_exit,
)

LAUNCHER_PID_VARIABLE = "GPUVAL_LAUNCHER_PID"
PID_PREFIX = "pid-"
# Once a rank has ended, how long the others may take to end too before the launcher stops them: the
# group's collective timeout (the time a rank may wait for its peers), at most this many seconds.
MAX_GRACE_S = 20.0
SHUTDOWN_TIMEOUT_S = 5  # the agent's wait between SIGTERM and SIGKILL when it stops workers
# ... when they stop a soak: rank 0 then writes the summary of the iterations done, and its reports draw
# every judged series (report.html's soak figures: ~6 s of one core for 600 series). In 5 s on a loaded
# 2-core machine it was killed half-way and the summary lost (CI, 2026-12-07); torch 2.11's agent, which
# takes no shutdown_timeout, waits 30 s. A rank that ignores SIGTERM is killed at this bound.
SOAK_SHUTDOWN_TIMEOUT_S = 20


EXIT_DIR_PREFIX = "gpuval-exit-"


def sweep_dead_owners(prefix: str, temp: Path | None = None) -> None:
    """Remove temp folders named `<prefix><pid>-…` whose process is gone: one killed with SIGKILL runs no
    `finally`, and its folder would stay in /tmp for ever."""
    for folder in (temp or Path(tempfile.gettempdir())).glob(f"{prefix}*-*"):
        pid = folder.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _sweep_stale_exit_dirs(temp: Path | None = None) -> None:
    """Exit folders (the ranks' exit codes, pids, the training benchmark's scratch) of dead launchers."""
    sweep_dead_owners(EXIT_DIR_PREFIX, temp)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: not ours to judge
    return True


def launch_local(
    nproc: int, argv: list[str], timeout_s: float = 300.0, shutdown_s: float = SHUTDOWN_TIMEOUT_S
) -> int:
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    _quiet_agent()
    _sweep_stale_exit_dirs()
    exit_dir = Path(tempfile.mkdtemp(prefix=f"{EXIT_DIR_PREFIX}{os.getpid()}-"))
    os.environ[EXIT_DIR_VARIABLE] = str(exit_dir)
    os.environ[LAUNCHER_PID_VARIABLE] = str(os.getpid())
    # One OpenMP thread pool per rank must not oversubscribe the cores (torchrun's own default is 1).
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    # c10's own warnings (a store socket that timed out, printed by every waiting rank) repeat what the
    # run's one line says; the user's own level, where set, stands
    # (https://docs.pytorch.org/docs/stable/distributed.html#logging)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        logs_specs=DefaultLogsSpecs(log_dir=str(exit_dir / "logs")),  # not a torchelastic_* dir left in /tmp
        **_launch_options(LaunchConfig, shutdown_s),
    )
    watchdog = _Watchdog(exit_dir, nproc, grace_s=min(max(timeout_s, 1.0), MAX_GRACE_S), solo_s=timeout_s)
    watchdog.start()
    try:
        elastic_launch(config, entrypoint=sys.executable)("-m", "gpuval", *argv)
        codes = _reported(exit_dir)
        said = errors_said(exit_dir)
        if said:  # the ranks' errors, each rank's once, in one line (rank_lines.ended_with)
            code, line = ended_with(codes, said, nproc)
            if code in (UsageError.exit_code, RunError.exit_code):
                raise (UsageError if code == UsageError.exit_code else RunError)(line)
            print(f"gpuval: {one_line(line)}", file=sys.stderr, flush=True)  # beside rank 0's verdict
            return code
    except ChildFailedError as exc:
        said_line = gathered_line(errors_said(exit_dir), nproc)
        if watchdog.decided or (exit_dir / DECIDED).exists():
            # a rank printed the run's one line (gpuval.deadline) and stopped the silent ranks itself, maybe
            # before the watchdog looked: the agent saw them die, and that is no news to say again
            return EXIT_ERROR
        if watchdog.verdict:
            own = f"rank {watchdog.ended}'s own output above says why it ended"
            line = f"{said_line}; {watchdog.verdict}" if said_line else f"{watchdog.verdict}; {own}"
            raise RunError(line) from None
        if watchdog.lingered and _reported(exit_dir).keys() >= set(range(nproc)):
            return _reported(exit_dir).get(0, EXIT_ERROR)  # finally below still cleans up
        rank, failure = exc.get_first_failure()
        if said_line and (exit_dir / f"{ENDED_PREFIX}{rank}").exists():
            raise RunError(said_line) from None  # its end is in the line of the rank that ended it
        how = f"signal {-failure.exitcode}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
        died = f"rank {rank} died ({how}) before finishing"
        said_died = f"{said_line}; {died}" if said_line else f"{died}; its own output above says why"
        raise RunError(said_died) from None
    except (SignalException, Interrupted, KeyboardInterrupt) as exc:
        if isinstance(exc, SignalException):
            signum = int(exc.sigval)
        else:
            signum = exc.signum if isinstance(exc, Interrupted) else int(signal.SIGINT)
        _ignore_interrupts()  # a second Ctrl-C must not cut the clean-up short
        stopped = nproc - len(_reported(exit_dir))
        raise Interrupted(signum, f"{stopped} rank{'s' if stopped != 1 else ''} stopped") from None
    finally:
        watchdog.stop()
        # Whatever the agent left running (a rank it could not reap, an interrupt in its own clean-up) goes.
        _kill_workers(exit_dir, signal.SIGKILL)
        # Also after a dead rank or an interrupt: no exit folder is left behind in the temp directory.
        os.environ.pop(EXIT_DIR_VARIABLE, None)
        os.environ.pop(LAUNCHER_PID_VARIABLE, None)
        shutil.rmtree(exit_dir, ignore_errors=True)
    return codes.get(0, EXIT_ERROR)


def _launch_options(config_type: type, shutdown_s: float = SHUTDOWN_TIMEOUT_S) -> dict[str, object]:
    """LaunchConfig's optional fields that this torch has: they arrived over several releases
    (`signals_to_handle` in 2.10, `shutdown_timeout` in 2.12; docs/torch-versions.md), so each is passed
    only where the dataclass declares it. Without them the agent forwards SIGINT to the workers and waits
    its own default between SIGTERM and SIGKILL; the watchdog and `_kill_workers` still end every rank."""
    import dataclasses

    have = {field.name for field in dataclasses.fields(config_type)}
    wanted: dict[str, object] = {
        # SIGINT stays gpuval's own (cli.main: Interrupted, like KeyboardInterrupt): the agent then stops
        # the workers with SIGTERM, which ends them silently, instead of forwarding SIGINT to every rank.
        "signals_to_handle": "SIGTERM,SIGHUP,SIGQUIT",
        "shutdown_timeout": shutdown_s,
    }
    return {name: value for name, value in wanted.items() if name in have}


def _quiet_agent() -> None:
    """The agent's own warnings ("Received 15 death signal", "Sending process ... closing signal") and its
    "failed (exitcode: ...)" line repeat what gpuval says in its one line; its other errors still show."""
    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic."):
            logging.getLogger(name).setLevel(logging.ERROR)
    api = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    if not any(isinstance(f, _DropFailedLine) for f in api.filters):
        api.addFilter(_DropFailedLine())


class _DropFailedLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("failed (exitcode")


class _Watchdog(threading.Thread):
    """Ends the run when a rank outlives the others: once a rank has reported its exit code, every rank
    still running `grace_s` later is stopped with SIGKILL (the agent then sees it die and stops the run).

    A rank other than 0 that ended with exit 0 does not start the clock: rank 0 alone writes the results
    after the last collective. Then the clock is the collective timeout itself (at least the grace)."""

    def __init__(self, exit_dir: Path, nproc: int, grace_s: float, solo_s: float | None = None) -> None:
        super().__init__(name="gpuval-watchdog", daemon=True)
        self.exit_dir, self.nproc, self.grace_s = exit_dir, nproc, grace_s
        self.solo_s = max(solo_s if solo_s is not None else grace_s, grace_s)
        self.verdict = ""  # set when it stopped ranks that had not reported: the run's one-line error
        self.ended = 0  # then, the rank whose end started the clock
        self.lingered: list[int] = []  # ranks it stopped after they had reported their exit code
        self.decided = False  # the ranks ended the run on a deadline and said so (gpuval.deadline)
        self._done = threading.Event()

    def stop(self) -> None:
        self._done.set()
        if self.is_alive():
            self.join(timeout=5)

    def run(self) -> None:
        first: tuple[float, int, int] | None = None  # (monotonic time, rank, code) of the first report
        while not self._done.wait(0.2):
            if self._stop_decided():
                return
            codes = _reported(self.exit_dir)
            if not codes:
                continue
            if first is None:
                rank = min(codes, key=lambda r: (r != 0 and codes[r] == 0, r))
                first = (time.monotonic(), rank, codes[rank])
            elif first[1] != 0 and first[2] == 0 and (0 in codes or any(codes.values())):
                rank = 0 if 0 in codes else min(r for r, c in codes.items() if c)
                first = (time.monotonic(), rank, codes[rank])
            since, rank, code = first
            limit = self.solo_s if rank != 0 and code == 0 else self.grace_s
            waited = time.monotonic() - since
            if waited < limit and not code:
                continue
            pids = _worker_pids(self.exit_dir, self.nproc)
            hung = sorted(r for r in pids if r not in _reported(self.exit_dir) and alive_child(pids[r]))
            # after a rank ended with an error, one stopped by a signal cannot end on its own: no grace
            if waited < limit and not (hung and all(state(pids[r]) in STOPPED for r in hung)):
                continue
            if not hung:
                # Every rank reported; one that still has not exited long after (stuck on its way out)
                # goes too, and the run keeps the exit code it reported.
                lingering = [r for r in pids if alive_child(pids[r])]
                if lingering and time.monotonic() - since >= self.solo_s + self.grace_s:
                    self.lingered = lingering
                    for r in lingering:
                        _signal_group(pids[r], signal.SIGKILL)
                    return
                continue
            states = {r: state(pids[r]) for r in hung}
            names = ", ".join(
                f"rank {r}" + (f" ({STATES[s]})" if s in STATES else "") for r, s in states.items()
            )
            live = [r for r in hung if states[r] in ("S", "R")]
            self.verdict = (
                (
                    f"{names} still running {limit:g} s after rank {rank} ended (exit {code}): hung"
                    if waited >= limit
                    else f"{names} when rank {rank} ended (exit {code})"
                )
                + ", stopped by gpuval"
                + ("; its Python stack is above" if live else "")
            )
            self.ended = rank
            for r in live:  # a live rank prints its Python stack (faulthandler, worker_start) first
                _signal_group(pids[r], signal.SIGUSR1)
            if live:
                time.sleep(1.0)
            for r in hung:
                _signal_group(pids[r], signal.SIGKILL)
            return

    def _stop_decided(self) -> bool:
        """A rank decided the run is over (a rank silent or past its phase's deadline) and printed the line:
        the named ranks that have not reported go now (SIGKILL, the one signal a stopped process obeys),
        the others a grace period later if they still have not ended."""
        try:
            named = json.loads((self.exit_dir / DECIDED).read_text())
        except (OSError, ValueError):
            return False
        self.decided = True
        pids = _worker_pids(self.exit_dir)
        for r in named:
            if r in pids and r not in _reported(self.exit_dir) and alive_child(pids[r]):
                _signal_group(pids[r], signal.SIGKILL)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and not self._done.wait(0.2):
            if all(not alive_child(pid) for r, pid in pids.items() if r not in _reported(self.exit_dir)):
                return True
        _kill_workers(self.exit_dir, signal.SIGKILL)
        return True


def _reported(exit_dir: Path) -> dict[int, int]:
    codes = {}
    with contextlib.suppress(OSError):
        for path in exit_dir.iterdir():
            if path.name.isdigit():
                with contextlib.suppress(OSError, ValueError):
                    codes[int(path.name)] = int(path.read_text())
    return codes


def _worker_pids(exit_dir: Path, nproc: int = 0) -> dict[int, int]:
    """Rank -> pid of the workers that registered; with `nproc`, also those that did not (a rank stopped
    before gpuval's code ran), found among this launcher's children by the RANK the agent gave them."""
    pids = {}
    with contextlib.suppress(OSError):
        for path in exit_dir.iterdir():
            if path.name.startswith(PID_PREFIX) and path.name[len(PID_PREFIX) :].isdigit():
                with contextlib.suppress(OSError, ValueError):
                    pids[int(path.name[len(PID_PREFIX) :])] = int(path.read_text())
    if len(pids) < nproc:
        for rank, pid in _children_by_rank().items():
            pids.setdefault(rank, pid)
    return pids


def _children_by_rank() -> dict[int, int]:
    """Rank -> pid of this process's children that the agent started as workers (RANK in their
    environment, as /proc shows it to their owner)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not alive_child(int(entry.name)):
            continue
        with contextlib.suppress(OSError):
            for item in (entry / "environ").read_bytes().split(b"\0"):
                if item.startswith(b"RANK=") and item[5:].isdigit():
                    found[int(item[5:])] = int(entry.name)
    return found


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """The agent starts every worker in its own session: its process group is its pid."""
    with contextlib.suppress(OSError):
        os.killpg(pid, sig)


def _kill_workers(exit_dir: Path, sig: signal.Signals) -> int:
    """Signal every worker still running, those that never registered (stopped before gpuval ran) too."""
    killed = 0
    for pid in {**_children_by_rank(), **_worker_pids(exit_dir)}.values():
        if alive_child(pid):
            _signal_group(pid, sig)
            killed += 1
    return killed


def _ignore_interrupts() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, signal.SIG_IGN)


def worker_start() -> None:
    """At the start of a worker that launch_local started: die with the launcher, register the pid, and
    print the Python stack on SIGUSR1 (the watchdog asks for it before it stops a hung rank)."""
    exit_dir = os.environ.get(EXIT_DIR_VARIABLE)
    if not exit_dir or "RANK" not in os.environ:
        return
    launcher = os.environ.get(LAUNCHER_PID_VARIABLE, "")
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if launcher.isdigit() and os.getppid() != int(launcher):
            os._exit(EXIT_ERROR)  # the launcher died before the line above: nobody waits for this rank
    import faulthandler

    with contextlib.suppress(ValueError, OSError, AttributeError, RuntimeError):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    with contextlib.suppress(OSError):
        (Path(exit_dir) / f"{PID_PREFIX}{os.environ['RANK']}").write_text(str(os.getpid()))


def on_gpu() -> bool:
    """CUDA can use a GPU here. torch is imported only when a command needs to know, and not at all where it
    is a CPU build (2-3 s saved on a refusal); once imported, torch itself answers."""
    from gpuval.discover.gpus import cpu_build_of_torch

    if "torch" not in sys.modules and cpu_build_of_torch():
        return False
    import torch

    return torch.cuda.is_available()


def default_nproc(gpus_expected: bool = False, cpu_ranks: int = 2) -> int:
    """One rank per GPU CUDA can use; `cpu_ranks` CPU ranks on a machine without NVIDIA GPUs; one rank where
    the PCI bus or NVML show GPUs that CUDA cannot use, or the profile expects some (health says why, and no
    benchmark runs on the CPU in their place). The fine-tune asks for one CPU rank: ranks there would share
    the machine's few cores."""
    if on_gpu():
        import torch

        return torch.cuda.device_count()
    if cpu_ranks <= 1:
        return 1
    from gpuval.discover.gpus import gpus_here

    return 1 if gpus_expected or gpus_here() else cpu_ranks


def check_gpus_for(ranks: int) -> None:
    """More local ranks than GPUs would put two ranks on one GPU (NCCL refuses): say so before starting."""
    if not on_gpu():
        return
    import torch

    visible = torch.cuda.device_count()
    if visible and ranks > visible:
        raise UsageError(
            f"--nproc {ranks} asks for more ranks than the {visible} GPU(s) visible here; "
            f"use --nproc {visible} or fewer (one rank per GPU)"
        )


def run_distributed(
    nproc: int | None,
    work: Callable[[], int],
    extra_argv: tuple[str, ...] = (),
    gpus_expected: bool = False,
    timeout_s: float = 300.0,
    starting: Callable[[int], None] | None = None,
    shutdown_s: float = SHUTDOWN_TIMEOUT_S,
) -> int:
    """Run `work` here, or under torchrun's agent with one rank per local GPU when nothing launched us.

    `extra_argv` pins what the parent resolved (the output directory) so every worker uses the same;
    `gpus_expected`: the profile expects GPUs (no CPU ranks stand in for them); `timeout_s`: the
    collective timeout, which also bounds how long the launcher waits for a rank that outlives the others;
    `starting(ranks)`: called in the process the user started, once the ranks are known to be startable
    and before they start (their start-up takes seconds: the command says what starts first);
    `shutdown_s`: how long stopped ranks may take to end before they are killed (launch_local).
    """
    from gpuval.runtime import launcher_env

    ranks = nproc if nproc is not None else default_nproc(gpus_expected)
    single = launcher_env() == "single"
    if single and ranks > 1:
        check_gpus_for(ranks)
    if single and starting is not None:
        starting(ranks)
    if single and ranks > 1:
        return launch_local(ranks, [*sys.argv[1:], *extra_argv], timeout_s=timeout_s, shutdown_s=shutdown_s)
    try:
        code = work()
    except GpuvalError as exc:
        # Under gpuval's launcher the launcher says every rank's error once, in one line (gathered_line).
        # Under someone else's torchrun or srun, rank 0 says its own in the form main() uses; the others
        # only exit (the same error on every rank would be said once a rank).
        lost = isinstance(exc, LostPeers)
        if not report_error(one_line(str(exc)), lost) and os.environ.get("RANK", "0") == "0":
            print(f"gpuval: {one_line(str(exc))}", file=sys.stderr, flush=True)
        code = exc.exit_code
    except Exception as exc:  # unforeseen: ERROR, said by the rank that met it (it may be the only one)
        from gpuval.crash import as_error

        error = as_error(exc)
        if not report_error(one_line(str(error))):
            print(f"gpuval: {one_line(str(error))}", file=sys.stderr, flush=True)
        code = error.exit_code
    return report_exit(code)

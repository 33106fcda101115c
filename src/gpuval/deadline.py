"""Phases with deadlines, and a watchdog on every rank: a stopped, hung or dead rank ends the run.

A run is a sequence of phases (accept's health checks, each benchmark, each fine-tune step), each with the
seconds its plan says it should take at a pessimistic rate (`expected_s`, derived where the phase is
declared: bench/*.py, finetune/trainer.py). Its deadline is `expected_s + MARGIN_S`.

Every rank runs two daemon threads beside its main thread (collectives release the GIL, so they run while
the main thread waits in one):

- a heartbeat that writes (phase, its sequence number, expected seconds, seconds in it, a counter, where
  the main thread is) to the rendezvous store every `BEAT_S`, through a store client of its own with short
  timeouts (torchrun's agent hosts that store; under srun, rank 0 does);
- a watchdog that reads every rank's heartbeat (on the first `WATCHERS` ranks; the others only read the
  decision). A rank whose counter has not moved for `SILENT_S` is silent (a SIGSTOPped process's threads
  stop too; a dead one writes nothing); a store that no rank can reach for `SILENT_S` means the rank
  that hosts it is silent. A rank in a phase past its deadline has overrun it: the ranks named are those
  whose main thread is not waiting inside torch.distributed (the others wait for them), else the ranks
  behind the phase, else every rank in it.

The first decision is written to the store (first writer wins) and every rank acts on that one: the
lowest rank not named prints the one `gpuval:` line and SIGKILLs named ranks on its own host that are
silent (a stopped process only dies from SIGKILL); rank 0, if not named, writes the command's ERROR
result (`on_abort`); every rank that can still act ends with exit 3, through `rank_lines.report_exit` under
gpuval's own launcher, which then stops what is left at once (launch._Watchdog reads the decision).

Collective timeouts follow the deadlines: inside a phase the process group's timeout is the phase's
deadline plus `BACKSTOP_S`, so gpuval's line comes before NCCL's own watchdog fires (docs/deadlines.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

BEAT_S = 2.0  # seconds between heartbeats
SILENT_S = 20.0  # a rank whose heartbeat has not moved this long is silent: ten beats missed
MARGIN_S = 30.0  # a phase's deadline: its expected seconds (a pessimistic plan) plus this margin
BACKSTOP_S = 15.0  # the process group's timeout inside a phase: its deadline plus this
STORE_TIMEOUT_S = 5.0  # one store request of the heartbeat's own client
WATCHERS = 4  # ranks that read every heartbeat (the lowest ones); the others read the decision only
WRITE_WAIT_S = 15.0  # how long ranks wait for rank 0 to write its ERROR result before they leave
_PREFIX = "gpuval/deadline/"

# Training steps (finetune/trainer.py): the first one, with the model's build and compilation before it, is
# allowed FIRST_STEP_S; a later one STEP_FACTOR × the slowest step so far, at least STEP_FLOOR_S.
FIRST_STEP_S = 900.0  # a 7B model loaded from disk and torch.compile'd per decoder layer, with room to spare
STEP_FACTOR = 5.0
STEP_FLOOR_S = 10.0


def deadline_s(expected_s: float) -> float:
    """The seconds a phase may take before the run ends: its pessimistic plan plus the margin."""
    return max(expected_s, 0.0) + MARGIN_S


def pg_timeout_s(expected_s: float) -> float:
    """The process group's collective timeout inside a phase: a backstop just beyond gpuval's deadline."""
    return deadline_s(expected_s) + BACKSTOP_S


def step_expected_s(
    step_seconds: list[float],
    first_s: float = FIRST_STEP_S,
    factor: float = STEP_FACTOR,
    floor_s: float = STEP_FLOOR_S,
) -> float:
    """A training step's expected seconds from the steps measured so far: `factor` × the slowest (at least
    `floor_s`); before any step, `first_s` (model build, compilation and the first step)."""
    if not step_seconds:
        return first_s
    return max(factor * max(step_seconds), floor_s)


@dataclass
class _Phase:
    name: str
    expected_s: float
    seq: int
    began: float = field(default_factory=time.monotonic)


@dataclass
class Decision:
    """Why the run ends: the ranks named, and the one line that says it."""

    ranks: list[int]
    line: str
    silent: list[int] = field(default_factory=list)  # named ranks that were silent (to SIGKILL on a host)

    def to_json(self) -> str:
        return json.dumps({"ranks": self.ranks, "line": self.line, "silent": self.silent})

    @classmethod
    def from_json(cls, text: str | bytes) -> Decision:
        data = json.loads(text)
        return cls(list(data["ranks"]), str(data["line"]), list(data.get("silent", [])))


def printer(decision: Decision, world_size: int) -> int:
    """The rank that prints the line: the lowest one not named (rank 0 where every rank is named)."""
    healthy = [r for r in range(world_size) if r not in decision.ranks]
    return healthy[0] if healthy else 0


def decide(
    beats: dict[int, dict[str, Any]],
    quiet_s: dict[int, float],
    world_size: int,
    silent_s: float = SILENT_S,
    states: dict[int, str] | None = None,
) -> Decision | None:
    """The decision from every rank's latest heartbeat (`beats`, rank -> beat; a rank with none yet is
    left out) and how long each rank's counter has not moved (`quiet_s`), or None while all is well.
    `states`: what /proc says of a rank's process where the watcher shares its host ('stopped by a
    signal')."""
    live = {r for r in range(world_size) if not beats.get(r, {}).get("done")}
    silent = sorted(r for r in live if quiet_s.get(r, 0.0) >= silent_s)
    if silent:
        parts = []
        for r in silent:
            beat = beats.get(r, {})
            where = f"in phase '{beat['phase']}'" if beat.get("phase") else "outside any phase"
            if not beat:
                where = "before its first heartbeat"
            state = f" ({states[r]})" if states and states.get(r) else ""
            parts.append(f"rank {r}{state} silent for {quiet_s[r]:.0f} s {where}")
        line = "; ".join(parts) + f" (no heartbeat; the limit is {silent_s:g} s): stopped by gpuval"
        return Decision(silent, line, silent)
    over = {
        r: beat
        for r, beat in beats.items()
        if r in live and beat.get("phase") and beat["age_s"] > deadline_s(beat["expected_s"])
    }
    if not over:
        return None
    top = max(beat["seq"] for beat in over.values())
    late = sorted(r for r, beat in over.items() if not beat.get("waiting"))
    behind = sorted(r for r in live if r not in over and beats.get(r, {}).get("seq", -1) < top)
    working = [
        r
        for r in live
        if r not in over and beats.get(r, {}).get("seq") == top and not beats[r].get("waiting")
    ]
    if not late and not behind and working:
        # Only ranks that wait for the others are over so far, and a rank still works in the same phase:
        # its own beat passes the deadline within a beat or two (it began the phase a little later), and
        # it, not the ranks waiting for it, is the one to name.
        return None
    named = late or behind or sorted(over)
    first = over[min(over)]
    parts = []
    for r in named:
        beat = beats.get(r, {})
        if r in over:
            parts.append(
                f"rank {r} still in phase '{beat['phase']}' {beat['age_s']:.0f} s after it began "
                f"(expected {beat['expected_s']:.0f} s + {MARGIN_S:g} s margin)"
                + (f", at {beat['where']}" if beat.get("where") else "")
            )
        else:
            inside = f"in phase '{beat['phase']}'" if beat.get("phase") else "outside any phase"
            parts.append(f"rank {r} behind, {inside}")
    line = "; ".join(parts)
    if named == behind:
        line += f", while the others waited {first['age_s']:.0f} s in phase '{first['phase']}'"
    return Decision(named, line + ": hung, stopped by gpuval")


def main_thread_place() -> tuple[str, bool]:
    """Where the main thread is ('function (file:line)' of its innermost frame) and whether it waits
    inside torch.distributed (a collective or the store), i.e. for other ranks."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return "", False
    where = f"{frame.f_code.co_name} ({os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno})"
    waiting = False
    while frame is not None:
        if f"torch{os.sep}distributed{os.sep}" in frame.f_code.co_filename:
            waiting = True
            break
        frame = frame.f_back
    return where, waiting


class Monitor:
    """The heartbeat and the watchdog of one rank (module docstring)."""

    def __init__(self, runtime: Any, on_abort: Callable[[str], None] | None = None) -> None:
        self.rank, self.world_size = runtime.rank, runtime.world_size
        self.runtime = runtime
        self.on_abort = on_abort
        self.host = socket.gethostname()
        self.stack: list[_Phase] = []
        self.seq = 0
        self.count = 0
        self.done = False
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._store: Any = None
        self._threads = [
            threading.Thread(target=self._beat_loop, name="gpuval-heartbeat", daemon=True),
            threading.Thread(target=self._watch_loop, name="gpuval-deadline", daemon=True),
        ]

    # -- the store ------------------------------------------------------------------------------------------
    def _connect(self) -> Any:
        import torch.distributed as dist

        if self._store is None:
            self._store = dist.TCPStore(
                os.environ.get("MASTER_ADDR", "127.0.0.1"),
                int(os.environ.get("MASTER_PORT", "0")),
                is_master=False,
                timeout=timedelta(seconds=STORE_TIMEOUT_S),
                wait_for_workers=False,
            )
        return self._store

    def _store_call(self, call: Callable[[Any], Any]) -> Any:
        """One request through the heartbeat's own client; None and a new client next time on failure."""
        with self._lock:
            try:
                return call(self._connect())
            except Exception:  # unreachable, timed out, closed: the caller counts how long
                self._store = None
                raise

    # -- the phases -----------------------------------------------------------------------------------------
    def enter(self, name: str, expected_s: float) -> None:
        self.seq += 1
        self.stack.append(_Phase(name, expected_s, self.seq))
        _set_timeout(self.runtime, pg_timeout_s(expected_s))
        self._publish()  # now, not at the next beat: a rank stopped right after says which phase it was in

    def _publish(self) -> None:
        # made and sent under the lock: a beat made before stop() never lands after its 'done'
        with self._lock, contextlib.suppress(Exception):  # unreachable: the watchdog counts how long
            beat = json.dumps(self.beat())
            self._store_call(lambda store: store.set(f"{_PREFIX}beat/{self.rank}", beat))

    def leave(self) -> None:
        self.stack.pop()
        if self.stack:  # the phase around it starts its clock again (its plan excludes the inner one)
            outer = self.stack[-1]
            self.stack[-1] = _Phase(outer.name, outer.expected_s, outer.seq)
            _set_timeout(self.runtime, pg_timeout_s(outer.expected_s))
        else:
            _set_timeout(self.runtime, self.runtime.timeout_s)

    def beat(self) -> dict[str, Any]:
        self.count += 1
        top = self.stack[-1:]  # the main thread may leave the phase meanwhile
        current = top[0] if top else None
        where, waiting = main_thread_place()
        return {
            "count": self.count,
            "phase": current.name if current else "",
            "seq": current.seq if current else self.seq,
            "expected_s": current.expected_s if current else 0.0,
            "age_s": time.monotonic() - current.began if current else 0.0,
            "where": where,
            "waiting": waiting,
            "pid": os.getpid(),
            "host": self.host,
            "done": self.done,
        }

    # -- the threads ----------------------------------------------------------------------------------------
    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """This rank is done: said in one last heartbeat, so that no rank takes its quiet for silence."""
        self.done = True
        self._stop.set()
        self._publish()

    def _beat_loop(self) -> None:
        while not self._stop.is_set():
            self._publish()
            self._stop.wait(BEAT_S)

    def _read_beats(self) -> dict[int, dict[str, Any]]:
        keys = [f"{_PREFIX}beat/{r}" for r in range(self.world_size)]

        def read(store: Any) -> dict[int, dict[str, Any]]:
            beats = {}
            for r, key in enumerate(keys):
                if store.check([key]):
                    beats[r] = json.loads(store.get(key))
            return beats

        return self._store_call(read)

    def _watch_loop(self) -> None:
        began = time.monotonic()
        counts: dict[int, tuple[int, float]] = {}  # rank -> (last counter seen, when it last moved)
        reached = began  # when the store last answered
        watcher = self.rank < WATCHERS
        decision_key = f"{_PREFIX}decision"
        while not self._stop.wait(BEAT_S / 2):
            now = time.monotonic()
            decision = None
            try:
                if watcher:
                    beats = self._read_beats()
                    for r, beat in beats.items():
                        if counts.get(r, (None, 0.0))[0] != beat["count"]:
                            counts[r] = (beat["count"], now)
                    quiet = {r: now - counts.get(r, (0, began))[1] for r in range(self.world_size)}
                    quiet[self.rank] = 0.0  # this process is running this very code
                    found = decide(beats, quiet, self.world_size, states=self._states(beats, quiet))
                    if found is not None:
                        # the first decision written is every rank's (compare_set returns the stored one)
                        decision = Decision.from_json(
                            self._store_call(
                                lambda store, f=found: store.compare_set(decision_key, "", f.to_json())
                            )
                        )
                elif self._store_call(lambda store: store.check([decision_key])):
                    decision = Decision.from_json(self._store_call(lambda store: store.get(decision_key)))
                reached = now
            except Exception:
                if now - reached >= SILENT_S:
                    decision = self._store_lost(now - reached)
            if decision is not None and not self._stop.is_set():
                self._act(decision)
                return

    def _states(self, beats: dict[int, dict[str, Any]], quiet: dict[int, float]) -> dict[int, str]:
        """/proc's word on ranks of this host that are quiet (stopped by a signal, in a driver wait)."""
        from gpuval.procstate import describe_state

        return {
            r: describe_state(int(beat["pid"]))
            for r, beat in beats.items()
            if quiet.get(r, 0.0) >= SILENT_S and beat.get("host") == self.host and beat.get("pid")
        }

    def _store_lost(self, seconds: float) -> Decision:
        host = "rank 0, which hosts it under srun" if self.runtime.launcher == "slurm" else "torchrun's agent"
        named = [0] if self.runtime.launcher == "slurm" else []
        line = (
            f"the rendezvous store ({host}) did not answer for {seconds:.0f} s "
            f"(the limit is {SILENT_S:g} s): stopped by gpuval"
        )
        return Decision(named, line)

    def _act(self, decision: Decision) -> None:
        """End this rank on the run's decision. The console is the printer's one line alone: every rank's
        output (its main thread's errors as peers go, NCCL's watchdog) goes to /dev/null first, and no
        rank leaves (closing its connections) before rank 0 has written its ERROR result."""
        from gpuval.errors import EXIT_ERROR
        from gpuval.rank_lines import mark_decided, report_exit

        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        console = _silence_console()
        written_key = f"{_PREFIX}written"
        if self.rank == 0 and 0 not in decision.ranks:
            if self.on_abort is not None:
                with contextlib.suppress(Exception):  # no result written: the exit code still says ERROR
                    self.on_abort(decision.line)
            with contextlib.suppress(Exception):
                self._store_call(lambda store: store.set(written_key, "1"))
        elif 0 not in decision.ranks:
            deadline = time.monotonic() + WRITE_WAIT_S
            while time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    if self._store_call(lambda store: store.check([written_key])):
                        break
                time.sleep(0.2)
        if self.rank == printer(decision, self.world_size):
            with contextlib.suppress(OSError):
                os.write(console, f"gpuval: {decision.line}\n".encode())
            mark_decided(decision.ranks)
            self._kill_silent(decision.silent)
        os._exit(report_exit(EXIT_ERROR))

    def _kill_silent(self, ranks: list[int]) -> None:
        """SIGKILL silent ranks on this host (their last heartbeat names host and pid): a stopped process
        ignores every other signal, and the launcher (torchrun's agent, srun) would wait for it."""
        import signal

        from gpuval.procstate import is_gpuval

        with contextlib.suppress(Exception):
            beats = self._read_beats()
            for r in ranks:
                beat = beats.get(r, {})
                if beat.get("host") == self.host and beat.get("pid") and is_gpuval(int(beat["pid"])):
                    with contextlib.suppress(OSError):
                        os.kill(int(beat["pid"]), signal.SIGKILL)


def _silence_console() -> int:
    """Point this process's stdout and stderr (the file descriptors: C++ code writes there too) at
    /dev/null; returns a descriptor of the former stderr, for the one line."""
    console = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(null, fd)
    os.close(null)
    return console


def _set_timeout(runtime: Any, seconds: float) -> None:
    """The collective timeout of the default group (and the host barrier's gloo group) from now on, where
    this torch can change it (`_set_pg_timeout`, a private function present in 2.11 to 2.14)."""
    import torch.distributed as dist

    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None or not dist.is_initialized():
        return
    host_group = getattr(runtime, "_host_group", None)
    for group in [None] + ([host_group] if host_group is not None else []):
        with contextlib.suppress(Exception):
            setter(timedelta(seconds=seconds), group)


_MONITOR: Monitor | None = None


@contextlib.contextmanager
def watching(runtime: Any, on_abort: Callable[[str], None] | None = None) -> Iterator[Monitor | None]:
    """The heartbeat and the watchdog of this rank for the block (nothing in a run of one process).
    `on_abort(line)` runs on rank 0 when the run ends by a decision: the command's ERROR result."""
    global _MONITOR
    if runtime.world_size <= 1 or _MONITOR is not None:
        yield _MONITOR
        return
    monitor = Monitor(runtime, on_abort)
    _MONITOR = monitor
    monitor.start()
    try:
        yield monitor
    finally:
        monitor.stop()
        _MONITOR = None


@contextlib.contextmanager
def phase(name: str, expected_s: float) -> Iterator[None]:
    """A phase of the run that should take `expected_s` seconds (its plan at a pessimistic rate): past
    `deadline_s(expected_s)` the run ends naming the ranks still in it. Nothing without a monitor."""
    monitor = _MONITOR
    if monitor is None:
        yield
        return
    monitor.enter(name, expected_s)
    try:
        yield
    finally:
        monitor.leave()

"""Soak: the whole accept (health + benchmarks) repeated for hours, each iteration judged against the others.

Intermittent faults hide from a single run: a GPU that throttles after 20 minutes under load, an XID once an
hour, ECC counts that creep. `gpuval accept --duration 2h` / `--iterations N` repeats the accept (whichever
limit comes first), appends every iteration's full result to `iterations.jsonl`, and writes one summary
`result.json` whose checks are every iteration's checks at their worst plus the soak's own (docs/soak.md):

- `soak.iterations`: the headline, naming the first failing iteration; ERROR when the soak was cut short;
- `soak.<check>`: a check that was bad in some iterations and not in others (flapping, or a throttle
  reason or a WARN that appeared later);
- `soak.<benchmark check>`: a benchmark value that got worse than iteration 1's by more than the profile's
  `history.tolerance_pct` (the direction from gpuval.metrics);
- `soak.<counter>` / `soak.counters`: error counters that must not grow (ECC, remapped rows, retired pages,
  PCIe replays, NVLink errors from each iteration's NVML inventory; XIDs from the xid checks).

Ranks loop in lockstep: before each iteration rank 0 decides whether another one runs, and every rank learns
it (and any rank's pending stop request) from one all-gather. SIGINT/SIGTERM end the iteration in progress
(discarded: half an iteration is never judged), and rank 0 writes the summary of those done.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuval import __version__
from gpuval.checkref import SOAK, in_family, member_of
from gpuval.errors import GpuvalError, Interrupted, UsageError
from gpuval.jsonl import escape_breaks
from gpuval.launch import EXIT_DIR_VARIABLE
from gpuval.results import Check, Result, Status, verdict
from gpuval.soak_judge import Judged, judge, merge_checks, series_json

ITERATIONS_FILE = "iterations.jsonl"
_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str) -> float:
    """'90s', '30m', '2h', '1h30m', '1.5h' or plain seconds ('600') -> seconds; anything else is bad input."""
    cleaned = text.strip().lower()
    try:
        seconds = float(cleaned)
    except ValueError:
        parts = _DURATION.findall(cleaned)
        if not parts or "".join(f"{n}{u}" for n, u in parts) != cleaned:
            raise UsageError(
                f"--duration '{text}': write it as a number with a unit, e.g. 90s, 30m, 2h or 1h30m"
            ) from None
        seconds = sum(float(number) * _UNITS_S[unit] for number, unit in parts)
    if not seconds > 0 or seconds == float("inf"):
        raise UsageError(f"--duration '{text}': give a time above zero, e.g. 30m")
    return seconds


def format_duration(seconds: float) -> str:
    """7200 -> '2h', 5400 -> '1h30m', 90 -> '1m30s', 12.3 -> '12.3s'."""
    if seconds < 60:
        return f"{seconds:.3g}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{n}{u}" for n, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if n)


@dataclass(frozen=True)
class SoakPlan:
    """How long to repeat: `iterations`, `duration_s`, or both (whichever ends first)."""

    iterations: int | None = None
    duration_s: float | None = None

    def wants(self, iteration: int, elapsed_s: float) -> bool:
        """Whether iteration `iteration` (1-based) starts, `elapsed_s` into the soak. The first always does;
        none starts once the duration has passed (the one running then ends normally)."""
        if self.iterations is not None and iteration > self.iterations:
            return False
        return iteration == 1 or self.duration_s is None or elapsed_s < self.duration_s

    def describe(self) -> str:
        parts = [f"{self.iterations} iterations"] if self.iterations is not None else []
        if self.duration_s is not None:
            parts.append(format_duration(self.duration_s))
        return " or ".join(parts) + (", whichever ends first" if len(parts) > 1 else "")

    def to_json(self) -> dict[str, Any]:
        return {"iterations": self.iterations, "duration_s": self.duration_s}


def soak_plan(iterations: int | None, duration: str | None) -> SoakPlan | None:
    """The plan from accept's --iterations / --duration; None when neither is given (a single accept)."""
    if iterations is None and duration is None:
        return None
    if iterations is not None and iterations < 1:
        raise UsageError(f"--iterations {iterations}: give 1 or more")
    return SoakPlan(iterations, parse_duration(duration) if duration is not None else None)


class _StopRequest:
    """SIGINT/SIGTERM during a soak, on every rank. While an iteration runs ('armed') the first signal ends
    it at once (Interrupted); between iterations it is only noted, and the next decision stops the loop. A
    signal that lands inside an import is delivered again a moment later: an exception raised there may
    cross C++ (torch's extension init), where it would abort the process. A second signal ends the process
    the way a single accept's does."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.armed = False
        self._redelivering = False

    def _handle(self, signum: int, frame: Any) -> None:
        again = self.signum is not None and not self._redelivering
        self._redelivering = False
        if again:
            raise Interrupted(signum)
        self.signum = signum
        if not self.armed:
            return
        if _importing(frame):
            self._redelivering = True
            threading.Timer(0.05, signal.raise_signal, (signum,)).start()
            return
        self.armed = False
        raise Interrupted(signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[_StopRequest]:
        saved = {}
        try:
            for sig in self.SIGNALS:
                saved[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread (a test calling in): signals stay as they are
            pass
        try:
            yield self
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)

    @contextlib.contextmanager
    def arm(self) -> Iterator[None]:
        if self.signum is not None:  # asked to stop after the decision was taken: no new work
            raise Interrupted(self.signum)
        self.armed = True
        try:
            yield
        finally:
            self.armed = False


def _importing(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib."):
            return True
        frame = frame.f_back
    return False


@dataclass
class Ended:
    """Why a soak ended before its plan did: a signal, or an iteration that could not complete."""

    signum: int | None = None
    error: str = ""
    rank: int = 0

    def describe(self) -> str:
        if self.signum is None:
            return f"stopped: {self.error}"
        name = signal.Signals(self.signum).name
        if os.environ.get(EXIT_DIR_VARIABLE):  # gpuval's own launcher got the signal and stopped its ranks
            return f"stopped by {name} from gpuval's launcher (Ctrl-C or a signal to it)"
        return f"stopped by {name}" + (f" (to rank {self.rank})" if self.rank else "")


def _append(path: Path, result: Result) -> None:
    """One iteration's result.json as one line; flushed to disk before the next iteration starts."""
    with path.open("a", encoding="utf-8") as handle:
        handle.write(escape_breaks(result.model_dump_json(by_alias=True)) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def forget_earlier_run(output: Path) -> None:
    """Remove what an earlier run left in `output` that a reader would take for this soak's: its
    result.json (a verdict beside this run's exit code) and its iterations.jsonl."""
    for name in ("result.json", ITERATIONS_FILE):
        (output / name).unlink(missing_ok=True)


def read_summary(output: Path) -> Result | None:
    """The soak summary in `output`, or None when there is none (the soak did not get to write it)."""
    from gpuval.results import load_result

    path = output / "result.json"
    if not path.is_file():
        return None
    try:
        result = load_result(path)
    except GpuvalError:
        return None
    return result if "soak" in result.inventory else None


def _stopped_or(stop: _StopRequest, runtime: Any, error: str) -> Ended:
    """Why the soak ended when a collective broke: the stop request this rank received, if any (the
    launcher signals every rank at once, and a peer may leave before this rank reads its own signal),
    else `error`."""
    if stop.signum is not None:
        return Ended(signum=stop.signum, rank=runtime.rank)
    return Ended(error=error)


def run_soak(
    runtime: Any,
    plan: SoakPlan,
    iterate: Callable[[int], Result | None],
    output: Path,
    profile: Any,
    announce: Callable[[str], None] = lambda line: None,
) -> Result | None:
    """Run `iterate(k)` (one whole accept, on every rank) as the plan says; returns the summary on rank 0,
    None elsewhere. Every rank calls it; rank 0 alone writes `output/iterations.jsonl` (emptied first, and
    an older result.json removed, so nothing of an earlier run stands beside this one's)."""
    log = output / ITERATIONS_FILE
    if runtime.is_main:
        forget_earlier_run(output)
        log.write_text("", encoding="utf-8")
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    began = time.monotonic()
    done: list[Result] = []
    ended: Ended | None = None
    stop = _StopRequest()
    with stop.installed():
        iteration = 0
        while True:
            iteration += 1
            wanted = runtime.is_main and plan.wants(iteration, time.monotonic() - began)
            try:  # rank 0's decision and every rank's stop request, known alike on every rank
                votes = runtime.all_gather_object((wanted, stop.signum))
            except GpuvalError as exc:  # a peer gone (_stopped_or says why)
                ended = _stopped_or(stop, runtime, f"iteration {iteration} could not start: {exc}")
                break
            asked = [(rank, signum) for rank, (_, signum) in enumerate(votes) if signum is not None]
            if asked:
                ended = Ended(signum=asked[0][1], rank=asked[0][0])
                break
            if not votes[0][0]:
                break
            iteration_began = time.monotonic()
            try:
                with stop.arm():
                    result = iterate(iteration)
            except Interrupted as exc:
                ended = Ended(signum=exc.signum, rank=runtime.rank)
                break
            except GpuvalError as exc:  # a rank died or timed out: the group cannot run another iteration
                ended = _stopped_or(stop, runtime, f"iteration {iteration} could not complete: {exc}")
                break
            if result is not None:  # rank 0
                _append(log, result)
                done.append(result)
                announce(_progress_line(iteration, plan, result, time.monotonic() - iteration_began))
    if not runtime.is_main:
        return None
    return summarize(
        done,
        plan,
        ended,
        started_at=started_at,
        duration_s=time.monotonic() - began,
        profile=profile,
        world=runtime.world_info(),
    )


def _progress_line(iteration: int, plan: SoakPlan, result: Result, seconds: float) -> str:
    of = f" of {plan.iterations}" if plan.iterations is not None else ""
    bad = [f"{c.name} on {c.scope}" for c in result.checks if c.status in (Status.FAIL, Status.ERROR)]
    said = f" ({'; '.join(bad[:3])}{'; …' if len(bad) > 3 else ''})" if bad else ""
    return f"gpuval accept: iteration {iteration}{of}: {result.verdict.value} in {seconds:.1f} s{said}"


def summarize(
    iterations: list[Result],
    plan: SoakPlan,
    ended: Ended | None,
    *,
    started_at: str,
    duration_s: float,
    profile: Any,
    world: dict[str, Any],
) -> Result:
    """The soak's result.json: every iteration's checks at their worst, the soak checks, the last
    iteration's measurements and inventory, and `inventory.soak` (each iteration's verdict and every judged
    series, for the report)."""
    tolerance_pct = float(profile.history.tolerance_pct)
    judged = judge(iterations, tolerance_pct)
    headline, first_failing = _headline(iterations, plan, ended, judged)
    checks = merge_checks(iterations) + [headline, *judged.checks]
    last = iterations[-1] if iterations else None
    soak = {
        "asked": plan.to_json(),
        "completed": len(iterations),
        "stopped": ended.describe() if ended else None,
        "tolerance_pct": tolerance_pct,
        "first_failing_iteration": first_failing,
        "iterations": [_iteration_row(k, r) for k, r in enumerate(iterations, 1)],
        "series": series_json(judged.series),
    }
    inventory = {**(last.inventory if last else {}), "soak": soak}
    settings = {
        **(last.settings if last else {"profile": profile.model_dump(mode="json")}),
        "soak": plan.to_json(),
    }
    return Result(
        verdict=verdict(checks),
        started_at=iterations[0].started_at if iterations else started_at,
        duration_s=round(duration_s, 3),
        profile=profile.name,
        world=last.world if last else world,
        inventory=inventory,
        measurements=last.measurements if last else [],
        checks=checks,
        gpuval_version=__version__,
        command=["gpuval", *sys.argv[1:]],
        settings=settings,
    )


def _iteration_row(iteration: int, result: Result) -> dict[str, Any]:
    bad = [f"{c.name} on {c.scope}" for c in result.checks if c.status in (Status.FAIL, Status.ERROR)]
    return {
        "iteration": iteration,
        "started_at": result.started_at,
        "duration_s": result.duration_s,
        "verdict": result.verdict.value,
        "problems": bad[:5] + ([f"{len(bad) - 5} more"] if len(bad) > 5 else []),
    }


def _headline(
    iterations: list[Result], plan: SoakPlan, ended: Ended | None, judged: Judged
) -> tuple[Check, int | None]:
    """`soak.iterations`, naming the first failing iteration; and that iteration's number (None if none)."""
    count = len(iterations)
    threshold = {"min": plan.iterations} if plan.iterations is not None else {}
    asked = f" ({plan.describe()} asked)"
    firsts: dict[int, list[str]] = {}
    for k, result in enumerate(iterations, 1):
        if result.verdict is Status.FAIL:
            failed = [f"{c.name} on {c.scope}" for c in result.checks if c.status is Status.FAIL]
            firsts.setdefault(k, []).extend(failed[:3])
    for (name, scope), first in judged.first_bad.items():
        plain = f"{member_of(name, SOAK) or name} on {scope}"  # the iteration's own FAIL says it already
        if plain not in firsts.get(first, []):
            firsts.setdefault(first, []).append(f"{name} on {scope}")
    first_failing = min(firsts) if firsts else None
    verdicts = _verdicts(iterations)
    errored = [k for k, r in enumerate(iterations, 1) if r.verdict is Status.ERROR]
    if first_failing is not None:
        status = Status.FAIL
        named = "; ".join(dict.fromkeys(firsts[first_failing]))
        detail = f"iteration {first_failing} is the first to fail: {named}; iterations: {verdicts}"
    elif ended is not None or not count:
        status = Status.ERROR
        detail = (
            f"the iterations done: {verdicts}" if count else "no iteration completed: nothing was measured"
        )
    elif errored:
        status = Status.ERROR
        detail = f"iteration {errored[0]} could not complete every check; iterations: {verdicts}"
    else:
        status = Status.PASS
        detail = (
            f"{count} iteration{'s' if count != 1 else ''}, every one PASS; no change between them FAILed"
        )
    if ended is not None:
        done = f"after {count} iteration{'s' if count != 1 else ''}{asked}"
        detail = (
            f"{ended.describe()} {done}: the iteration in progress was discarded and the soak did not run "
            f"its course; {detail}"
        )
    headline = Check(
        name=in_family(SOAK, "iterations"),
        status=status,
        value=count,
        threshold=threshold,
        unit="iterations",
        detail=detail,
    )
    return headline, first_failing


def _verdicts(iterations: list[Result]) -> str:
    """'1 PASS, 2 FAIL, 3 PASS'; past ten iterations, the count of each verdict and where the others were."""
    if len(iterations) <= 10:
        return ", ".join(f"{k} {r.verdict.value}" for k, r in enumerate(iterations, 1))
    by_verdict: dict[str, list[int]] = {}
    for k, result in enumerate(iterations, 1):
        by_verdict.setdefault(result.verdict.value, []).append(k)
    parts = []
    for verdict_name, numbers in by_verdict.items():
        where = (
            ""
            if verdict_name == "PASS"
            else f" ({', '.join(map(str, numbers[:5]))}{', …' if len(numbers) > 5 else ''})"
        )
        parts.append(f"{len(numbers)} {verdict_name}{where}")
    return ", ".join(parts)

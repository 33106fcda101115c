"""Running benchmarks on every rank and collecting their measurements at rank 0.

Each rank returns the measurements it owns (its GPU's, or its group's when it is the group's first rank);
the harness gathers them. An exception on any rank turns the benchmark into ERROR with its message, and
the benchmarks after it are not run: a process group that saw a failure cannot be trusted to time more.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuval import derived
from gpuval.bench.registry import BenchmarkSkipped, Context, all_benchmarks
from gpuval.bench.registry import producers as registry_producers
from gpuval.checkref import CheckRef
from gpuval.config import Profile
from gpuval.crash import save_traceback
from gpuval.deadline import phase
from gpuval.errors import UsageError
from gpuval.rank_lines import report_error
from gpuval.results import Measurement, Status

UNPLANNED_S = 600.0  # expected seconds of a benchmark that declares no plan of its own (registry.expected_s)


@dataclass
class Outcome:
    measurements: list[Measurement] = field(default_factory=list)
    not_run: dict[str, tuple[Status, str]] = field(default_factory=dict)  # benchmark -> (SKIP|ERROR, reason)
    durations_s: dict[str, float] = field(default_factory=dict)
    error_nodes: dict[str, set[str]] = field(default_factory=dict)  # benchmark -> nodes of its failed ranks


def plan_benchmarks(profile: Profile, quick: bool, on_gpu: bool) -> dict[str, Any]:
    """Benchmarks the profile needs, in registry order, each with validated options (exit 2 on a bad one)."""
    benchmarks = all_benchmarks()
    producers = registry_producers()
    needed: set[str] = set()
    for ref, threshold in profile.check_refs():
        kind = derived.get(ref.measurement)
        if kind is not None and kind.plan is not None:
            needed.add(kind.plan(ref, benchmarks, profile.name))
        elif ref.measurement in producers:
            decl = next(
                d for d in benchmarks[producers[ref.measurement]].metrics if d.name == ref.measurement
            )
            if decl.find(ref.metric) is None:
                close = difflib.get_close_matches(ref.metric, [m.key for m in decl.metrics], n=1)
                hint = f" (did you mean '{CheckRef(ref.measurement, close[0])}'?)" if close else ""
                raise UsageError(
                    f"profile '{profile.name}': check '{ref}': '{ref.measurement}' has no metric "
                    f"'{ref.metric}'{hint}; its metrics: {', '.join(m.key for m in decl.metrics)}"
                )
            needed.add(producers[ref.measurement])
            if threshold.by_gpus and not decl.by_gpu_count:
                raise UsageError(
                    f"profile '{profile.name}': check '{ref}': by_gpus is for measurements whose "
                    "figure depends on the GPU count (collectives, p2p); give min or max"
                )
        elif ref.measurement != "expect":
            raise UsageError(
                f"profile '{profile.name}': check '{ref}': nothing measures '{ref.measurement}'; "
                f"measured: {', '.join(sorted(producers))}"
            )
    for name in profile.benchmarks:
        if name not in benchmarks:
            raise UsageError(
                f"profile '{profile.name}': benchmarks.{name}: unknown benchmark; "
                f"available: {', '.join(sorted(benchmarks))}"
            )
        needed.add(name)

    plan: dict[str, Any] = {}
    for name, bench in benchmarks.items():
        if name not in needed:
            continue
        overrides = dict(profile.benchmarks.get(name, {}))
        if bench.plan is not None:
            mine = {ref.name: t for ref, t in profile.check_refs() if producers.get(ref.measurement) == name}
            overrides = bench.plan(overrides, mine)
        plan[name] = bench.make_options(
            overrides, quick, on_gpu, f"profile '{profile.name}': benchmarks.{name}"
        )
    return plan


def bench_options(name: str, assignments: dict[str, Any], quick: bool, on_gpu: bool) -> Any:
    return all_benchmarks()[name].make_options(assignments, quick, on_gpu, f"bench {name}")


def expected_benchmark_s(name: str, options: Any, runtime: Any) -> float:
    """The seconds benchmark NAME's plan takes at its pessimistic rates (its phase's deadline adds the
    margin, gpuval.deadline); UNPLANNED_S where it declares none or its estimate fails."""
    estimate = all_benchmarks()[name].expected_s
    if estimate is None:
        return UNPLANNED_S
    try:
        return float(estimate(options, runtime))
    except Exception:  # an estimate is never a reason to fail a run
        return UNPLANNED_S


def _lost_peers(exc: BaseException) -> bool:
    """Whether a benchmark's exception is a collective broken by another rank (NCCL's and newer gloo's
    DistBackendError): the consequence of that rank's error, not news of its own."""
    import torch.distributed as dist

    backend_error = getattr(dist, "DistBackendError", None)
    return backend_error is not None and isinstance(exc, backend_error)


def run_benchmarks(
    runtime: Any,
    plan: dict[str, Any],
    quick: bool,
    progress: Callable[[str, str], None] = lambda bench, message: None,
    after: Callable[[str], None] = lambda bench: None,
) -> Outcome:
    """Every benchmark of `plan` in order; `after(name)` is called on every rank once one has run."""
    import time

    outcome = Outcome()
    benchmarks = all_benchmarks()
    broken: str | None = None
    broken_on: set[str] = set()
    for name, options in plan.items():
        if broken is not None:
            outcome.not_run[name] = (Status.ERROR, f"not run: {broken}")
            outcome.error_nodes[name] = broken_on
            continue
        ctx = Context(runtime=runtime, quick=quick, progress=lambda message, n=name: progress(n, message))
        began = time.perf_counter()
        status: tuple[str, str] | None = None
        mine: list[Measurement] = []
        with phase(name, expected_benchmark_s(name, options, runtime)):
            try:
                mine = benchmarks[name].run(ctx, options)
            except BenchmarkSkipped as exc:
                status = ("SKIP", str(exc))
            except Exception as exc:  # a crash inside a benchmark is an ERROR of the run, never a pass
                where = save_traceback(exc)  # the line names the exception; the file keeps where it was
                status = (
                    "ERROR",
                    f"{name} failed on rank {runtime.rank}: {type(exc).__name__}: "
                    f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                    + (f" (traceback in {where})" if where else ""),
                )
                # Said at once, by the rank it happened on (under gpuval's launcher: left for it to say,
                # gathered with the other ranks'): if the other ranks are still inside this benchmark's
                # collectives, the next exchange breaks and this line is what explains it.
                if not report_error(status[1], lost=_lost_peers(exc)):
                    print(f"gpuval: {status[1]}", file=sys.stderr, flush=True)
            gathered = runtime.all_gather_object(([m.model_dump() for m in mine], status, runtime.node_name))
        outcome.durations_s[name] = time.perf_counter() - began
        after(name)
        statuses = [s for _, s, _ in gathered if s is not None]
        errors = [reason for kind, reason in statuses if kind == "ERROR"]
        if errors:
            outcome.not_run[name] = (Status.ERROR, errors[0])
            broken_on = {node for _, s, node in gathered if s is not None and s[0] == "ERROR"}
            outcome.error_nodes[name] = broken_on
            broken = f"an earlier benchmark failed ({errors[0]})"
            continue
        if statuses:
            outcome.not_run[name] = (Status.SKIP, statuses[0][1])
        for dumped, _, _ in gathered:
            outcome.measurements.extend(Measurement.model_validate(m) for m in dumped)
        progress(name, "done")
    return outcome

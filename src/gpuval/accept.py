"""The acceptance suite: inventory -> benchmarks -> checks -> verdict -> result.json + junit.xml."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from gpuval import __version__, derived
from gpuval.bench.registry import all_benchmarks
from gpuval.bench.registry import producers as benchmark_producers
from gpuval.bench.run import Outcome, run_benchmarks
from gpuval.checkref import DRIFT, CheckRef, in_family
from gpuval.checks import threshold_checks
from gpuval.config import Profile
from gpuval.deadline import phase
from gpuval.discover import node_inventory
from gpuval.health.arrivals import ArrivalWatch, annotate, arrival_checks, arrivals_of, with_arrival_checks
from gpuval.health.processes import level_of
from gpuval.health.run import families
from gpuval.remeasure import remeasure_noisy
from gpuval.results import Check, Result, Status, verdict
from gpuval.scope import Scope, node_of

# The health phase's expected seconds (its deadline adds gpuval.deadline's margin): no sizes to derive it
# from, so a fixed allowance for NVML and kernel-log reads, the SDC fingerprints' multiplies and the checks
# across nodes, generous next to the seconds it takes on a healthy node.
HEALTH_S = 180.0


def failed_nodes(checks: list[Check]) -> dict[str, str]:
    """Node -> its first failed health check, for every node that failed one."""
    failed: dict[str, str] = {}
    for check in checks:
        node = node_of(check.scope)
        if check.status is Status.FAIL and node is not None:
            failed.setdefault(node, f"{check.name} on {check.scope}")
    return failed


def busy_nodes(checks: list[Check]) -> dict[str, str]:
    """Node -> where another program holds its GPUs, for every node whose processes.foreign FAILed.

    Benchmarks beside another program measure the sharing, not the GPU (a second process multiplying
    halves matmul's rate; one holding memory makes them run out of it), and take longer the more they
    share: accept runs none of them there, so the verdict names the program in seconds.
    """
    busy: dict[str, str] = {}
    for check in checks:
        node = node_of(check.scope)
        if check.name == "processes.foreign" and check.status is Status.FAIL and node is not None:
            busy[node] = f"{busy[node]}, {check.scope}" if node in busy else check.scope
    return busy


def _excuse(checks: list[Check], failed: dict[str, str]) -> list[Check]:
    """Benchmark checks on a node that failed health are SKIP: its numbers would say nothing new."""
    out = []
    for check in checks:
        node = node_of(check.scope)
        if node in failed:
            check = check.model_copy(
                update={
                    "status": Status.SKIP,
                    "detail": f"node {node} failed health ({failed[node]}): its benchmarks are not judged",
                }
            )
        out.append(check)
    return out


def _blame_failed_nodes(outcome: Outcome, failed: dict[str, str]) -> set[str]:
    """A benchmark that crashed only on nodes that failed health (out of memory beside another program, say)
    becomes SKIP naming that failure as the likely cause, not an ERROR of the run; returns their names."""
    blamed = set()
    for name, (status, reason) in list(outcome.not_run.items()):
        nodes = outcome.error_nodes.get(name, set())
        if status is Status.ERROR and nodes and nodes <= failed.keys():
            causes = "; ".join(f"node {node} failed health ({failed[node]})" for node in sorted(nodes))
            outcome.not_run[name] = (Status.SKIP, f"{causes}, the likely cause of: {reason}")
            blamed.add(name)
    return blamed


_VISIBILITY = ("gpu.reachable", "cuda.visible")  # health checks that say why CUDA cannot use a node's GPUs


def _stranded(runtime: Any, profile: Profile) -> dict[str, str]:
    """Node -> why, for every node with a rank on the CPU although the node has NVIDIA GPUs (or the
    profile expects some): CUDA cannot use them there, and a benchmark would measure the CPU. The same
    on every rank, so that every rank skips the benchmarks alike."""
    from gpuval.health.cuda import cpu_rank_problem

    problem = None if runtime.on_gpu else cpu_rank_problem(profile.expect.gpu_count)
    return dict(sorted(pair for pair in runtime.all_gather_object((runtime.node_name, problem)) if pair[1]))


def _stranded_reason(stranded: dict[str, str], checks: list[Check]) -> tuple[str, list[Check]]:
    """Why no benchmark runs, naming the health check that explains each node (a visibility check first),
    and a FAIL for a node whose health explains nothing (its cuda family left out, say)."""
    causes, added = [], []
    for node, problem in stranded.items():
        bad = [c for c in checks if node_of(c.scope) == node and c.status in (Status.FAIL, Status.ERROR)]
        cause = next((c for c in bad if c.name in _VISIBILITY), bad[0] if bad else None)
        if cause is None:
            cause = Check(
                name="cuda.visible", status=Status.FAIL, scope=str(Scope.of_node(node)), detail=problem
            )
            added.append(cause)
        causes.append(f"{node}: {cause.name} {cause.status.value} on {cause.scope}")
    listed = "; ".join(causes)
    return f"not run: ranks run on the CPU where CUDA cannot use the node's GPUs ({listed})", added


def run_health_phase(
    runtime: Any,
    profile: Profile,
    command: Literal["accept", "health"] = "accept",
    history: Path | None = None,
    watch: ArrivalWatch | None = None,
) -> tuple[list[dict[str, Any]], list[Check]]:
    """Every node's inventory and health (on its first rank), the SDC fingerprints of every rank, and
    the checks across nodes. Returns (node inventories, checks) on rank 0; empty lists elsewhere.
    `command`: what runs them (health.foreign_processes 'auto' FAILs accept, WARNs health).
    `history`: accept's history database; kernel-log XIDs before a node's last passing run don't count.
    `watch`: begun on each node's first rank with the processes health saw (and gpuval's own)."""
    from gpuval.health.cuda import read_view
    from gpuval.health.fleet import heterogeneity_checks, shared_fs_checks
    from gpuval.health.job import for_job, job_gpus
    from gpuval.health.run import node_health
    from gpuval.health.sdc import run_sdc
    from gpuval.nvml import snapshot

    views = runtime.all_gather_object((runtime.node_name, read_view()))  # CUDA's view from every rank
    ranks = runtime.all_gather_object((runtime.node_name, os.getpid()))
    own_pids = {pid for node, pid in ranks if node == runtime.node_name}  # gpuval's ranks are not foreign
    mine = None
    if runtime.local_rank == 0:
        nvml = snapshot()
        if watch is not None:
            watch.begin(nvml, own_pids)
        here = [view for node, view in views if node == runtime.node_name]  # what the node's ranks see
        checks = node_health(
            profile,
            runtime.node_name,
            own_pids=own_pids,
            snapshot=nvml,
            exclude=frozenset({"sdc"}),  # run_sdc below compares every rank instead
            cuda=here,
            history=history,
            command=command,
        )
        inventory = for_job(node_inventory(runtime.node_name), job_gpus([v.given for v in here], nvml.gpus))
        mine = (inventory, [c.model_dump(mode="json") for c in checks])
    gathered = [part for part in runtime.all_gather_object(mine) if part is not None]
    sdc = run_sdc(runtime)
    shared = shared_fs_checks(runtime, profile.health.shared_dir) if profile.health.shared_dir else None
    if not runtime.is_main:
        return [], []
    nodes = [inventory for inventory, _ in gathered]
    checks = [Check.model_validate(c) for _, node_checks in gathered for c in node_checks]
    checks += sdc or []
    checks += shared or []
    if len(nodes) > 1:
        checks += heterogeneity_checks(nodes)
    return nodes, checks


def run_accept(
    runtime: Any,
    profile: Profile,
    plan: dict[str, Any],
    quick: bool,
    progress=lambda bench, message: None,
    history: Path | None = None,
) -> Result | None:
    """Run on every rank; returns the Result on rank 0 (None elsewhere).

    Health runs first. When a node fails it, the benchmarks that cross nodes (the collectives and the
    training step, which would run through that node) are not run, and the other benchmarks' checks on
    that node are SKIP with the reason; the verdict is FAIL.
    When a rank runs on the CPU of a node whose GPUs CUDA cannot use (or the profile expects GPUs), or
    another program holds a node's GPUs (processes.foreign FAIL), no benchmark runs at all: every
    benchmark check is SKIP naming why, and the verdict is health's FAIL.
    """
    started_at = datetime.now(timezone.utc)
    began = time.perf_counter()
    progress("health", "checking")
    watch = ArrivalWatch(runtime.node_name, runtime.on_gpu) if "processes" in families(profile) else None
    with phase("health", HEALTH_S):
        nodes, health_checks = run_health_phase(runtime, profile, history=history, watch=watch)
        failed = runtime.all_gather_object(failed_nodes(health_checks) if runtime.is_main else None)[0]
    progress("health", "done")
    not_run: dict[str, tuple[Status, str]] = {}
    stranded = _stranded(runtime, profile)
    if stranded:  # no benchmark on a CPU standing in for GPUs: health has the FAIL, the checks SKIP
        reason, added = _stranded_reason(stranded, health_checks)
        health_checks += added  # used on rank 0 alone, where health_checks holds every node's
        not_run = {name: (Status.SKIP, reason) for name in plan}
        for name in plan:
            progress(name, "skipped: CUDA cannot use the GPUs")
        plan = {}
    busy = runtime.all_gather_object(busy_nodes(health_checks) if runtime.is_main else None)[0]
    if busy and plan:  # another program shares the GPUs: every number would measure the sharing
        listed = "; ".join(f"{node}: {where}" for node, where in sorted(busy.items()))
        reason = f"not run: another program holds GPUs of node(s) {listed}: free them and rerun"
        not_run = {name: (Status.SKIP, reason) for name in plan}
        for name in plan:
            progress(name, "skipped: another program is on the GPUs")
        plan = {}
    crossing = [name for name in plan if all_benchmarks()[name].crosses_nodes] if failed else []
    if crossing:
        listed = "; ".join(f"{node}: {reason}" for node, reason in sorted(failed.items()))
        for name in crossing:
            not_run[name] = (
                Status.SKIP,
                f"not run: {name} would cross node(s) that failed health ({listed})",
            )
            progress(name, "skipped: a node failed health")
        plan = {name: options for name, options in plan.items() if name not in crossing}
    outcome = run_benchmarks(runtime, plan, quick, progress, watch.after if watch else lambda bench: None)
    outcome.not_run.update(not_run)
    world = runtime.world_info()
    gpus_per_node = max(1, world["size"] // max(1, world["nodes"]))  # by_gpus of what spans one node
    remeasure_noisy(runtime, profile, plan, quick, outcome, gpus_per_node, progress)
    arrived = arrivals_of(runtime.all_gather_object(watch.report() if watch else None))
    if not runtime.is_main:
        return None
    if arrived:  # a program that started on the GPUs mid-run: named, and beside every figure it touched
        added = arrival_checks(arrived, level_of(profile.health.foreign_processes, "accept"))
        health_checks = with_arrival_checks(health_checks, added)
    blamed = _blame_failed_nodes(outcome, failed)

    benchmarks = all_benchmarks()
    producers = benchmark_producers()
    ran = {name: benchmarks[name] for name in plan}
    measurements = outcome.measurements + derived.derive(outcome.measurements, ran)
    bench_checks = threshold_checks(profile, measurements, outcome.not_run, producers, gpus_per_node)
    bench_checks += derived.derived_checks(measurements)
    covered = {producers.get(ref.measurement) for c in bench_checks if (ref := CheckRef.read(c.name))}
    for name, (status, reason) in outcome.not_run.items():
        if (status is Status.ERROR or name in blamed) and name not in covered:
            bench_checks.append(Check(name=in_family(name, "run"), status=status, detail=reason))
    checks = health_checks + annotate(_excuse(bench_checks, failed), arrived, producers)
    return Result(
        verdict=verdict(checks),
        started_at=started_at.isoformat(timespec="seconds"),
        duration_s=round(time.perf_counter() - began, 3),
        profile=profile.name,
        world=runtime.world_info(),
        inventory={
            "nodes": nodes,
            "launcher": runtime.launcher,
            "benchmark_durations_s": {k: round(v, 3) for k, v in outcome.durations_s.items()},
            # the process group's forming on rank 0, its first collective included (runtime.JOIN_EXPECTED_S)
            **({"join_s": runtime.join_s} if getattr(runtime, "join_s", None) is not None else {}),
            **({"arrived_processes": [asdict(a) for a in arrived]} if arrived else {}),
        },
        measurements=measurements,
        checks=checks,
        gpuval_version=__version__,
        command=["gpuval", *sys.argv[1:]],
        settings={
            "profile": profile.model_dump(mode="json"),
            "quick": quick,
            "benchmarks": {name: options.model_dump(mode="json") for name, options in plan.items()},
        },
    )


def error_result(
    profile: Profile,
    detail: str,
    started_at: datetime,
    world: dict[str, Any],
    check: str = "run.error",
    inventory: dict[str, Any] | None = None,
) -> Result:
    """The record of a run that could not finish: verdict ERROR, one check (`check`) saying why."""
    checks = [Check(name=check, status=Status.ERROR, detail=detail)]
    return Result(
        verdict=verdict(checks),
        started_at=started_at.isoformat(timespec="seconds"),
        duration_s=round((datetime.now(timezone.utc) - started_at).total_seconds(), 3),
        profile=profile.name,
        world=world,
        inventory=inventory or {},
        checks=checks,
        gpuval_version=__version__,
        command=["gpuval", *sys.argv[1:]],
        settings={"profile": profile.model_dump(mode="json")},
    )


def write_error_result(
    output_dir: Path, profile: Profile, runtime: Any, started_at: datetime, line: str
) -> None:
    """The reports of a run that a rank ended before its end (gpuval.deadline): verdict ERROR, one check
    `run.ranks` saying why. Written on rank 0 by its watchdog while the main thread may still wait in a
    collective; never a PASS left behind."""
    inventory = {"launcher": runtime.launcher}
    result = error_result(profile, line, started_at, runtime.world_info(), "run.ranks", inventory)
    write_reports(result, output_dir)


def write_unfinished_result(
    output_dir: Path, profile: Profile, started_at: datetime, world: dict[str, Any], line: str
) -> None:
    """The reports of a run whose process group never formed (a rank that never joined): verdict ERROR,
    one check `run.ranks` with rank 0's line. A result.json this run wrote stays: it is the run's
    verdict. Written as far as it can be: the error being said is the run's own."""
    from gpuval.textfile import this_runs_result

    if this_runs_result(output_dir, started_at) is not None:
        return
    with contextlib.suppress(Exception):
        write_reports(error_result(profile, line, started_at, world, "run.ranks"), output_dir)


def write_error_reports(
    exc: Exception, output_dir: Path, profile: Profile, started_at: datetime, world: dict[str, Any]
) -> Exception:
    """An exception gpuval did not foresee, met while running accept: its traceback saved beside the
    reports, and result.json, junit.xml and report.html saying ERROR with its one line. Returns the
    RunError to raise (exit 3). A result.json this run already wrote stays: it is the run's verdict.
    An exception that only bad input causes is that input's UsageError (exit 2), with nothing written."""
    from gpuval.crash import as_error
    from gpuval.errors import UsageError

    error = as_error(exc, output_dir)
    if isinstance(error, UsageError):  # bad input (a path too long, say): refused, nothing written
        return error
    if not (output_dir / "result.json").exists():
        with contextlib.suppress(Exception):  # the one line still says what happened
            write_reports(error_result(profile, str(error), started_at, world), output_dir)
    return error


def with_drift(result: Result, history: Path | None, settings: Any) -> Result:
    """The result with its drift checks against the node's past runs added, and the verdict again.

    A history file that is not gpuval's (another program's, other columns, NULLs, corrupt pages) never
    gets here: `accept` refuses it before any work, in one line, exit 2 (history.open_history). One that
    turns bad during the run (another program wrote it, the disk failed) gives one ERROR check `drift`
    with that line instead: the run's measurements are kept in result.json, and its verdict says the run
    could not be judged in full, as when the run cannot be recorded there (write_reports)."""
    if history is None:
        return result
    from gpuval.errors import UsageError
    from gpuval.history import drift_checks

    try:
        drift = drift_checks(history, result, settings)
    except UsageError as exc:
        drift = [Check(name=DRIFT, status=Status.ERROR, detail=str(exc))]
    if not drift:
        return result
    arrived = arrivals_of([result.inventory.get("arrived_processes")])
    if arrived:  # a figure measured beside a program that arrived mid-run says so in its drift check too
        drift = annotate(drift, arrived, benchmark_producers())
    checks = result.checks + drift
    return result.model_copy(update={"checks": checks, "verdict": verdict(checks)})


REPORT_NAMES = ("result.json", "junit.xml", "report.html")


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__


def write_reports(result: Result, output_dir: Path, history: Path | None = None) -> tuple[Result, list[Path]]:
    """junit.xml, report.html and the history record first, result.json (the verdict's record) last.

    Returns the result as written and the paths. result.json is written atomically and only once
    everything before it is done, so a run killed while writing its reports leaves no verdict at all (an
    older result.json in the folder is removed first), never a PASS beside a dead run's exit code. When a
    report or the history record cannot be written, the result gets an ERROR check `report.write` saying
    why, so its verdict (and the exit code derived from it) is ERROR, or FAIL where hardware failed;
    junit.xml and report.html are then written again with it, as far as they can be. When result.json
    itself cannot be written, a RunError (exit 3) says so and no result.json is there.
    """
    from gpuval.errors import RunError
    from gpuval.report.html import write_html
    from gpuval.report.junit import write_junit

    verdict_file = output_dir / "result.json"
    writers = (
        ("junit.xml", lambda r: write_junit(r, output_dir / "junit.xml")),
        ("report.html", lambda r: write_html(r, output_dir / "report.html")),
    )
    try:
        verdict_file.unlink(missing_ok=True)  # an older run's verdict must not stand beside this run's exit
    except OSError as exc:
        raise RunError(f"{verdict_file}: cannot replace it ({_why(exc)}): pass another --output") from None
    problems = []
    for name, write in writers:
        try:
            write(result)
        except Exception as exc:  # any failure here makes the verdict ERROR, said in it
            problems.append(f"{name} could not be written ({_why(exc)})")
    if history is not None:
        from gpuval.history import record

        try:
            record(history, _errored(result, problems) if problems else result)
        except Exception as exc:
            problems.append(f"history database {history}: the run could not be recorded ({_why(exc)})")
    if problems:
        result = _errored(result, problems)
        for _name, write in writers:  # each report says the verdict the process exits with, if it can
            with contextlib.suppress(Exception):  # result.json, written next, has it in any case
                write(result)
    try:
        result.write(verdict_file)
    except Exception as exc:
        raise RunError(
            f"{verdict_file} could not be written ({_why(exc)}); the run's verdict was "
            f"{result.verdict.value}, and no result.json records it"
        ) from None
    return result, [output_dir / name for name in REPORT_NAMES]


def _errored(result: Result, problems: list[str]) -> Result:
    """The result with an ERROR check per problem: its verdict is ERROR unless hardware FAILed."""
    checks = result.checks + [
        Check(name="report.write", status=Status.ERROR, detail=f"{problem}: the run's reports are incomplete")
        for problem in problems
    ]
    return result.model_copy(update={"checks": checks, "verdict": verdict(checks)})

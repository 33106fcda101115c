"""The acceptance suite: inventory -> benchmarks -> checks -> verdict -> result.json + junit.xml."""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuval import __version__
from gpuval.bench.registry import all_benchmarks
from gpuval.checks import correctness_checks, outlier_measurements, threshold_checks
from gpuval.config import Profile
from gpuval.discover import node_inventory
from gpuval.health.gpu import expect_checks
from gpuval.results import Check, Result, Status, verdict
from gpuval.suite import run_benchmarks


def run_accept(
    runtime: Any, profile: Profile, plan: dict[str, Any], quick: bool, progress=lambda bench, message: None
) -> Result | None:
    """Run on every rank; returns the Result on rank 0 (None elsewhere)."""
    started_at = datetime.now(timezone.utc)
    began = time.perf_counter()
    inventories = runtime.all_gather_object(
        node_inventory(runtime.node_name) if runtime.local_rank == 0 else None
    )
    nodes = [inventory for inventory in inventories if inventory is not None]
    outcome = run_benchmarks(runtime, plan, quick, progress)
    if not runtime.is_main:
        return None

    benchmarks = all_benchmarks()
    producers = {produced: name for name, bench in benchmarks.items() for produced in bench.produces}
    outliers = {name: benchmarks[name].outlier_metrics for name in plan if benchmarks[name].outlier_metrics}
    measurements = outcome.measurements + outlier_measurements(outcome.measurements, outliers)
    checks = expect_checks(profile, nodes)
    checks += threshold_checks(profile, measurements, outcome.not_run, producers)
    checks += correctness_checks(measurements)
    covered = {producers.get(c.name.split(".")[0]) for c in checks}
    for name, (status, reason) in outcome.not_run.items():
        if status is Status.ERROR and name not in covered:
            checks.append(Check(name=f"{name}.run", status=Status.ERROR, detail=reason))
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


def write_reports(result: Result, output_dir: Path) -> list[Path]:
    from gpuval.report.junit import write_junit

    result.write(output_dir / "result.json")
    write_junit(result, output_dir / "junit.xml")
    return [output_dir / "result.json", output_dir / "junit.xml"]

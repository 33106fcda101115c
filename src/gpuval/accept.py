"""The acceptance suite: inventory -> benchmarks -> checks -> verdict -> result.json + junit.xml."""

from __future__ import annotations

import re
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
from gpuval.results import Check, Result, Status, verdict
from gpuval.suite import run_benchmarks


def expect_checks(profile: Profile, nodes: list[dict[str, Any]]) -> list[Check]:
    """GPU count, model and memory of every node against the profile's `expect` section."""
    expect = profile.expect
    checks: list[Check] = []
    for node in nodes:
        scope = f"node:{node['node']}"
        if expect.gpu_count is not None:
            found = node["gpu_count"]
            ok = found == expect.gpu_count
            checks.append(
                Check(
                    name="expect.gpu_count",
                    status=Status.PASS if ok else Status.FAIL,
                    value=found,
                    threshold={"equal": expect.gpu_count},
                    unit="GPUs",
                    scope=scope,
                    detail=f"{found} GPUs"
                    if ok
                    else f"{found} GPUs visible, {expect.gpu_count} expected: check "
                    f"the driver sees all of them (nvidia-smi), then reseat or replace the missing GPU",
                )
            )
        for gpu in node["gpus"]:
            gpu_scope = f"gpu:{node['node']}/{gpu['index']}"
            if expect.gpu_name is not None:
                ok = re.fullmatch(expect.gpu_name, gpu["name"]) is not None
                checks.append(
                    Check(
                        name="expect.gpu_name",
                        status=Status.PASS if ok else Status.FAIL,
                        scope=gpu_scope,
                        threshold={"match": expect.gpu_name},
                        detail=gpu["name"]
                        if ok
                        else f"'{gpu['name']}' is not '{expect.gpu_name}': wrong profile "
                        f"for this node (pass --profile) or a different GPU model installed",
                    )
                )
            if expect.gpu_memory_gib is not None:
                gib = gpu["memory_total_bytes"] / 2**30
                ok = gib >= expect.gpu_memory_gib
                checks.append(
                    Check(
                        name="expect.gpu_memory_gib",
                        status=Status.PASS if ok else Status.FAIL,
                        value=gib,
                        threshold={"min": expect.gpu_memory_gib},
                        unit="GiB",
                        scope=gpu_scope,
                        detail=f"{gib:.1f} GiB"
                        if ok
                        else f"{gib:.1f} GiB, {expect.gpu_memory_gib} expected: MIG "
                        f"or a memory fault may hide memory (nvidia-smi -q -d MEMORY)",
                    )
                )
    return checks


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

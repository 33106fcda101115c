"""Health of this node: read NVML once, run every registered family (less `health.skip`), make a Result."""

from __future__ import annotations

import difflib
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpuval import __version__
from gpuval.config import Profile
from gpuval.errors import UsageError
from gpuval.health.registry import HealthContext, all_checks, run_health
from gpuval.nvml import NvmlSnapshot
from gpuval.nvml import snapshot as read_snapshot
from gpuval.results import Check, Result, World, verdict

if TYPE_CHECKING:
    from gpuval.health.cuda import CudaView


def families(profile: Profile) -> set[str]:
    """The families to run: all registered ones but those in `health.skip` (an unknown name is an error)."""
    known = all_checks()
    for name in profile.health.skip:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UsageError(
                f"health.skip: unknown health check '{name}'{hint}; known: {', '.join(sorted(known))}"
            )
    return set(known) - set(profile.health.skip)


def node_health(
    profile: Profile,
    node: str,
    library: Any = None,
    root: Path = Path("/"),
    kmsg: Path | None = Path("/dev/kmsg"),
    own_pids: set[int] | None = None,
    snapshot: NvmlSnapshot | None = None,
    exclude: frozenset[str] = frozenset(),
    cuda: list[CudaView] | None = None,
    history: Path | None = None,
    command: Literal["accept", "health"] = "health",
) -> list[Check]:
    """Every health check of this node. `library` is pynvml or a replay; `snapshot` saves a second read;
    `command` is what runs them (a foreign process FAILs `accept` and WARNs `health` by default);
    `cuda`: the CUDA views of this node's ranks (accept), else this process reads its own."""
    from gpuval.health.job import given, job_gpus, others_check

    nvml = snapshot if snapshot is not None else read_snapshot(library)
    # the GPUs this job was given (the union over the node's ranks): the checks judge those alone
    job = job_gpus([view.given for view in cuda] if cuda is not None else [given()], nvml.gpus)
    judged = replace(nvml, gpus=[gpu for gpu in nvml.gpus if gpu.index in job.indices]) if job else nvml
    ctx = HealthContext(
        profile=profile,
        node=node,
        snapshot=judged,
        node_gpus=nvml.gpus if job else None,
        root=root,
        kmsg=kmsg,
        own_pids={os.getpid()} if own_pids is None else own_pids,
        library=library,
        cuda=cuda,
        history=history,
        command=command,
    )
    checks = run_health(ctx, families(profile) - exclude)
    return [*checks, others_check(node, job, nvml.gpus)] if job else checks


def health_result(
    profile: Profile,
    node: str,
    checks: list[Check],
    snapshot: NvmlSnapshot | None,
    started_at: str,
    duration_s: float,
    nodes: list[dict[str, Any]] | None = None,
    world: World | None = None,
) -> Result:
    """result.json of `gpuval health`: checks and what they judged (this node's NVML view, or every
    node's inventory when run across nodes); no measurements."""
    return Result(
        verdict=verdict(checks),
        started_at=started_at,
        duration_s=round(duration_s, 3),
        profile=profile.name,
        world=world or World(size=1, nodes=1, backend="none"),
        inventory={"nodes": nodes if nodes is not None else [{"node": node, "nvml": snapshot.to_json()}]},
        checks=checks,
        gpuval_version=__version__,
        command=["gpuval", *sys.argv[1:]],
        settings={"profile": profile.model_dump(mode="json")},
    )

"""Checks across nodes: every node runs the same software on the same hardware, and sees the same files.

- heterogeneity: rank 0 compares the nodes' inventories; a driver, NCCL, CUDA or GPU-count mismatch is a
  FAIL naming the odd nodes (a mixed fleet hangs or slows collectives in ways no benchmark explains);
  a torch mismatch is a WARN, and so are different NCCL/gloo variables (one node without the profile).
- shared file system (the seeds' validation playbook): rank 0 writes a token in the shared directory,
  the first rank of every node must read the same token back.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuval.atomic import write_text_atomic
from gpuval.checkref import FLEET, in_family
from gpuval.results import Check, Status
from gpuval.scope import Scope


def _dig(data: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def _gpu_models(inventory: dict[str, Any]) -> str:
    names = sorted(str(gpu.get("name")) for gpu in inventory.get("gpus", []))
    return ", ".join(f"{count}x {name}" for name, count in sorted(Counter(names).items())) or "no GPU"


def _communication(comm: dict[str, Any] | None) -> str | None:
    """'profile hgx-ib: NCCL_IB_HCA=mlx5 …' for comparing nodes; None where it was not recorded."""
    if comm is None:
        return None
    variables = " ".join(f"{key}={value}" for key, value in comm.get("variables", {}).items())
    return f"profile {comm.get('profile') or 'none'}: {variables or 'nothing set'}"


# (label, how to read it from a node inventory, status when nodes differ, what to do)
FIELDS: list[tuple[str, Callable[[dict[str, Any]], Any], Status, str]] = [
    ("gpu_count", lambda inv: inv.get("gpu_count"), Status.FAIL, "find the missing GPUs (gpuval health)"),
    ("gpu_models", _gpu_models, Status.FAIL, "one profile describes one hardware: split the job by model"),
    (
        "driver",
        lambda inv: _dig(inv, "software.driver_version"),
        Status.FAIL,
        "install one driver everywhere",
    ),
    (
        "cuda_driver",
        lambda inv: _dig(inv, "software.cuda_driver_version"),
        Status.FAIL,
        "install one driver everywhere",
    ),
    ("nccl", lambda inv: _dig(inv, "software.nccl"), Status.FAIL, "use one container image on every node"),
    (
        "cuda_runtime",
        lambda inv: _dig(inv, "software.cuda_runtime"),
        Status.FAIL,
        "use one container image on every node",
    ),
    ("torch", lambda inv: _dig(inv, "software.torch"), Status.WARN, "use one container image on every node"),
    (
        "communication_env",
        lambda inv: _communication(inv.get("communication")),
        Status.WARN,
        "set one NCCL environment profile on every node (deploy/env/, GPUVAL_ENV)",
    ),
]


def heterogeneity_checks(inventories: list[dict[str, Any]]) -> list[Check]:
    """One check per field: PASS when every node agrees, else the odd nodes named against the majority."""
    if len(inventories) < 2:
        return [
            Check(
                name=in_family(FLEET, "same_software"),
                status=Status.SKIP,
                scope="cluster",
                detail="one node: nothing to compare",
            )
        ]
    checks = []
    for label, read, status, advice in FIELDS:
        values = {inv.get("node", f"node{i}"): read(inv) for i, inv in enumerate(inventories)}
        majority, votes = Counter(map(str, values.values())).most_common(1)[0]
        odd = {node: value for node, value in values.items() if str(value) != majority}
        if not odd:
            checks.append(
                Check(
                    name=in_family(FLEET, label),
                    status=Status.PASS,
                    scope="cluster",
                    detail=f"{majority} on all {len(values)} nodes",
                )
            )
            continue
        listed = ", ".join(f"{node}: {value}" for node, value in sorted(odd.items()))
        checks.append(
            Check(
                name=in_family(FLEET, label),
                status=status,
                scope="cluster",
                detail=f"{len(odd)} of {len(values)} nodes differ from {majority} ({listed}): {advice}",
            )
        )
    return checks


def shared_fs_checks(runtime: Any, directory: Path) -> list[Check] | None:
    """Rank 0 writes a token in `directory`; the first rank of every node reads it back. Checks on rank 0."""
    token = uuid.uuid4().hex if runtime.is_main else None
    write_error = None
    if runtime.is_main:
        try:
            write_text_atomic(directory / f".gpuval-shared-{token}", token)
        except OSError as exc:
            write_error = f"{exc.strerror or exc}"
    token, write_error = runtime.all_gather_object((token, write_error))[0]
    runtime.host_barrier()
    seen = None
    if runtime.local_rank == 0 and write_error is None:
        try:
            seen = "same" if (directory / f".gpuval-shared-{token}").read_text() == token else "different"
        except OSError as exc:
            seen = f"unreadable ({exc.strerror or exc})"
    reports = runtime.all_gather_object((runtime.node_name, runtime.local_rank, seen))
    runtime.host_barrier()
    if not runtime.is_main:
        return None
    (directory / f".gpuval-shared-{token}").unlink(missing_ok=True)
    if write_error is not None:
        return [
            Check(
                name=in_family(FLEET, "shared_fs"),
                status=Status.ERROR,
                scope=str(Scope.of_node(runtime.node_name)),
                detail=f"cannot write a token in {directory} ({write_error}): pass a writable shared "
                "directory (--set health.shared_dir=PATH)",
            )
        ]
    checks = []
    for node, local_rank, result in reports:
        if local_rank != 0:
            continue
        if result == "same":
            status, detail = Status.PASS, f"sees rank 0's token in {directory}"
        else:
            status = Status.FAIL
            detail = (
                f"token in {directory} is {result} on this node: it is not the file system rank 0 "
                "wrote to; check the mount (findmnt) and that every node mounts the same export"
            )
        checks.append(
            Check(
                name=in_family(FLEET, "shared_fs"),
                status=status,
                scope=str(Scope.of_node(node)),
                detail=detail,
            )
        )
    return checks

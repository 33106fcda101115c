"""Checks across nodes: software/hardware heterogeneity and the shared-file-system token."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import run_dist_worker

from gpuval.health.fleet import heterogeneity_checks
from gpuval.results import Status

WORKER = Path(__file__).parent / "dist" / "fleet_worker.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


HGX_IB = {"profile": "hgx-ib", "variables": {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "mlx5"}}


def node(
    name: str,
    driver: str = "580.159.04",
    gpus: int = 8,
    nccl: str = "2.28.9",
    torch: str = "2.11.0",
    model: str = "NVIDIA H200",
    comm: dict | None = None,
) -> dict:
    return {
        "node": name,
        "gpu_count": gpus,
        "gpus": [{"name": model}] * gpus,
        "communication": comm if comm is not None else HGX_IB,
        "software": {
            "driver_version": driver,
            "cuda_driver_version": "13.0",
            "nccl": nccl,
            "cuda_runtime": "13.0",
            "torch": torch,
        },
    }


def by_name(checks):
    return {c.name: c for c in checks}


def test_identical_nodes_pass():
    checks = by_name(heterogeneity_checks([node("a"), node("b"), node("c")]))
    assert {c.status for c in checks.values()} == {Status.PASS}
    assert checks["fleet.driver"].detail == "580.159.04 on all 3 nodes"
    assert checks["fleet.gpu_models"].detail == "8x NVIDIA H200 on all 3 nodes"


def test_the_odd_driver_nccl_and_gpu_count_fail_by_node_torch_warns():
    checks = by_name(
        heterogeneity_checks(
            [
                node("a"),
                node("b", driver="570.86.15"),
                node("c", gpus=7, nccl="2.21.5"),
                node("d", torch="2.10.0"),
            ]
        )
    )
    assert checks["fleet.driver"].status is Status.FAIL
    assert "1 of 4 nodes differ from 580.159.04 (b: 570.86.15)" in checks["fleet.driver"].detail
    assert checks["fleet.gpu_count"].status is Status.FAIL and "(c: 7)" in checks["fleet.gpu_count"].detail
    assert checks["fleet.nccl"].status is Status.FAIL and "c: 2.21.5" in checks["fleet.nccl"].detail
    assert checks["fleet.torch"].status is Status.WARN and "d: 2.10.0" in checks["fleet.torch"].detail
    assert checks["fleet.cuda_runtime"].status is Status.PASS


def test_one_node_has_nothing_to_compare():
    [check] = heterogeneity_checks([node("a")])
    assert check.status is Status.SKIP


@pytest.mark.parametrize("odd_mount", [False, True])
@pytest.mark.dist
def test_shared_directory_token_seen_by_every_node(tmp_path, odd_mount):
    shared, odd = tmp_path / "shared", tmp_path / "node-b-local"
    shared.mkdir()
    odd.mkdir()
    out = tmp_path / "fleet.json"
    run_dist_worker(
        "fleet_worker.py", str(shared), str(odd) if odd_mount else "-", str(out), nproc=4, cwd=tmp_path
    )
    checks = {c["scope"]: c for c in json.loads(out.read_text())}
    assert set(checks) == {"node:node-a", "node:node-b"}  # one check per node, from its first rank
    assert checks["node:node-a"]["status"] == "PASS"
    if odd_mount:
        assert checks["node:node-b"]["status"] == "FAIL"
        assert "not the file system rank 0 wrote to" in checks["node:node-b"]["detail"]
    else:
        assert checks["node:node-b"]["status"] == "PASS"
    assert list(shared.iterdir()) == []  # the token is removed afterwards


def test_a_node_without_the_nccl_profile_is_named():
    bare = {"profile": None, "variables": {}}
    checks = by_name(heterogeneity_checks([node("a"), node("b", comm=bare), node("c")]))
    check = checks["fleet.communication_env"]
    assert check.status is Status.WARN
    assert "1 of 3 nodes differ from profile hgx-ib: NCCL_IB_DISABLE=0 NCCL_IB_HCA=mlx5" in check.detail
    assert "(b: profile none: nothing set)" in check.detail and "deploy/env/" in check.detail
    same = by_name(heterogeneity_checks([node("a"), node("b")]))["fleet.communication_env"]
    assert same.status is Status.PASS

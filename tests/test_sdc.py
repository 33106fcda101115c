"""Silent-data-corruption check: verdicts on hand-made fingerprints, and real ranks under torchrun."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import run_dist_worker

from gpuval.health.sdc import judge
from gpuval.results import Status

WORKER = Path(__file__).parent / "dist" / "sdc_worker.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def gpu(index: int, first: str, second: str | None = None, model: str = "NVIDIA H200 (132 SMs)") -> dict:
    return {"scope": f"gpu:n1/{index}", "model": model, "first": first, "second": second or first}


def statuses(checks):
    return {c.scope: c.status for c in checks}


def test_identical_results_pass():
    checks = judge([gpu(i, "aa" * 32) for i in range(4)])
    assert set(statuses(checks).values()) == {Status.PASS}
    assert all("bit-identical to 3 peer(s)" in c.detail for c in checks)


def test_the_odd_gpu_fails_by_name():
    checks = judge([gpu(0, "aa"), gpu(1, "aa"), gpu(2, "bb"), gpu(3, "aa")])
    assert statuses(checks) == {
        "gpu:n1/0": Status.PASS,
        "gpu:n1/1": Status.PASS,
        "gpu:n1/2": Status.FAIL,
        "gpu:n1/3": Status.PASS,
    }
    [bad] = [c for c in checks if c.status is Status.FAIL]
    assert "differs from 3 of 4" in bad.detail and "dcgmi diag" in bad.detail


def test_a_gpu_that_disagrees_with_itself_fails_even_alone():
    [check] = judge([gpu(0, "aa", "ab")])
    assert check.status is Status.FAIL and "two runs of one computation differ" in check.detail


def test_no_majority_fails_every_suspect_device():
    checks = judge([gpu(0, "aa"), gpu(1, "bb")])
    assert set(statuses(checks).values()) == {Status.FAIL}
    assert all("no majority" in c.detail for c in checks)


def test_models_are_compared_only_with_their_own_kind():
    checks = judge([gpu(0, "aa"), gpu(1, "aa"), gpu(2, "cc", model="NVIDIA H100 80GB HBM3 (132 SMs)")])
    assert set(statuses(checks).values()) == {Status.PASS}


@pytest.mark.parametrize(("bad", "expected_fail"), [(-1, set()), (2, {"cpu"})])
@pytest.mark.dist
def test_three_real_ranks_find_the_corrupting_one(tmp_path, bad, expected_fail):
    out = tmp_path / "sdc.json"
    run_dist_worker("sdc_worker.py", str(bad), str(out), nproc=3, cwd=tmp_path)
    checks = json.loads(out.read_text())
    assert len(checks) == 3
    failed = [c["scope"] for c in checks if c["status"] == "FAIL"]
    if bad < 0:
        assert failed == [] and {c["status"] for c in checks} == {"PASS"}
    else:
        assert len(failed) == 1 and failed[0].endswith(f"/{bad}")  # the scope names the bad rank


def test_a_cpu_fingerprint_runs_on_one_thread_whatever_the_process_uses(monkeypatch):
    """A CPU BLAS may choose its blocking by thread count and load: the CPU chain runs single-threaded,
    and the process's own thread count is left as it was."""
    import torch

    import gpuval.health.sdc as sdc

    seen: list[int] = []
    tanh = torch.tanh
    monkeypatch.setattr(torch, "tanh", lambda x: (seen.append(torch.get_num_threads()), tanh(x))[1])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = sdc.device_result(torch.device("cpu"), "cpu:n1/0", size=64, steps=3)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen == [1] * 6  # three steps, two runs
    assert result["first"] == result["second"]

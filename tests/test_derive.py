"""derive.py and `gpuval profiles derive`: the rule against hand-computed values on result files built here
from the real result model, its refusals, and the shipped profiles against their committed evidence."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuval.config import load_profile
from gpuval.derive import derive_bound, round_loose
from gpuval.derive_manifest import drifted, from_manifest
from gpuval.results import Check, Measurement, Result, Status, World

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "benchmarks" / "derivation.yaml"
GIB = 2**30

BASE = """\
name: test-h200
expect: {gpu_name: "NVIDIA H200"}
checks:
  matmul.bf16_tflops: {min: 1}
  all_reduce.busbw_gbps: {min: 1, bytes: 1GiB}
  outliers.matmul_pct: {max: 50}
"""


# ---- the rule ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "down", "rounded"),
    [
        (994.5, True, 994),
        (994.5, False, 995),
        (5.6833, False, 5.69),
        (49.345, True, 49.3),
        (20236, True, 20200),
    ],
)
def test_bounds_round_to_three_digits_towards_the_looser_side(value, down, rounded):
    assert round_loose(value, down) == rounded


def test_floor_is_the_worst_value_less_k_sample_deviations():
    # sd of 1000.5, 1002.5, 1004.5 is 2 (n - 1): 1000.5 - 3 x 2 = 994.5 -> 994
    assert derive_bound([1002.5, 1000.5, 1004.5], +1, 3.0, margin=0) == (994, 1000.5, 2.0)
    assert derive_bound([10.0, 12.0, 14.0], +1, 2.0) == (6, 10.0, 2.0)  # 2 x 2 = 4 > 3 % of 10


def test_the_margin_keeps_a_floor_off_runs_that_agree_too_closely():
    # 3 x sd = 6 < 3 % of 1000.5 = 30.015: 1000.5 - 30.015 = 970.485 -> 970
    assert derive_bound([1002.5, 1000.5, 1004.5], +1, 3.0) == (970, 1000.5, 2.0)
    # 4-GPU alltoall as measured in three runs of one call: 351.7-351.9 GB/s, sd 0.1
    assert derive_bound([351.9, 351.8, 351.7], +1, 3.0, margin=0)[0] == 351
    assert derive_bound([351.9, 351.8, 351.7], +1, 3.0)[0] == 341  # 351.7 x 0.97 = 341.149
    assert derive_bound([1.0, 2.0, 3.0], -1, 3.0, margin=0.5) == (6, 3.0, 1.0)  # 3 x 1 > 50 % of 3


def test_ceiling_is_the_worst_value_plus_k_sample_deviations():
    assert derive_bound([1.0, 2.0, 3.0], -1, 3.0) == (6, 3.0, 1.0)


def test_a_bound_never_passes_the_worst_clean_value():
    assert derive_bound([5.0, 5.0, 5.0], +1, 3.0, margin=0)[0] == 5.0
    assert derive_bound([5.0, 5.0, 5.0], -1, 3.0, margin=0)[0] == 5.0
    assert derive_bound([5.0, 5.0, 5.0], +1, 3.0)[0] == 4.85  # the margin alone: 5 x 0.97
    assert derive_bound([1.0, 50.0, 100.0], +1, 3.0)[0] == 0.0  # a spread past zero floors at zero


# ---- runs built from the real result model -----------------------------------------------------------------


def run_file(
    path: Path, gpus: int, matmul: list[float], all_reduce: float, outlier: float, **changes
) -> Path:
    measurements = [
        Measurement(name="matmul", scope=f"gpu:n1/{index}", metrics={"bf16_tflops": value})
        for index, value in enumerate(matmul)
    ]
    measurements += [
        Measurement(
            name="all_reduce",
            scope="cluster",
            params={"bytes": GIB, "ranks": gpus},
            metrics={"busbw_gbps": all_reduce},
        ),
        Measurement(
            name="all_reduce",
            scope="cluster",
            params={"bytes": 2**20, "ranks": gpus},
            metrics={"busbw_gbps": 9.0},
        ),
        Measurement(
            name="outliers", scope="gpu:n1/0", params={"benchmark": "matmul"}, metrics={"matmul_pct": outlier}
        ),
    ]
    result = Result(
        verdict=Status.PASS,
        started_at="2026-11-28T10:00:00+00:00",
        duration_s=60.0,
        profile="h200-sxm",
        world=World(size=gpus, nodes=1, backend="nccl"),
        inventory={"nodes": [{"gpus": [{"name": "NVIDIA H200"}] * gpus}]},
        measurements=measurements,
        checks=[Check(name="gpu.reachable", status=Status.PASS, scope="node:n1")],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(result.model_copy(update=changes).to_json(), encoding="utf-8")
    return path


@pytest.fixture
def runs(tmp_path) -> list[Path]:
    """Three 2-GPU and three 4-GPU runs: bf16 698 and 702 on every node, all_reduce 320/322/324 on two GPUs
    and 350 on four, the matmul outlier 1, 2, 3 % on each count."""
    made = []
    for gpus, busbw in ((2, [320.0, 322.0, 324.0]), (4, [350.0, 350.0, 350.0])):
        for index, (value, outlier) in enumerate(zip(busbw, [1.0, 2.0, 3.0], strict=True)):
            made.append(
                run_file(
                    tmp_path / f"x{gpus}-{index}" / "result.json",
                    gpus,
                    [698.0, 702.0] * (gpus // 2),
                    value,
                    outlier,
                )
            )
    return made


def test_derive_pools_per_gpu_metrics_and_splits_collectives_by_gpu_count(
    gpuval, write_profile, runs, tmp_path
):
    base = write_profile(BASE)
    out = tmp_path / "derived.yaml"
    proc = gpuval(  # --margin 0: the bounds below follow from k x sd alone, computed by hand
        ["profiles", "derive", *map(str, runs), "--base", str(base), "--output", str(out), "--margin", "0"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    derived = load_profile(str(out))
    checks = derived.checks
    # bf16: 18 values, nine 698 and nine 702: sd = sqrt(18 x 2^2 / 17); 698 - 3 sd = 691.83 -> 691
    assert 698 - 3 * math.sqrt(72 / 17) == pytest.approx(691.826, abs=1e-3)
    assert checks["matmul.bf16_tflops"].min == 691
    # the runs' inventories name no node: each run counts as one; spread sd 2.058 / median 700 = 0.29 %
    assert checks["matmul.bf16_tflops"].source.startswith(
        "derived from 6 runs on 6 nodes, 18 values (spread 0.29 %, none left out): min 698 - 3 x sd 2.06; "
    )
    # all_reduce at 1 GiB: 2 GPUs 320, 322, 324 (sd 2): 314; 4 GPUs 350 three times (sd 0): 350; no flat bound
    bound = checks["all_reduce.busbw_gbps"]
    assert (bound.min, bound.bytes) == (None, GIB)
    assert {count: entry.min for count, entry in bound.by_gpus.items()} == {2: 314, 4: 350}
    assert all(str(path) in bound.by_gpus[2].source for path in runs[:3])
    assert not any(str(path) in bound.by_gpus[2].source for path in runs[3:])
    # the outlier, lower is better: 1, 2, 3 twice: sd sqrt(0.8); 3 + 3 sd = 5.683 -> 5.69
    assert checks["outliers.matmul_pct"].max == 5.69
    assert derived.expect.gpu_name == "NVIDIA H200"  # the rest of the base kept
    assert f"wrote {out}" in proc.stdout


def test_base_defaults_to_the_profile_matching_the_runs_gpus(runs):
    from gpuval.derive import base_for
    from gpuval.derive_runs import load_run

    assert base_for([load_run(path) for path in runs], None).name == "h200-sxm.yaml"


def test_too_few_runs_is_one_line_exit_2_and_nothing_written(
    gpuval, assert_usage_error, write_profile, runs, tmp_path
):
    out = tmp_path / "derived.yaml"
    args = [
        "profiles",
        "derive",
        *map(str, runs[:2]),
        "--base",
        str(write_profile(BASE)),
        "--output",
        str(out),
    ]
    proc = gpuval(args, tmp_path)
    assert_usage_error(proc, "matmul.bf16_tflops: 2 clean run(s) measured it", "the rule needs 3")
    assert not out.exists()


def test_too_few_runs_at_one_gpu_count_names_the_count(write_profile, runs):
    from gpuval.derive import Rule, derive_profile
    from gpuval.derive_runs import load_run
    from gpuval.errors import UsageError

    loaded = [load_run(path) for path in runs[:5]]  # three runs on 2 GPUs, two on 4
    with pytest.raises(UsageError, match=r"all_reduce.busbw_gbps on 4 GPUs: 2 clean run\(s\) measured it"):
        derive_profile(write_profile(BASE), loaded, Rule())


def test_a_hand_set_bound_stays_where_runs_are_too_few(write_profile, runs):
    from gpuval.derive import Rule, derive_profile
    from gpuval.derive_runs import load_run

    base = BASE.replace(
        "all_reduce.busbw_gbps: {min: 1, bytes: 1GiB}",
        "all_reduce.busbw_gbps: {bytes: 1GiB, by_gpus: {4: {min: 340, source: 'hand-set: why'}, "
        "8: {min: 345, source: 'hand-set: none yet'}}}",
    )
    loaded = [load_run(path) for path in runs[:5]]
    text, _, derived = derive_profile(write_profile(base), loaded, Rule(margin=0))
    by_gpus = derived.checks["all_reduce.busbw_gbps"].by_gpus
    assert {count: entry.min for count, entry in by_gpus.items()} == {2: 314, 4: 340, 8: 345}
    assert by_gpus[8].source == "hand-set: none yet"
    assert yaml.safe_load(text)["name"] == "test-h200"


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"verdict": Status.ERROR}, "its verdict is ERROR"),
        (
            {
                "verdict": Status.FAIL,
                "checks": [Check(name="processes.foreign", status=Status.FAIL, scope="gpu:n1/0")],
            },
            "processes.foreign FAILed on gpu:n1/0: not a healthy node's run",
        ),
    ],
    ids=["error", "health-failed"],
)
def test_a_run_that_is_no_evidence_is_refused_by_name(
    gpuval, assert_usage_error, runs, tmp_path, changes, fragment
):
    bad = run_file(tmp_path / "bad" / "result.json", 2, [700.0, 700.0], 320.0, 1.0, **changes)
    out = tmp_path / "derived.yaml"
    proc = gpuval(["profiles", "derive", *map(str, runs), str(bad), "--output", str(out)], tmp_path)
    assert_usage_error(proc, f"{bad}: {fragment}")
    assert not out.exists()


def test_a_floor_fail_alone_does_not_refuse_a_run(runs, tmp_path):
    """A run that FAILed only a profile's floor is a clean run of healthy hardware: its values count."""
    from gpuval.derive_runs import load_run

    floor = Check(name="all_reduce.busbw_gbps", status=Status.FAIL, value=320.0, scope="cluster")
    path = run_file(
        tmp_path / "floor" / "result.json", 2, [700.0, 700.0], 320.0, 1.0, verdict=Status.FAIL, checks=[floor]
    )
    assert load_run(path).gpus_per_node == 2


def test_derive_needs_no_torch(runs, write_profile, tmp_path):
    out = tmp_path / "derived.yaml"
    code = (
        "import sys\nfrom gpuval.cli import app\n"
        f"args = ['profiles', 'derive', *{[str(p) for p in runs]!r}, '--base', {str(write_profile(BASE))!r}, "
        f"'--output', {str(out)!r}]\n"
        "try:\n    app(args, prog_name='gpuval', standalone_mode=False)\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout + proc.stderr
    assert out.exists()


# ---- the shipped profiles and their committed evidence -----------------------------------------------------


def test_shipped_profiles_follow_from_their_committed_runs():
    """benchmarks/derivation.yaml derived again: every bound of h100-sxm and h200-sxm must be what its runs
    give now. On failure: `gpuval profiles derive --manifest benchmarks/derivation.yaml` and commit."""
    derived = from_manifest(MANIFEST)
    assert sorted(one.name for one in derived) == ["h100-sxm", "h200-sxm"]
    for one in derived:
        assert one.path == REPO / "src" / "gpuval" / "profiles" / f"{one.name}.yaml"
        assert drifted(one) == [], f"{one.name}: re-derive with gpuval profiles derive --manifest {MANIFEST}"
        assert one.text == one.path.read_text(encoding="utf-8"), f"{one.name}: written by hand since derived"


def test_every_shipped_bound_names_its_source():
    for name in ("h100-sxm", "h200-sxm"):
        for check, threshold in load_profile(name).checks.items():
            bounds = [threshold] if threshold.flat else list(threshold.by_gpus.values())
            for bound in bounds:
                assert bound.source and bound.source.startswith(("derived from", "hand-set: ")), (name, check)


def test_manifest_check_mode_exits_0_when_profiles_follow(gpuval, tmp_path):
    proc = gpuval(["profiles", "derive", "--manifest", str(MANIFEST), "--check"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "follows from its runs" in proc.stdout


def test_keep_leaves_a_hand_set_check_underived_however_many_runs(write_profile, runs):
    """`--keep` (the manifest's `keep`): the outlier ceiling stays as set by hand with six runs at hand."""
    from gpuval.derive import Rule, derive_profile
    from gpuval.derive_runs import load_run

    base = write_profile(BASE.replace("{max: 50}", "{max: 5, source: 'hand-set: grows with the GPU count'}"))
    loaded = [load_run(path, skip=frozenset({"outliers.*"})) for path in runs]
    _, _, derived = derive_profile(base, loaded, Rule(margin=0))
    assert derived.checks["outliers.matmul_pct"].max == 5
    assert derived.checks["matmul.bf16_tflops"].min == 691

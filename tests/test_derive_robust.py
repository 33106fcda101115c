"""`gpuval profiles derive` against bad inputs: outliers left out by the modified z-score (gpuval.robust) and
named, floors that would pass a GPU at half speed refused, the base profile taken from the runs, folders of
result.json, and the evidence each bound's source records. Medians, MADs and bounds are computed by hand in
the comments; result documents are built from the real result model (tests/test_derive.py's helpers)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_derive import BASE, MANIFEST, run_file

from gpuval import robust
from gpuval.config import CountBound, Threshold, load_profile, resolve_profile_path
from gpuval.derive import Rule, base_for, derive_check, derive_profile, half_speed_limit
from gpuval.derive_manifest import from_manifest
from gpuval.derive_runs import Run, load_run, node_name
from gpuval.errors import UsageError
from gpuval.result_files import find_result_files
from gpuval.results import Check, Measurement, Result, Status, World

MIB = 2**20
CPU_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "sendrecv")


# ---- the rule on plain values ------------------------------------------------------------------------------


def test_a_value_far_below_the_median_is_left_out_by_its_modified_z_score():
    # median 10.0; |x - median| = 0, .2, .2, .1, 5 -> MAD .2; M(5.0) = 0.6745 x 5 / .2 = 16.86 > 3.5, 50 % off
    judged = robust.judge([10.0, 10.2, 9.8, 10.1, 5.0], +1)
    assert (judged.median, judged.mad) == (10.0, pytest.approx(0.2))
    assert [(o.index, o.value) for o in judged.outliers] == [(4, 5.0)]
    assert judged.outliers[0].z == pytest.approx(16.8625)
    assert judged.outliers[0].gap == pytest.approx(0.5)
    assert judged.outliers[0].why() == "50% from the median, modified z 16.9 > 3.5"
    # 9.8: M = 0.6745 x .2 / .2 = 0.67, kept
    assert robust.modified_z(9.8, 10.0, 0.2) == pytest.approx(-0.6745)


def test_a_tight_group_does_not_drop_its_noise():
    # median 100, MAD .1: M(95) = 0.6745 x 5 / .1 = 33.7 > 3.5, but 95 is only 5 % below: kept
    assert robust.judge([100.0, 100.1, 99.9, 100.0, 95.0], +1).outliers == ()
    # healthy lent H200s' host-to-device copies: 48.7 against a median near 55.1 (11.5 %), kept
    assert robust.judge([48.7, 55.0, 55.1, 55.2, 55.3], +1).outliers == ()


def test_with_a_mad_of_zero_the_gap_alone_decides():
    judged = robust.judge([50.0, 50.0, 50.0, 50.0, 20.0], +1)  # more than half equal: MAD 0
    assert [(o.value, o.z) for o in judged.outliers] == [(20.0, None)]
    assert judged.outliers[0].why() == "60% from the median, MAD 0 (the gap alone decides)"
    assert robust.judge([50.0, 50.0, 50.0, 45.0], +1).outliers == ()  # 10 % < 20 %


def test_only_the_bad_side_of_the_median_is_judged():
    values = [10.0, 10.0, 10.0, 10.0, 100.0]
    assert robust.judge(values, +1).outliers == ()  # a fast value is no fault
    assert [o.value for o in robust.judge(values, -1).outliers] == [100.0]  # a slow time is


def test_fewer_than_four_values_are_not_judged_and_half_bad_has_no_anchor():
    few = robust.judge([10.0, 10.0, 0.1], +1)
    assert (few.judged, few.outliers) == (False, ())
    # two at 1, two at 0.01: median .505, every |x - median| .495 = MAD, M = 0.67: no anchor, none left out
    half = robust.judge([1.0, 1.0, 0.01, 0.01], +1)
    assert (half.judged, half.median, half.outliers) == (True, pytest.approx(0.505), ())


@pytest.mark.parametrize(
    ("median", "direction", "gap_pct", "limit"),
    [(10.0, +1, False, 5.0), (10.0, -1, False, 20.0), (2.0, -1, True, 50.0), (0.0, -1, False, None)],
)
def test_the_half_speed_limit(median, direction, gap_pct, limit):
    assert half_speed_limit(median, direction, gap_pct) == limit


# ---- bad runs among clean ones leave every bound where the clean runs put it -------------------------------


@pytest.fixture
def clean(tmp_path) -> list[Path]:
    """test_derive's six runs: three of 2 GPUs (all_reduce 320, 322, 324), three of 4 (350), bf16 698, 702."""
    made = []
    for gpus, busbw in ((2, [320.0, 322.0, 324.0]), (4, [350.0, 350.0, 350.0])):
        for index, (value, outlier) in enumerate(zip(busbw, [1.0, 2.0, 3.0], strict=True)):
            path = tmp_path / "clean" / f"x{gpus}-{index}" / "result.json"
            made.append(run_file(path, gpus, [698.0, 702.0] * (gpus // 2), value, outlier))
    return made


def half_speed(tmp_path: Path) -> Path:
    """A 2-GPU node at half speed: every figure halved, its GPUs 40 % apart."""
    return run_file(tmp_path / "half" / "result.json", 2, [349.0, 351.0], 161.0, 40.0)


def one_percent(tmp_path: Path) -> Path:
    """A run at 1 % of the others that FAILed the profile's floor (still a run whose values count)."""
    fail = Check(name="matmul.bf16_tflops", status=Status.FAIL, value=6.98, scope="gpu:n1/0")
    return run_file(
        tmp_path / "slow" / "result.json", 2, [6.98, 7.02], 3.22, 99.0, verdict=Status.FAIL, checks=[fail]
    )


def bounds(profile_path: Path) -> dict[str, tuple]:
    """Every bound of a profile, without the sources: (min, max, {count: (min, max)})."""
    return {
        name: (t.min, t.max, {count: (b.min, b.max) for count, b in (t.by_gpus or {}).items()})
        for name, t in load_profile(str(profile_path)).checks.items()
    }


@pytest.mark.parametrize("bad", [half_speed, one_percent], ids=["half-speed", "one-percent-fail-run"])
def test_a_bad_run_among_clean_ones_moves_no_bound(gpuval, write_profile, clean, tmp_path, bad):
    base = str(write_profile(BASE))
    alone, mixed = tmp_path / "alone.yaml", tmp_path / "mixed.yaml"
    common = ["profiles", "derive", "--base", base, "--margin", "0"]
    proc = gpuval([*common, *map(str, clean), "--output", str(alone)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    planted = bad(tmp_path)
    proc = gpuval([*common, *map(str, clean), str(planted), "--output", str(mixed)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert bounds(mixed) == bounds(alone)
    assert bounds(alone)["matmul.bf16_tflops"][0] == 691  # test_derive's hand-computed floor
    assert bounds(alone)["all_reduce.busbw_gbps"][2] == {2: (314, None), 4: (350, None)}
    # each value left out is named: bf16 (2), all_reduce on 2 GPUs (1), the outliers gap (1)
    left = [line for line in proc.stdout.splitlines() if line.startswith("left out: ")]
    assert len(left) == 4, proc.stdout
    assert all(str(planted) in line for line in left)
    source = load_profile(str(mixed)).checks["matmul.bf16_tflops"].source
    assert "20 values" not in source and "18 values (spread 0.29 %, 2 left out)" in source
    assert str(planted) not in source
    # the 4-GPU all_reduce group has three values: too few to judge, and the output says so
    assert "all_reduce.busbw_gbps on 4 GPUs: 3 value(s), fewer than 4: no outlier judged" in proc.stdout


def test_each_value_left_out_is_one_line_with_its_run_scope_value_median_and_why(
    gpuval, write_profile, clean, tmp_path
):
    planted = half_speed(tmp_path)
    out = tmp_path / "derived.yaml"
    args = ["profiles", "derive", "--base", str(write_profile(BASE)), "--output", str(out)]
    proc = gpuval([*args, *map(str, clean), str(planted)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    # bf16: nine 698, nine 702, then 349 and 351: sorted, the 10th and 11th of 20 are 698, the median;
    # |x - 698|: 0 nine times, 4 nine times, 347, 349: MAD (4 + 4) / 2 = 4; M(349) = 0.6745 x 349 / 4 = 58.85
    assert (
        f"left out: matmul.bf16_tflops: {planted} gpu:n1/0 349 TFLOP/s, median 698 TFLOP/s: 50% from the "
        "median, modified z 58.9 > 3.5"
    ) in proc.stdout.splitlines()
    # all_reduce on 2 GPUs: 320, 322, 324, 161: median 321, |x - 321| = 1, 1, 3, 160: MAD (1 + 3) / 2 = 2;
    # M(161) = 0.6745 x 160 / 2 = 53.96
    assert (
        f"left out: all_reduce.busbw_gbps on 2 GPUs: {planted} cluster 161 GB/s, median 321 GB/s: 50% from "
        "the median, modified z 54 > 3.5"
    ) in proc.stdout.splitlines()


def test_a_run_whose_values_were_all_left_out_does_not_count_towards_min_runs(write_profile, tmp_path):
    # two clean 4-GPU runs (8 values) and one at half speed: without the rule three runs would be enough
    runs = [run_file(tmp_path / f"c{i}" / "result.json", 4, [700.0] * 4, 350.0, 1.0) for i in range(2)]
    runs.append(run_file(tmp_path / "half" / "result.json", 4, [350.0] * 4, 175.0, 1.0))
    base = write_profile("name: t\nchecks:\n  matmul.bf16_tflops: {min: 1}\n")
    notes: list[str] = []
    with pytest.raises(UsageError, match=r"matmul.bf16_tflops: 2 clean run\(s\) measured it \(.*\) once 4 "):
        derive_profile(base, [load_run(path) for path in runs], Rule(), notes=notes)
    assert sum(line.startswith("left out: matmul.bf16_tflops") for line in notes) == 4


# ---- floors that would catch no fault are refused ----------------------------------------------------------


def _run(label: str, node: str, **values: list[float]) -> Run:
    """A run of len(values) GPUs with the given per-GPU metrics of matmul and membw."""
    measurements = tuple(
        Measurement(name=key.split("_", 1)[0], scope=f"gpu:{node}/{index}", metrics={key.split("_", 1)[1]: v})
        for key, series in values.items()
        for index, v in enumerate(series)
    )
    return Run(label, 2, (), measurements, nodes=(node,))


def test_a_floor_at_or_below_zero_is_refused_and_the_base_bound_stays():
    # CPU memcpy copy_tbps, noisy: 0.0104 ... 0.0218, mean 0.0162, sd 0.0045113 (n - 1): 0.0104 - 0.0135 < 0
    runs = [
        _run("a", "n1", membw_copy_tbps=[0.0104, 0.0218]),
        _run("b", "n2", membw_copy_tbps=[0.0150, 0.0180]),
        _run("c", "n3", membw_copy_tbps=[0.0120, 0.0200]),
    ]
    base = Threshold(min=0.0005)
    notes: list[str] = []
    assert derive_check("membw.copy_tbps", base, runs, Rule(), notes=notes) == base
    # median (0.015 + 0.018) / 2 = 0.0165, half 0.00825; spread 0.0045113 / 0.0165 = 27 %
    assert notes == [
        "refused: membw.copy_tbps: spread 27 % (sd/median), the rule gives a floor of -0.00313 (min 0.0104 - "
        "3 x sd 0.00451), at or below half the median (0.00825): a GPU at half speed would pass; the base's "
        "bound stays (min 0.0005)"
    ]


def test_a_positive_floor_below_half_the_median_is_refused_too():
    # 8, 10, 12: sd 2, floor 8 - 6 = 2 <= 10 / 2
    runs = [_run(label, label, matmul_bf16_tflops=[v]) for label, v in (("a", 8.0), ("b", 10.0), ("c", 12.0))]
    notes: list[str] = []
    derive_check("matmul.bf16_tflops", Threshold(min=1), runs, Rule(), notes=notes)
    assert notes[-1].startswith(
        "refused: matmul.bf16_tflops: spread 20 % (sd/median), the rule gives a floor of 2 "
        "(min 8 - 3 x sd 2), at or below half the median (5)"
    )
    # 9, 10, 11: sd 1, floor 9 - 3 = 6 > 5: derived
    runs = [_run(label, label, matmul_bf16_tflops=[v]) for label, v in (("a", 9.0), ("b", 10.0), ("c", 11.0))]
    assert derive_check("matmul.bf16_tflops", Threshold(min=1), runs, Rule()).min == 6


def test_a_gap_ceiling_at_or_above_fifty_percent_is_refused():
    # outliers.matmul_pct 10, 20, 30: sd 10, ceiling 30 + 30 = 60 >= 50: a GPU at half its peers' speed passes
    runs = [
        Run(f"r{v:g}", 2, (), (Measurement(name="outliers", scope="gpu:n1/0", metrics={"matmul_pct": v}),))
        for v in (10.0, 20.0, 30.0)
    ]
    notes: list[str] = []
    base = Threshold(max=5, source="hand-set: a reason")
    assert derive_check("outliers.matmul_pct", base, runs, Rule(), notes=notes) == base
    assert "the rule gives a ceiling of 60 (max 30 + 3 x sd 10), at or above 50 %" in notes[-1]


def test_in_the_manifest_a_refused_bound_is_an_error_unless_the_base_bound_is_hand_set():
    runs = [_run(label, label, matmul_bf16_tflops=[v]) for label, v in (("a", 8.0), ("b", 10.0), ("c", 12.0))]
    derived = Threshold(min=9, source="derived from 3 runs on 3 nodes, 3 values (...): min 9; a, b, c")
    with pytest.raises(UsageError, match=r"^matmul.bf16_tflops: spread 20 % .* would pass; in the manifest"):
        derive_check("matmul.bf16_tflops", derived, runs, Rule(), strict=True)
    hand_set = Threshold(min=9, source="hand-set: why")
    assert derive_check("matmul.bf16_tflops", hand_set, runs, Rule(), strict=True) == hand_set


def test_one_gpu_count_refused_keeps_the_flat_base_bound_for_that_count_only():
    def collective(label: str, ranks: int, busbw: float) -> Run:
        params = {"bytes": MIB, "ranks": ranks}
        m = Measurement(name="all_reduce", scope="cluster", params=params, metrics={"busbw_gbps": busbw})
        return Run(label, ranks, (), (m,))

    runs = [collective(f"two{i}", 2, v) for i, v in enumerate([1.0, 1.1, 1.2])]
    runs += [collective(f"four{i}", 4, v) for i, v in enumerate([0.2, 1.0, 1.8])]  # sd .8: 0.2 - 2.4 < 0
    base = Threshold(min=0.01, bytes=MIB)
    notes: list[str] = []
    derived = derive_check("all_reduce.busbw_gbps", base, runs, Rule(), notes=notes)
    # 2 GPUs: 1.0 - max(3 x 0.1, 3 % of 1.0) = 0.7
    assert {count: bound.min for count, bound in derived.by_gpus.items()} == {2: 0.7, 4: 0.01}
    assert derived.by_gpus[4] == CountBound(min=0.01)
    assert notes[-1].startswith("refused: all_reduce.busbw_gbps on 4 GPUs: spread 80 % (sd/median)")
    assert notes[-1].endswith("the base's bound stays (min 0.01)")


# ---- CPU runs: the base from the runs, and the two cases an operator met -----------------------------------


def cpu_run(path: Path, node: str, fp32: list[float], copy: list[float], busbw: float, tokens: float,
            outlier: float, **changes) -> Path:  # fmt: skip
    measurements = [
        Measurement(name="matmul", scope=f"gpu:{node}/{rank}", metrics={"fp32_tflops": value})
        for rank, value in enumerate(fp32)
    ]
    measurements += [
        Measurement(name="membw", scope=f"gpu:{node}/{rank}", metrics={"copy_tbps": value})
        for rank, value in enumerate(copy)
    ]
    measurements += [
        Measurement(
            name=name, scope="cluster", params={"bytes": MIB, "ranks": 2}, metrics={"busbw_gbps": busbw}
        )
        for name in CPU_COLLECTIVES
    ]
    measurements += [
        Measurement(name="train", scope="cluster", metrics={"tokens_per_s_per_gpu": tokens}),
        Measurement(
            name="outliers",
            scope=f"gpu:{node}/0",
            params={"benchmark": "matmul"},
            metrics={"matmul_pct": outlier},
        ),
    ]
    result = Result(
        verdict=Status.PASS,
        started_at="2026-12-06T10:00:00+00:00",
        duration_s=30.0,
        profile="cpu",
        world=World(size=2, nodes=1, backend="gloo"),
        inventory={"nodes": [{"node": node, "host": {"hostname": node}, "gpu_count": 0, "gpus": []}]},
        measurements=measurements,
        checks=[Check(name="gpu.reachable", status=Status.SKIP, scope=f"node:{node}")],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(result.model_copy(update=changes).to_json(), encoding="utf-8")
    return path


@pytest.fixture
def cpu_runs(tmp_path) -> Path:
    """Three clean 2-rank CPU runs on nodes cpu-1, cpu-2 and cpu-1 again, one folder each (as a Slurm array
    leaves them), memcpy as noisy as a busy 2-core machine's."""
    folder = tmp_path / "array"
    for index, (node, fp32, copy, busbw, tokens, outlier) in enumerate(
        [
            ("cpu-1", [0.070, 0.072], [0.0104, 0.0218], 1.0, 2400.0, 1.0),
            ("cpu-2", [0.068, 0.070], [0.0150, 0.0180], 1.1, 2500.0, 2.0),
            ("cpu-1", [0.071, 0.069], [0.0120, 0.0200], 1.2, 2450.0, 3.0),
        ]
    ):
        cpu_run(folder / f"task-{index}" / "result.json", node, fp32, copy, busbw, tokens, outlier)
    return folder


def test_cpu_runs_derive_from_their_own_profile_with_a_run_at_one_percent_left_out(
    gpuval, cpu_runs, tmp_path
):
    bad = cpu_run(
        cpu_runs / "task-3" / "result.json", "cpu-3", [0.0007, 0.0007], [0.0002, 0.0002], 0.01, 24.0, 99.0
    )
    out = tmp_path / "derived.yaml"
    proc = gpuval(["profiles", "derive", str(cpu_runs), "--output", str(out)], tmp_path)  # no --base
    assert proc.returncode == 0, proc.stderr
    assert "over the base " in proc.stdout and "profiles/cpu.yaml" in proc.stdout
    derived = load_profile(str(out))
    assert derived.name == "cpu" and derived.history.min_runs == 10  # the rest of cpu.yaml kept
    # fp32: 0.068 .. 0.072, mean 0.07, sd sqrt(1e-5 / 5) = 0.0014142; 0.068 - 3 sd = 0.063757 -> 0.0637
    assert 0.068 - 3 * math.sqrt(1e-5 / 5) == pytest.approx(0.063757, abs=1e-6)
    fp32 = derived.checks["matmul.fp32_tflops"]
    assert fp32.min == 0.0637
    # three runs on two nodes (cpu-1 twice), six values, the planted run's two left out
    assert fp32.source.startswith("derived from 3 runs on 2 nodes, 6 values (spread 2 %, 2 left out): ")
    assert str(bad) not in fp32.source
    # memcpy too spread (see test_a_floor_at_or_below_zero_is_refused...): cpu.yaml's 0.0005 stays
    # the planted 0.0002 among them is not even judged an outlier: the group's MAD is too wide to anchor it
    assert derived.checks["membw.copy_tbps"].min == 0.0005
    refused = [line for line in proc.stdout.splitlines() if line.startswith("refused: membw.copy_tbps: ")]
    assert len(refused) == 1 and refused[0].endswith("the base's bound stays (min 0.0005)"), proc.stdout
    # collectives: 1.0, 1.1, 1.2 (the planted 0.01 left out: median 1.05, MAD 0.1, M = 7.0): 1.0 - 0.3 = 0.7
    assert derived.checks["all_reduce.busbw_gbps"].by_gpus[2].min == 0.7
    assert derived.checks["train.tokens_per_s_per_gpu"].min == 2250  # 2400 - 3 x 50
    assert derived.checks["outliers.matmul_pct"].max == 6  # 3 + 3 x 1, the planted 99 % left out
    assert derived.checks["outliers.matmul_pct"].level == "warn"


def test_without_the_rule_the_run_at_one_percent_would_drag_the_floor(cpu_runs, tmp_path):
    """The failure the rule prevents, shown: with no outlier left out the fp32 floor is refused (<= 0)."""
    cpu_run(
        cpu_runs / "task-3" / "result.json", "cpu-3", [0.0007, 0.0007], [0.0002, 0.0002], 0.01, 24.0, 99.0
    )
    loaded = [load_run(path) for path in find_result_files([cpu_runs])]
    notes: list[str] = []
    derive_check("matmul.fp32_tflops", Threshold(min=0.001), loaded, Rule(z_limit=math.inf), notes=notes)
    assert notes[-1].startswith("refused: matmul.fp32_tflops: ")


def test_runs_judged_by_different_profiles_need_a_base(gpuval, assert_usage_error, cpu_runs, clean, tmp_path):
    out = tmp_path / "derived.yaml"
    proc = gpuval(["profiles", "derive", str(cpu_runs), *map(str, clean), "--output", str(out)], tmp_path)
    assert_usage_error(proc, "the runs were judged by different profiles: cpu (3 runs), h200-sxm (6 runs)")
    assert not out.exists()


def test_the_base_is_the_profile_the_runs_name_else_their_gpus(clean, tmp_path):
    renamed = [
        run_file(tmp_path / f"p{i}.json", 2, [700.0, 700.0], 320.0, 1.0, profile="cpu") for i in range(2)
    ]
    assert base_for([load_run(path) for path in renamed], None).name == "cpu.yaml"  # not the GPUs' h200-sxm
    assert base_for([load_run(path) for path in clean], None).name == "h200-sxm.yaml"
    unknown = run_file(tmp_path / "custom.json", 2, [700.0, 700.0], 320.0, 1.0, profile="my-lab")
    with pytest.raises(
        UsageError, match="judged by profile 'my-lab', which is no built-in profile: pass --base"
    ):
        base_for([load_run(unknown)], None)


# ---- folders of result.json --------------------------------------------------------------------------------


def test_folders_are_searched_for_result_json_at_any_depth(tmp_path):
    for part in ("b/node-2", "a/node-1", "a/deeper/node-3"):
        (tmp_path / "runs" / part).mkdir(parents=True)
        (tmp_path / "runs" / part / "result.json").write_text("{}")
    (tmp_path / "runs" / "a" / "junit.xml").write_text("")
    bench = tmp_path / "matmul.json"
    bench.write_text("{}")
    found = find_result_files([tmp_path / "runs", bench, tmp_path / "runs" / "a" / "node-1" / "result.json"])
    assert [path.relative_to(tmp_path).as_posix() for path in found] == [
        "runs/a/deeper/node-3/result.json",
        "runs/a/node-1/result.json",  # named twice, counted once
        "runs/b/node-2/result.json",
        "matmul.json",
    ]


@pytest.mark.parametrize("make", ["empty", "no-result", "missing"])
def test_a_folder_without_result_json_is_one_line_exit_2(gpuval, assert_usage_error, tmp_path, make):
    folder = tmp_path / "runs"
    if make != "missing":
        folder.mkdir()
    if make == "no-result":
        (folder / "node-1").mkdir()
        (folder / "node-1" / "junit.xml").write_text("")
    proc = gpuval(["profiles", "derive", str(folder), "--output", str(tmp_path / "p.yaml")], tmp_path)
    fragment = "no such file or folder" if make == "missing" else "no result.json in this folder or below"
    assert_usage_error(proc, f"{folder}: {fragment}")


# ---- the evidence a source records -------------------------------------------------------------------------


def test_a_node_is_its_host_name_with_its_gpus():
    node = {"node": "vm", "host": {"hostname": "vm"}, "gpus": [{"uuid": "GPU-b2"}, {"uuid": "a1"}]}
    assert node_name(node) == "vm[a1 b2]"  # lent machines are all 'vm': their GPUs tell them apart
    assert node_name({"host": {"hostname": "gpu-017"}, "gpus": []}) == "gpu-017"
    assert node_name({"gpus": [{"name": "NVIDIA H200"}]}) is None


def test_a_source_counts_the_nodes_its_runs_came_from():
    runs = [
        _run("a", "node-1", matmul_bf16_tflops=[700.0, 702.0]),
        _run("b", "node-2", matmul_bf16_tflops=[698.0, 700.0]),
        _run("c", "node-1", matmul_bf16_tflops=[701.0, 699.0]),
    ]
    derived = derive_check("matmul.bf16_tflops", Threshold(min=1), runs, Rule())
    # six values 698 .. 702, mean 700, sd sqrt(10 / 5) = 1.414; median 700: spread 0.2 %;
    # 698 - max(3 x 1.414, 3 % of 698 = 20.94) = 677.06 -> 677
    assert derived.min == 677
    assert derived.source == (
        "derived from 3 runs on 2 nodes, 6 values (spread 0.2 %, none left out): min 698 - 3% of it "
        "(> 3 x sd 1.41); a, b, c"
    )


def test_the_robust_rule_moves_no_shipped_bound():
    """Every bound of h100-sxm and h200-sxm, derived again from its committed runs, has the value it had
    before outliers were judged: the rule leaves no committed value out and refuses none."""
    notes: list[str] = []
    for one in from_manifest(MANIFEST, notes=notes):
        for name, shipped in one.base.checks.items():
            now = one.profile.checks[name]
            assert (now.min, now.max) == (shipped.min, shipped.max), (one.name, name)
            assert {c: (b.min, b.max) for c, b in (now.by_gpus or {}).items()} == {
                c: (b.min, b.max) for c, b in (shipped.by_gpus or {}).items()
            }, (one.name, name)
    assert not [line for line in notes if "left out: " in line or "refused: " in line], notes


def test_a_verdict_shows_the_evidence_behind_each_derived_bound(cpu_runs, tmp_path):
    """Derived from three clean runs on two nodes (a fourth, at 1 %, left out), the fp32 floor's checks say
    so in result.json, on the console next to a FAIL, in report.html and in junit.xml; a hand-set bound
    says it was set by hand."""
    from rich.console import Console

    from gpuval.checks import threshold_checks
    from gpuval.derived.outliers import outlier_measurements
    from gpuval.report.console import print_result
    from gpuval.report.html import render_html
    from gpuval.report.junit import junit_xml

    cpu_run(cpu_runs / "task-3" / "result.json", "cpu-3", [0.0007] * 2, [0.0002] * 2, 0.01, 24.0, 99.0)
    runs = [load_run(path) for path in find_result_files([cpu_runs])]
    profile = derive_profile(resolve_profile_path("cpu"), runs, Rule())[2]
    profile.checks["outliers.matmul_pct"] = Threshold(max=5, level="warn", source="hand-set: a reason")
    measured = [
        Measurement(name="matmul", scope="gpu:n/0", metrics={"fp32_tflops": 0.07}),
        Measurement(name="matmul", scope="gpu:n/1", metrics={"fp32_tflops": 0.03}),  # below 0.0637
    ]
    measured += outlier_measurements(measured, {"matmul": ("fp32_tflops",)})  # 40 % below the median
    producers = {"matmul": "matmul", "outliers": "matmul"}
    checks = [c for c in threshold_checks(profile, measured, {}, producers) if c.value is not None]
    fine, slow = sorted((c for c in checks if c.name == "matmul.fp32_tflops"), key=lambda c: c.scope)
    said = "3 runs on 2 nodes, spread 2 %, 2 left out"  # six values kept of eight (see the test above)
    assert (fine.status, slow.status) == (Status.PASS, Status.FAIL)
    assert fine.threshold["evidence"] == slow.threshold["evidence"] == said
    assert slow.threshold["source"] == profile.checks["matmul.fp32_tflops"].source
    [gap] = [c for c in checks if c.name == "outliers.matmul_pct"]
    assert (gap.status, gap.threshold["evidence"]) == (Status.WARN, "hand-set")

    world = World(size=2, nodes=1, backend="gloo")
    started = "2026-12-06T10:00:00+00:00"
    result = Result(
        verdict=Status.FAIL, started_at=started, duration_s=1.0, profile="cpu", world=world, checks=checks
    )
    console = Console(width=400, record=True)  # each row on one line
    print_result(result, console)
    lines = console.export_text().splitlines()
    assert any("gpu:n/1" in line and f"[bound: {said}]" in line for line in lines), lines
    assert not any("gpu:n/0" in line and "[bound:" in line for line in lines)  # a PASS needs no evidence
    assert any("outliers.matmul_pct" in line and "[bound: hand-set]" in line for line in lines)
    page = render_html(result)
    # the FAIL under Problems and in the table of all checks, the PASS in that table
    assert page.count('<span class="evidence" title="derived from 3 runs on 2 nodes') == 3
    assert f">{said}</span>" in page
    xml = junit_xml(result)
    assert xml.count(f'<property name="bound.evidence" value="{said}" />') == 2
    assert '<property name="bound.source" value="hand-set: a reason" />' in xml

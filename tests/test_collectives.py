"""Collectives: nccl-tests formulas by hand (nccl-tests' PERFORMANCE.md, docs/collectives.md), buffer layouts,
expected results, and real gloo collectives under torchrun (tests/dist/collectives_worker.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import cli_env

from gpuval.bench.collectives import (
    ALL_OPS,
    OPS,
    Call,
    CollectiveOptions,
    Layout,
    bandwidth_gbps,
    exact_count,
    sweep_sizes,
)
from gpuval.bench.registry import all_benchmarks
from gpuval.checks import correctness_checks
from gpuval.results import Measurement, Status

DIST = Path(__file__).parent / "dist"
TORCHRUN = Path(sys.executable).with_name("torchrun")

# ---------------------------------------------------------------------------------------------------------
# Formulas: algbw = S / t, busbw = algbw x factor(n). 1e9 bytes in 0.01 s is algbw 100 GB/s.
# factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter, alltoall (n-1)/n; broadcast, sendrecv 1.
# ---------------------------------------------------------------------------------------------------------
BUSBW_1E9_IN_10MS = {
    # op:             n=2    n=3                 n=4
    "all_reduce": {2: 100.0, 3: 133.33333333333334, 4: 150.0},
    "all_gather": {2: 50.0, 3: 66.66666666666667, 4: 75.0},
    "reduce_scatter": {2: 50.0, 3: 66.66666666666667, 4: 75.0},
    "alltoall": {2: 50.0, 3: 66.66666666666667, 4: 75.0},
    "broadcast": {2: 100.0, 3: 100.0, 4: 100.0},
    "sendrecv": {2: 100.0, 3: 100.0, 4: 100.0},
}

# 4092 bytes (1023 float32 at n=3) in 2 us: algbw = 4092 / 2e-6 / 1e9 = 2.046 GB/s
BUSBW_4092_IN_2US = {
    "all_reduce": {2: 2.046, 3: 2.728, 4: 3.069},
    "all_gather": {2: 1.023, 3: 1.364, 4: 1.5345},
    "reduce_scatter": {2: 1.023, 3: 1.364, 4: 1.5345},
    "alltoall": {2: 1.023, 3: 1.364, 4: 1.5345},
    "broadcast": {2: 2.046, 3: 2.046, 4: 2.046},
    "sendrecv": {2: 2.046, 3: 2.046, 4: 2.046},
}


@pytest.mark.parametrize(
    ("size_bytes", "time_s", "algbw_expected", "busbw_expected"),
    [
        pytest.param(10**9, 0.01, 100.0, BUSBW_1E9_IN_10MS, id="1e9B-in-10ms"),
        pytest.param(4092, 2e-6, 2.046, BUSBW_4092_IN_2US, id="4092B-in-2us"),
    ],
)
@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_bandwidth(size_bytes, time_s, algbw_expected, busbw_expected, op, n):
    algbw, busbw = bandwidth_gbps(op, size_bytes, time_s, n)
    assert algbw == pytest.approx(algbw_expected, rel=1e-12)
    assert busbw == pytest.approx(busbw_expected[op][n], rel=1e-12)


def test_busbw_factors_literal():
    literal = {
        "all_reduce": {2: 1.0, 3: 4 / 3, 4: 1.5, 8: 1.75},
        "all_gather": {2: 0.5, 3: 2 / 3, 4: 0.75, 8: 0.875},
        "reduce_scatter": {2: 0.5, 3: 2 / 3, 4: 0.75, 8: 0.875},
        "alltoall": {2: 0.5, 3: 2 / 3, 4: 0.75, 8: 0.875},
        "broadcast": {2: 1.0, 3: 1.0, 4: 1.0, 8: 1.0},
        "sendrecv": {2: 1.0, 3: 1.0, 4: 1.0, 8: 1.0},
    }
    assert set(literal) == set(OPS) == set(ALL_OPS)
    for op, by_n in literal.items():
        for n, factor in by_n.items():
            assert OPS[op].busbw_factor(n) == pytest.approx(factor, rel=1e-12), (op, n)


def test_bandwidth_unknown_op_is_an_error():
    with pytest.raises(KeyError):
        bandwidth_gbps("reduce", 1000, 1.0, 2)


@pytest.mark.parametrize(
    ("size_bytes", "element_size", "n", "expected"),
    [
        (4096, 4, 2, 1024),
        (4096, 4, 3, 1023),  # 1024 elements -> multiple of 3 below
        (4096, 4, 4, 1024),
        (4096, 2, 3, 2046),  # bfloat16
        (5000, 4, 3, 1248),  # 1250 -> 1248
        (5000, 2, 3, 2499),  # 2500 -> 2499 = 3 x 833
        (5000, 4, 4, 1248),  # 1250 -> 1248
        (4098, 4, 2, 1024),  # a partial element is dropped
        (4, 4, 3, 3),  # 1 element -> at least n
        (0, 4, 2, 2),
        (6, 2, 4, 4),  # 3 elements -> 0 -> at least n
    ],
)
def test_exact_count(size_bytes, element_size, n, expected):
    count = exact_count(size_bytes, element_size, n)
    assert count == expected
    assert count % n == 0


@pytest.mark.parametrize(
    ("op", "input_count", "output_count", "in_place"),
    [
        ("all_reduce", 12, 12, True),
        ("all_gather", 4, 12, False),  # per-rank input = S/n, output = S
        ("reduce_scatter", 12, 4, False),  # input = S, per-rank output = S/n
        ("alltoall", 12, 12, False),
        ("broadcast", 12, 12, True),
        ("sendrecv", 12, 12, False),
    ],
)
def test_layout_per_op(op, input_count, output_count, in_place):
    assert OPS[op].layout(12, 3) == Layout(input_count, output_count)
    assert OPS[op].in_place is in_place


def test_layout_at_four_ranks():
    assert OPS["all_gather"].layout(1024, 4) == Layout(256, 1024)
    assert OPS["reduce_scatter"].layout(1024, 4) == Layout(1024, 256)


def _pattern(rank: int, offset: int, length: int):
    # Distinct per rank and per element, so every expected value names its source.
    return torch.arange(offset, offset + length, dtype=torch.float32) + 100 * rank


def _call(n: int, rank: int, count: int) -> Call:
    return Call(group=None, n=n, rank=rank, count=count, input=None, output=None, pattern=_pattern)


@pytest.mark.parametrize(
    ("op", "rank", "expected"),
    [
        # n=3, S=6 elements; rank r's input is [0..] + 100 r
        ("all_reduce", 1, [300, 303, 306, 309, 312, 315]),
        ("all_gather", 1, [0, 1, 100, 101, 200, 201]),  # each rank's 2 elements, in rank order
        ("reduce_scatter", 0, [300, 303]),  # elements 0-1 summed over ranks
        ("reduce_scatter", 1, [306, 309]),  # elements 2-3
        ("reduce_scatter", 2, [312, 315]),  # elements 4-5
        ("alltoall", 0, [0, 1, 100, 101, 200, 201]),  # chunk 0 of every rank
        ("alltoall", 1, [2, 3, 102, 103, 202, 203]),  # chunk 1 of every rank
        ("alltoall", 2, [4, 5, 104, 105, 204, 205]),
        ("broadcast", 2, [0, 1, 2, 3, 4, 5]),  # rank 0's buffer everywhere
        ("sendrecv", 0, [200, 201, 202, 203, 204, 205]),  # from rank n-1 (ring)
        ("sendrecv", 1, [0, 1, 2, 3, 4, 5]),  # from rank 0
        ("sendrecv", 2, [100, 101, 102, 103, 104, 105]),
    ],
)
def test_expected_results_by_hand(op, rank, expected):
    got = OPS[op].expected(_call(3, rank, 6))
    assert got.tolist() == [float(value) for value in expected]


def test_sweep_sizes_grid():
    options = CollectiveOptions(min_bytes="4KiB", max_bytes="64KiB", step_factor=4)
    assert sweep_sizes(options) == [4096, 16384, 65536]


def test_sweep_sizes_factor_two_and_max_off_grid():
    assert sweep_sizes(CollectiveOptions(min_bytes=1000, max_bytes=8000)) == [1000, 2000, 4000, 8000]
    assert sweep_sizes(CollectiveOptions(min_bytes=4096, max_bytes=60000, step_factor=4)) == [4096, 16384]


def test_sweep_sizes_extra_sorted_unique():
    options = CollectiveOptions(
        min_bytes="4KiB", max_bytes="64KiB", step_factor=4, extra_sizes=["1MiB", 5000, 16384, "4KiB", 5000]
    )
    assert sweep_sizes(options) == [4096, 5000, 16384, 65536, 1048576]


def test_sweep_sizes_min_above_max_is_refused():
    # it once measured the extra sizes alone; one size is min_bytes = max_bytes (issue 50)
    with pytest.raises(ValueError, match=r"(?s)max_bytes.*below min_bytes"):
        CollectiveOptions(min_bytes="1MiB", max_bytes="4KiB", extra_sizes=[8192])
    assert sweep_sizes(CollectiveOptions(min_bytes="4KiB", max_bytes="4KiB", extra_sizes=[8192])) == [
        4096,
        8192,
    ]


def test_collectives_registered_with_all_ops():
    bench = all_benchmarks()["collectives"]
    assert bench.produces == ALL_OPS
    assert bench.options is CollectiveOptions


# ---------------------------------------------------------------------------------------------------------
# Real collectives: gloo under torchrun. Two launches: 3 ranks on one node, 4 ranks posing as 2 nodes.
# ---------------------------------------------------------------------------------------------------------
FACTOR_3 = {
    "all_reduce": 4 / 3,
    "all_gather": 2 / 3,
    "reduce_scatter": 2 / 3,
    "alltoall": 2 / 3,
    "broadcast": 1.0,
    "sendrecv": 1.0,
}
FACTOR_2 = {
    "all_reduce": 1.0,
    "all_gather": 0.5,
    "reduce_scatter": 0.5,
    "alltoall": 0.5,
    "broadcast": 1.0,
    "sendrecv": 1.0,
}
SIZES = [4096, 5000, 16384, 65536]  # 4KiB..64KiB by 4, plus 5000 (not a multiple of anything useful)
# S rounded down to a multiple of 3 elements
EXACT_3 = {
    "float32": {4096: 4092, 5000: 4992, 16384: 16380, 65536: 65532},
    "bfloat16": {4096: 4092, 5000: 4998, 16384: 16380, 65536: 65532},
}
# at 2 ranks only 5000 B of float32 needs rounding (1250 elements is even)
EXACT_2 = {4096: 4096, 5000: 5000, 16384: 16384, 65536: 65536}
EXACT_4 = {4096: 4096, 5000: 4992, 16384: 16384, 65536: 65536}


def _torchrun(nproc: int, mode: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{mode}.json"
    env = cli_env(OMP_NUM_THREADS="1")  # no GPU visible: gloo on CPUs, also on a GPU machine
    proc = subprocess.run(
        [
            str(TORCHRUN),
            "--standalone",
            f"--nproc_per_node={nproc}",
            str(DIST / "collectives_worker.py"),
            mode,
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def world3(tmp_path_factory) -> dict:
    return _torchrun(3, "world", tmp_path_factory.mktemp("world3"))


@pytest.fixture(scope="module")
def split4(tmp_path_factory) -> dict:
    return _torchrun(4, "split", tmp_path_factory.mktemp("split4"))


def _measurements(items: list[dict]) -> list[Measurement]:
    return [Measurement.model_validate(item) for item in items]


def _assert_bandwidths(m: Measurement, factor: float) -> None:
    time_s = m.metrics["time_us"] * 1e-6
    assert time_s > 0
    assert m.metrics["time_us_min"] <= m.metrics["time_us"] <= m.metrics["time_us_max"]
    assert m.metrics["algbw_gbps"] == pytest.approx(m.params["bytes_exact"] / time_s / 1e9, rel=1e-9)
    assert m.metrics["busbw_gbps"] == pytest.approx(m.metrics["algbw_gbps"] * factor, rel=1e-12)


@pytest.mark.dist
def test_runtime_under_torchrun(world3):
    rt = world3["runtime"]
    assert rt["launcher"] == "torchrun"
    assert (rt["rank"], rt["world_size"], rt["local_rank"], rt["local_world_size"]) == (0, 3, 0, 3)
    assert rt["node_rank"] == 0 and rt["node_names"] == [rt["node_name"]]
    assert rt["backend"] == "gloo" and rt["device"] == "cpu"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.dist
def test_every_op_exact_at_three_ranks(world3, dtype):
    measured = _measurements(world3["runs"][dtype])
    element = {"float32": 4, "bfloat16": 2}[dtype]
    # one measurement per (op, size), made by rank 0 only, in option order
    assert [(m.name, m.params["bytes"]) for m in measured] == [(op, s) for op in ALL_OPS for s in SIZES]
    for m in measured:
        assert m.scope == "cluster"
        assert m.metrics["wrong_elements"] == 0, (m.name, m.params)
        assert m.params["dtype"] == dtype and m.params["ranks"] == 3 and m.params["iters"] == 2
        assert m.samples == 2
        assert m.params["bytes_exact"] == EXACT_3[dtype][m.params["bytes"]]
        assert m.params["bytes_exact"] % (3 * element) == 0
        _assert_bandwidths(m, FACTOR_3[m.name])
    checks = correctness_checks(measured)
    assert [(c.name, c.status) for c in checks] == [(f"{op}.correct", Status.PASS) for op in ALL_OPS]
    assert all(c.detail == "exact at all 4 sizes" and c.value == 0 for c in checks)


@pytest.mark.dist
def test_faulty_all_reduce_is_caught(world3):
    measured = _measurements(world3["runs"]["faulty"])
    by_op = {op: [m for m in measured if m.name == op] for op in ("all_reduce", "broadcast")}
    assert [m.params["bytes"] for m in by_op["all_reduce"]] == SIZES
    # rank 1 flipped one element after the real all_reduce: exactly one wrong element at every size
    assert [m.metrics["wrong_elements"] for m in by_op["all_reduce"]] == [1.0, 1.0, 1.0, 1.0]
    assert [m.metrics["wrong_elements"] for m in by_op["broadcast"]] == [0.0, 0.0, 0.0, 0.0]

    checks = {c.name: c for c in correctness_checks(measured)}
    bad = checks["all_reduce.correct"]
    assert bad.status is Status.FAIL
    assert bad.value == 4
    assert bad.scope == "cluster"
    assert bad.detail.startswith("4 wrong elements at 4 KiB, 4.9 KiB, 16 KiB, 64 KiB: ")
    assert checks["broadcast.correct"].status is Status.PASS


@pytest.mark.dist
def test_faulty_op_restored_for_later_runs(world3):
    # the node-scope run came after the faulty one in the same processes
    measured = _measurements(world3["runs"]["node"])
    assert all(m.metrics["wrong_elements"] == 0 for m in measured if m.name == "all_reduce")


@pytest.mark.dist
def test_scope_node_on_one_node(world3):
    measured = _measurements(world3["runs"]["node"])
    node = world3["runtime"]["node_name"]
    assert [(m.name, m.params["bytes"]) for m in measured] == [
        (op, s) for op in ("all_reduce", "sendrecv") for s in SIZES
    ]
    for m in measured:
        # one node: the node's group is the whole world
        assert m.scope in ("cluster", f"node:{node}")
        assert m.params["ranks"] == 3
        assert m.metrics["wrong_elements"] == 0
        _assert_bandwidths(m, FACTOR_3[m.name])


@pytest.mark.dist
def test_scope_node_splits_two_nodes(split4):
    measured = _measurements(split4["runs"]["node"])
    for scope in ("node:fake-a", "node:fake-b"):
        mine = [m for m in measured if m.scope == scope]
        assert [(m.name, m.params["bytes"]) for m in mine] == [(op, s) for op in ALL_OPS for s in SIZES]
        for m in mine:
            assert m.params["ranks"] == 2
            assert m.params["bytes_exact"] == EXACT_2[m.params["bytes"]]
            assert m.metrics["wrong_elements"] == 0, (scope, m.name, m.params)
            _assert_bandwidths(m, FACTOR_2[m.name])
    assert len(measured) == 2 * len(ALL_OPS) * len(SIZES)


@pytest.mark.dist
def test_scope_node_isolates_the_faulty_node(split4):
    measured = _measurements(split4["runs"]["node_faulty"])
    wrong = {(m.scope, m.params["bytes"]): m.metrics["wrong_elements"] for m in measured}
    assert wrong == {**{("node:fake-a", s): 0.0 for s in SIZES}, **{("node:fake-b", s): 1.0 for s in SIZES}}
    checks = {c.scope: c for c in correctness_checks(measured)}
    assert checks["node:fake-a"].status is Status.PASS
    assert checks["node:fake-b"].status is Status.FAIL
    assert checks["node:fake-b"].detail.startswith("4 wrong elements at 4 KiB, 4.9 KiB, 16 KiB, 64 KiB: ")


@pytest.mark.dist
def test_world_scope_after_node_groups(split4):
    measured = _measurements(split4["runs"]["world_after_split"])
    assert [m.params["bytes"] for m in measured] == SIZES
    for m in measured:
        assert m.scope == "cluster" and m.params["ranks"] == 4
        assert m.params["bytes_exact"] == EXACT_4[m.params["bytes"]]
        assert m.metrics["wrong_elements"] == 0
        _assert_bandwidths(m, 1.5)


def test_the_table_has_nccl_tests_columns_and_its_average_bus_bandwidth_line():
    """What an nccl-tests user reads: count, type, redop, root, the placement, `# Avg bus bandwidth` as the
    plain mean over the sweep's sizes (here (10 + 20 + 60) / 3 = 30.00) and the out-of-bounds count."""
    from rich.console import Console

    from gpuval.report.console import print_measurements
    from gpuval.results import Measurement

    def row(size: int, busbw: float) -> Measurement:
        params = {"bytes": size, "count": size // 4, "dtype": "float32", "redop": "sum", "root": -1}
        params |= {"in_place": True, "ranks": 2}
        metrics = {"time_us": 5.0, "time_us_min": 4.0, "time_us_max": 6.0, "algbw_gbps": busbw / 2}
        metrics |= {"busbw_gbps": busbw, "wrong_elements": 0.0}
        return Measurement(name="all_reduce", scope="world", params=params, metrics=metrics, samples=3)

    console = Console(record=True, width=200)
    print_measurements("collectives", [row(4096, 60.0), row(1024, 10.0), row(2048, 20.0)], console)
    text = console.export_text()
    assert "all_reduce · world · 2 ranks · in-place" in text
    header = next(line for line in text.splitlines() if "redop" in line)
    assert [word for word in ("size", "count", "type", "redop", "root") if word in header] == [
        "size", "count", "type", "redop", "root",
    ]  # fmt: skip
    first = next(line for line in text.splitlines() if "1.0 KiB" in line or "1 KiB" in line)
    assert " 256 " in first and " float " in first and " sum " in first and " -1 " in first
    assert "# Out of bounds values : 0 OK" in text
    assert "# Avg bus bandwidth    : 30.00 GB/s" in text


def test_measurements_carry_nccl_tests_redop_and_root():
    from gpuval.bench.collectives import OPS

    assert {name: (op.redop, op.root) for name, op in OPS.items()} == {
        "all_reduce": ("sum", -1), "all_gather": ("none", -1), "reduce_scatter": ("sum", -1),
        "alltoall": ("none", -1), "broadcast": ("none", 0), "sendrecv": ("none", -1),
    }  # fmt: skip

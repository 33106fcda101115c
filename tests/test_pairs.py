"""Pairs of nodes (issue 22): the round-robin schedule and the node-or-link attribution worked by hand
(gpuval.pairs), the check accept makes of them (checks.py), accept's plan, and real gloo runs under
torchrun (tests/dist/pairs_worker.py), one with a node made slow by the kernel: its process in a cgroup
with 10% of a CPU.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import pytest
from conftest import run_dist_worker

from gpuval.bench.registry import all_benchmarks
from gpuval.bench.run import bench_options, plan_benchmarks
from gpuval.checks import outlier_measurements, threshold_checks
from gpuval.config import Profile, load_profile
from gpuval.pairs import attribute, describe, pair_scope, round_robin
from gpuval.results import Measurement, Status

# ---------------------------------------------------------------------------------------------------------
# The schedule: circle method. Rounds of disjoint pairs; N-1 rounds for even N, N (one bye each) for odd N.
# ---------------------------------------------------------------------------------------------------------


def test_four_nodes_by_hand():
    # a b      a d      a c        a stays, the others move one place clockwise each round;
    # d c  ->  c b  ->  b d        a column is a pair
    assert round_robin("abcd") == [
        [("a", "d"), ("b", "c")],
        [("a", "c"), ("b", "d")],
        [("a", "b"), ("c", "d")],
    ]


def test_three_nodes_by_hand_one_bye_per_round():
    # a b     a -     a c      '-' is the bye: whoever meets it sits the round out
    # - c ->  c b ->  b -
    assert round_robin("abc") == [[("b", "c")], [("a", "c")], [("a", "b")]]


def test_five_nodes_by_hand():
    # a b c     a - b     a e -     a d e     a c d
    # - e d  -> e d c  -> d c b  -> c b -  -> b - e
    assert round_robin("abcde") == [
        [("b", "e"), ("c", "d")],
        [("a", "e"), ("b", "c")],
        [("a", "d"), ("c", "e")],
        [("a", "c"), ("b", "d")],
        [("a", "b"), ("d", "e")],
    ]


@pytest.mark.parametrize("n", range(2, 9))
def test_every_pair_exactly_once_in_disjoint_rounds(n):
    nodes = [f"n{i}" for i in range(n)]
    rounds = round_robin(nodes)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    played = [pair for pairs in rounds for pair in pairs]
    assert sorted(played) == list(itertools.combinations(nodes, 2))  # each once, first-listed first
    for pairs in rounds:
        busy = [node for pair in pairs for node in pair]
        assert len(busy) == len(set(busy))  # disjoint: the pairs of a round run at once
        assert len(pairs) == n // 2
    idle = [node for pairs in rounds for node in nodes if all(node not in pair for pair in pairs)]
    assert sorted(idle) == (nodes if n % 2 else [])  # odd N: every node sits out exactly once


def test_fewer_than_two_nodes_have_no_rounds():
    assert round_robin([]) == [] and round_robin(["a"]) == []


def test_pair_scope():
    assert pair_scope("n1", "n2") == "pair:n1+n2"


# ---------------------------------------------------------------------------------------------------------
# Attribution. node X: its fastest pair vs the median of the pairs without X. link A+B: the pair vs the
# lower of A's and B's medians with their other nodes; only each node's slowest pair is a candidate, and
# a link whose own node sits at least as far below is explained by it (gap 0).
# gap = (reference - value) / reference in %, 0 when not below.
# ---------------------------------------------------------------------------------------------------------


def _gaps(figures):
    return {s.scope: pytest.approx(s.gap_pct) for s in attribute(figures)}


def test_one_slow_node():
    figures = {("a", "b"): 48, ("a", "c"): 50, ("b", "c"): 46, ("a", "d"): 12, ("b", "d"): 13, ("c", "d"): 11}
    assert _gaps(figures) == {
        "node:d": (48 - 13) / 48 * 100,  # fastest of 12, 13, 11 vs median of 48, 50, 46
        "node:a": 0.0,  # fastest 50 vs median of bc 46, bd 13, cd 11 = 13
        "node:b": 0.0,  # 48 vs 12
        "node:c": 0.0,  # 50 vs 13
        # every other node's slowest pair is its pair with d; d's slowest is c+d
        "pair:a+d": 0.0,  # 12 vs min(median(48, 50) = 49, median(13, 11) = 12)
        "pair:b+d": 0.0,  # 13 vs min(47, median(12, 11) = 11.5)
        # 11 vs min(48, median(12, 13) = 12.5) is 12% below, but node d is 72.9% below: d explains it
        "pair:c+d": 0.0,
    }
    [worst, *_] = attribute(figures)
    assert describe(worst, "GB/s") == (
        "node d: its 3 pairs median 12 GB/s (fastest 13) vs 48 GB/s for the 3 pairs without it"
    )
    [link] = [s for s in attribute(figures) if s.scope == "pair:c+d"]
    assert link.explained_by == "d" and describe(link, "GB/s") == (
        "link c+d: 11 GB/s vs 48 GB/s for c's other pairs and 12.5 GB/s for d's, within the scatter of node "
        "d's slow pairs"
    )
    assert [s.scope for s in attribute(figures) if s.gap_pct > 20] == ["node:d"]


def test_a_link_far_slower_than_its_slow_node_is_still_blamed():
    figures = {("a", "b"): 48, ("a", "c"): 50, ("b", "c"): 46, ("a", "d"): 24, ("b", "d"): 24, ("c", "d"): 3}
    assert _gaps(figures) == {
        "pair:c+d": (24 - 3) / 24 * 100,  # 3 vs min(median(50, 46) = 48, median(24, 24) = 24): 87.5%
        "node:d": (48 - 24) / 48 * 100,  # fastest 24 vs median(48, 50, 46): 50% < 87.5%, so both stand
        "node:a": 0.0,
        "node:b": 0.0,
        "node:c": 0.0,  # fastest 50 vs median(48, 24, 24) = 24
        "pair:a+d": 0.0,  # 24 vs min(49, median(24, 3) = 13.5)
        "pair:b+d": 0.0,
    }


def test_one_slow_link():
    figures = {("a", "b"): 12, ("a", "c"): 48, ("a", "d"): 50, ("b", "c"): 46, ("b", "d"): 49, ("c", "d"): 47}
    assert _gaps(figures) == {
        "pair:a+b": (47.5 - 12) / 47.5 * 100,  # 12 vs min(median(48, 50) = 49, median(46, 49) = 47.5)
        "node:c": (49 - 48) / 49 * 100,  # fastest 48 vs median of 12, 50, 49 = 49
        "node:a": 0.0,  # a and b still have fast pairs: 50 vs median(46, 49, 47) = 47
        "node:b": 0.0,  # 49 vs median(48, 50, 47) = 48
        "node:d": 0.0,  # 50 vs median(12, 48, 46) = 46
        "pair:b+c": 0.0,  # c's slowest: 46 vs min(median(12, 49) = 30.5, median(48, 47) = 47.5)
        "pair:c+d": 0.0,  # d's slowest: 47 vs min(median(48, 46) = 47, median(50, 49) = 49.5)
    }
    [worst, *_] = attribute(figures)
    assert describe(worst, "GB/s") == "link a+b: 12 GB/s vs 49 GB/s for a's other pairs and 47.5 GB/s for b's"
    assert [s.scope for s in attribute(figures) if s.gap_pct > 20] == ["pair:a+b"]


def test_none_slow_among_a_few_percent_of_noise():
    figures = {("a", "b"): 48, ("a", "c"): 50, ("a", "d"): 47, ("b", "c"): 46, ("b", "d"): 49, ("c", "d"): 45}
    assert _gaps(figures) == {
        "pair:c+d": (48 - 45) / 48 * 100,  # 45 vs min(median(50, 46), median(47, 49)) = 48
        "pair:b+c": (47.5 - 46) / 47.5 * 100,  # 46 vs min(median(48, 49) = 48.5, median(50, 45) = 47.5)
        "node:a": 0.0,
        "node:b": 0.0,
        "node:c": 0.0,
        "node:d": 0.0,
        "pair:a+d": 0.0,  # 47 vs min(49, median(49, 45) = 47)
    }


def test_three_nodes_slow_node_and_slow_link_differ():
    slow_node = {("a", "b"): 48, ("a", "c"): 12, ("b", "c"): 13}
    assert _gaps(slow_node) == {
        "node:c": (48 - 13) / 48 * 100,
        "node:a": 0.0,
        "node:b": 0.0,
        "pair:a+c": 0.0,  # 12 vs min(48, 13) is 7.7% below: explained by node c
        "pair:b+c": 0.0,
    }
    slow_link = {("a", "b"): 12, ("a", "c"): 48, ("b", "c"): 46}
    assert _gaps(slow_link) == {
        "pair:a+b": (46 - 12) / 46 * 100,  # 12 vs min(48, 46)
        "node:b": (48 - 46) / 48 * 100,  # fastest 46 vs the one pair without it, 48
        "node:a": 0.0,
        "node:c": 0.0,
        "pair:b+c": 0.0,  # 46 vs min(12, 48)
    }


@pytest.mark.parametrize("n", range(3, 9))
def test_a_slow_node_is_never_blamed_on_its_links(n):
    nodes = [f"n{i}" for i in range(n)]
    figures = {pair: 40.0 if "n2" in pair else 100.0 for pair in itertools.combinations(nodes, 2)}
    gaps = {s.scope: s.gap_pct for s in attribute(figures)}
    assert gaps.pop("node:n2") == pytest.approx(60.0)
    assert set(gaps.values()) == {0.0}


def test_two_nodes_have_nothing_to_compare():
    assert attribute({("a", "b"): 10.0}) == [] and attribute({}) == []


# ---------------------------------------------------------------------------------------------------------
# The check: 'outliers.collectives_pct', made from pair measurements like the outliers of other
# benchmarks; judged at max 20 (below 80% of the peers: FAIL) unless the profile sets its own bound.
# ---------------------------------------------------------------------------------------------------------
PRODUCERS = {name: bench.name for bench in all_benchmarks().values() for name in bench.produces}


def _pairs(figures: dict, size: int = 2**30) -> list[Measurement]:
    return [
        Measurement(
            name="all_reduce",
            scope=pair_scope(a, b),
            params={"bytes": size, "dtype": "float32", "nodes": [a, b]},
            metrics={"busbw_gbps": float(value), "wrong_elements": 0.0},
        )
        for (a, b), value in figures.items()
    ]


def _judge(measured: list[Measurement], checks: dict | None = None):
    derived = outlier_measurements(measured, {"collectives": all_benchmarks()["collectives"].outlier_metrics})
    profile = Profile.model_validate({"name": "x", "checks": checks or {}})
    return threshold_checks(profile, measured + derived, {}, PRODUCERS)


SLOW_NODE = {("a", "b"): 48, ("a", "c"): 50, ("b", "c"): 46, ("a", "d"): 12, ("b", "d"): 13, ("c", "d"): 11}
SLOW_LINK = {("a", "b"): 12, ("a", "c"): 48, ("a", "d"): 50, ("b", "c"): 46, ("b", "d"): 49, ("c", "d"): 47}


def test_the_check_names_the_slow_node_with_its_figures():
    checks = _judge(_pairs(SLOW_NODE))
    assert {c.name for c in checks} == {"outliers.collectives_pct"}  # made without the profile listing it
    failed = [c for c in checks if c.status is Status.FAIL]
    assert [(c.scope, c.value, c.unit) for c in failed] == [("node:d", pytest.approx(72.91666), "%")]
    assert failed[0].detail.startswith(
        "node d: its 3 pairs median 12 GB/s (fastest 13) vs 48 GB/s for the 3 pairs without it "
        "(all_reduce, 1 GiB): 72.9% below, required <= 20: every pair with this node is slow: check its "
        "network adapters"
    )
    passed = sorted(c.scope for c in checks if c.status is Status.PASS)
    assert passed == ["node:a", "node:b", "node:c", "pair:a+d", "pair:b+d", "pair:c+d"]
    link = next(c for c in checks if c.scope == "pair:c+d")
    assert link.detail == (
        "link c+d: 11 GB/s vs 48 GB/s for c's other pairs and 12.5 GB/s for d's, within the scatter of "
        "node d's slow pairs (all_reduce, 1 GiB): 0 %, required <= 20"
    )


def test_the_check_names_the_slow_link():
    checks = _judge(_pairs(SLOW_LINK))
    [failed] = [c for c in checks if c.status is Status.FAIL]
    assert failed.scope == "pair:a+b"
    assert failed.detail.startswith(
        "link a+b: 12 GB/s vs 49 GB/s for a's other pairs and 47.5 GB/s for b's (all_reduce, 1 GiB): "
        "74.7% below, required <= 20: only this pair is slow"
    )


def test_the_profile_sets_the_bound_and_its_level():
    assert {c.status for c in _judge(_pairs(SLOW_NODE), {"outliers.collectives_pct": {"max": 80}})} == {
        Status.PASS
    }
    warned = _judge(_pairs(SLOW_NODE), {"outliers.collectives_pct": {"max": 20, "level": "warn"}})
    assert [c.scope for c in warned if c.status is Status.WARN] == ["node:d"]


def test_no_pairs_no_pair_check_and_a_listed_one_is_skip():
    world = [
        Measurement(name="all_reduce", scope="cluster", params={"bytes": 4096}, metrics={"busbw_gbps": 1.0})
    ]
    assert _judge(world) == []  # one node: accept's checks are what they were
    two_nodes = _pairs({("a", "b"): 10.0})
    assert [c.name for c in _judge(two_nodes)] == []  # one pair has no peers
    [skip] = _judge(world, {"outliers.collectives_pct": {"max": 20}})
    assert skip.status is Status.SKIP


def test_each_node_or_link_keeps_its_worst_over_what_was_measured():
    measured = _pairs(SLOW_NODE) + _pairs(SLOW_LINK, size=2**20)
    by_scope = {m.scope: m for m in outlier_measurements(measured, {"collectives": ("busbw_gbps",)})}
    assert by_scope["node:d"].params["bytes"] == 2**30 and by_scope["pair:a+b"].params["bytes"] == 2**20
    assert by_scope["node:d"].metrics["collectives_pct"] == pytest.approx((48 - 13) / 48 * 100)


# ---------------------------------------------------------------------------------------------------------
# Options and accept's plan: every pair runs after the world on three or more nodes.
# ---------------------------------------------------------------------------------------------------------


def test_accept_plans_pairs_and_bench_does_not():
    plan = plan_benchmarks(load_profile("cpu"), quick=True, on_gpu=False)
    assert plan["collectives"].also_pairs is True
    assert plan["collectives"].pair_ops == ["all_reduce"] and plan["collectives"].pair_bytes == 2**22
    assert bench_options("collectives", {}, quick=True, on_gpu=True).also_pairs is False
    assert bench_options("collectives", {}, quick=True, on_gpu=True).pair_bytes == 2**30
    assert bench_options("collectives", {"scope": "pairs"}, quick=False, on_gpu=False).scope == "pairs"


def test_a_profile_turns_pairs_off_and_may_list_their_check():
    profile = Profile.model_validate(
        {
            "name": "x",
            "checks": {"outliers.collectives_pct": {"max": 10}},
            "benchmarks": {"collectives": {"also_pairs": False}},
        }
    )
    plan = plan_benchmarks(profile, quick=True, on_gpu=False)
    assert list(plan) == ["collectives"] and plan["collectives"].also_pairs is False


# ---------------------------------------------------------------------------------------------------------
# Real runs: gloo under torchrun, ranks posing as nodes.
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("pairs-layouts")
    run_dist_worker("pairs_worker.py", "layouts", str(folder / "out.json"), nproc=4, cwd=folder)
    return json.loads((folder / "out.json").read_text())


def _of(run: dict, name: str | None = None) -> list[dict]:
    return [m for m in run["measurements"] if name is None or m["name"] == name]


@pytest.mark.dist
def test_three_nodes_of_two_one_and_one_rank(layouts):
    run = layouts["three_nodes"]
    measured = {(m["name"], m["scope"]): m for m in _of(run) if m["name"] != "outliers"}
    # schedule of nodes 0, 1, 2: [(1, 2)], [(0, 2)], [(0, 1)]; node-a has two ranks
    expected = {"pair:node-b+node-c": (1, 2), "pair:node-a+node-c": (2, 3), "pair:node-a+node-b": (3, 3)}
    assert set(measured) == {(op, scope) for op in ("all_reduce", "sendrecv") for scope in expected}
    for (_, scope), m in measured.items():
        assert (m["params"]["round"], m["params"]["ranks"]) == expected[scope]
        assert m["params"]["nodes"] == scope.removeprefix("pair:").split("+")
        assert m["params"]["bytes"] == 65536 and m["metrics"]["wrong_elements"] == 0
        assert m["metrics"]["busbw_gbps"] > 0
    correct = [c for c in run["checks"] if c["name"].endswith(".correct")]
    assert len(correct) == 6 and {c["status"] for c in correct} == {"PASS"}
    judged = {c["scope"] for c in run["checks"] if c["name"] == "outliers.collectives_pct"}
    assert {"node:node-a", "node:node-b", "node:node-c"} <= judged


@pytest.mark.dist
def test_two_nodes_one_pair_and_one_node_is_skip(layouts):
    [pair] = _of(layouts["two_nodes"])
    assert (pair["scope"], pair["params"]["ranks"], pair["params"]["round"]) == ("pair:node-a+node-b", 4, 1)
    assert not [c for c in layouts["two_nodes"]["checks"] if c["name"].startswith("outliers")]
    assert _of(layouts["one_node"]) == []
    assert layouts["one_node"]["not_run"]["collectives"] == [
        "SKIP",
        "one node: scope 'pairs' needs two or more nodes",
    ]


@pytest.mark.dist
def test_accept_plan_runs_the_world_then_every_pair(layouts):
    run = layouts["accept_plan"]
    assert run["options"]["collectives"]["also_pairs"] is True
    scopes = [m["scope"] for m in _of(run, "all_reduce")]
    assert scopes[0] == "cluster"
    nodes = ["node-a", "node-b", "node-c", "node-d"]
    assert sorted(scopes[1:]) == [pair_scope(a, b) for a, b in itertools.combinations(nodes, 2)]
    judged = [c for c in run["checks"] if c["name"] == "outliers.collectives_pct"]
    assert {c["scope"] for c in judged} >= {f"node:{node}" for node in nodes}  # the default check, unlisted


# ---------------------------------------------------------------------------------------------------------
# The proof: node-d's process throttled by the kernel (cgroup CPU bandwidth, 1 ms per 10 ms period).
# ---------------------------------------------------------------------------------------------------------
CGROUP_V1 = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller
CGROUP_V2 = Path("/sys/fs/cgroup")
QUOTA_US, PERIOD_US = 1000, 10000  # 10% of one CPU, in short periods so the throttle is smooth


def _own_cgroup(v1: bool) -> Path:
    """Where this process (and so every torchrun rank) sits in the hierarchy: the throttled rank's home."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (v1 and "cpu" in controllers.split(",")) or (not v1 and controllers == ""):
            return (CGROUP_V1 if v1 else CGROUP_V2) / path.lstrip("/")
    raise OSError("no cpu cgroup in /proc/self/cgroup")


def _make_cpu_cgroup(name: str) -> tuple[Path, Path]:
    """(a new cgroup limited to QUOTA_US per PERIOD_US, this process's own cgroup); OSError if not allowed."""
    if (CGROUP_V1 / "cpu.cfs_quota_us").exists():
        made = CGROUP_V1 / name
        made.mkdir()
        (made / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (made / "cpu.cfs_quota_us").write_text(str(QUOTA_US))
        return made, _own_cgroup(v1=True)
    if "cpu" in (CGROUP_V2 / "cgroup.controllers").read_text().split():
        if "cpu" not in (CGROUP_V2 / "cgroup.subtree_control").read_text().split():
            (CGROUP_V2 / "cgroup.subtree_control").write_text("+cpu")
        made = CGROUP_V2 / name
        made.mkdir()
        (made / "cpu.max").write_text(f"{QUOTA_US} {PERIOD_US}")
        return made, _own_cgroup(v1=False)
    raise OSError("no cpu controller in cgroup v1 or v2")


def _remove_cgroup(made: Path, home: Path) -> None:
    for _ in range(50):
        for pid in (made / "cgroup.procs").read_text().split():  # a rank still alive after a failure
            try:
                (home / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # it exited meanwhile
        try:
            made.rmdir()
            return
        except OSError:
            time.sleep(0.1)


@pytest.fixture(scope="module")
def throttled(tmp_path_factory) -> dict:
    try:
        made, home = _make_cpu_cgroup(f"gpuval-test-pairs-{os.getpid()}")
    except OSError as exc:
        why = f"cannot make a CPU-limited cgroup ({exc}); run as root with cgroup v1 or v2's cpu controller"
        if os.environ.get("GPUVAL_REQUIRE_CGROUPS") == "1":
            pytest.fail(f"GPUVAL_REQUIRE_CGROUPS=1 but {why}")
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("pairs-throttled")
    try:
        run_dist_worker("pairs_worker.py", "throttle", str(folder / "out.json"), str(made), str(home),
                        nproc=4, cwd=folder)  # fmt: skip
        throttled = json.loads((folder / "out.json").read_text())["pairs"]
        throttled["cpu.stat"] = (made / "cpu.stat").read_text() if (made / "cpu.stat").exists() else ""
    finally:
        _remove_cgroup(made, home)
    return throttled


@pytest.mark.dist
@pytest.mark.serial  # bandwidths of 4 loopback ranks: another test's load once slowed a clean pair 10x
def test_a_throttled_node_is_named_and_the_others_pass(throttled):
    judged = {c["scope"]: c for c in throttled["checks"] if c["name"] == "outliers.collectives_pct"}
    failed = {scope for scope, c in judged.items() if c["status"] != "PASS"}
    assert failed == {"node:node-d"}, {scope: c["detail"] for scope, c in judged.items()}
    assert judged["node:node-d"]["detail"].startswith("node node-d: its 3 pairs median ")
    assert {"node:node-a", "node:node-b", "node:node-c"} <= set(judged)  # judged, and they PASS
    assert {c["status"] for c in throttled["checks"] if c["name"] == "all_reduce.correct"} == {"PASS"}


@pytest.mark.dist
@pytest.mark.serial  # bandwidths of 4 loopback ranks: another test's load once slowed a clean pair 10x
def test_the_throttle_was_real_and_only_node_d_pairs_are_slow(throttled):
    busbw = {tuple(m["params"]["nodes"]): m["metrics"]["busbw_gbps"] for m in _of(throttled, "all_reduce")}
    assert len(busbw) == 6
    with_d = [v for pair, v in busbw.items() if "node-d" in pair]
    without_d = [v for pair, v in busbw.items() if "node-d" not in pair]
    assert max(with_d) < 0.8 * min(without_d), busbw
    if throttled["cpu.stat"]:  # the kernel's own count: node-d's process was held back, not slept
        stat = dict(line.split() for line in throttled["cpu.stat"].splitlines())
        assert int(stat["nr_throttled"]) > 0

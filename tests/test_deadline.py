"""deadline.py: phases' deadlines derived from their plans (hand-computed here), and the decision the
ranks' watchdog takes from their heartbeats. The runs that a stopped or hung rank ends are in
tests/test_lifecycle.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuval.bench.collectives import CollectiveOptions
from gpuval.bench.collectives import expected_s as collectives_s
from gpuval.bench.matmul import MatmulOptions
from gpuval.bench.matmul import expected_s as matmul_s
from gpuval.bench.run import UNPLANNED_S, expected_benchmark_s
from gpuval.deadline import (
    MARGIN_S,
    SILENT_S,
    Decision,
    deadline_s,
    decide,
    pg_timeout_s,
    printer,
    step_expected_s,
)

CPU = SimpleNamespace(on_gpu=False, num_nodes=1, local_world_size=2)
GPU = SimpleNamespace(on_gpu=True, num_nodes=1, local_world_size=8)


def test_a_phases_deadline_is_its_plan_plus_the_margin_and_the_collective_timeout_comes_after():
    assert MARGIN_S == 30.0 and SILENT_S == 20.0  # the values README and docs/deadlines.md state
    assert deadline_s(12.5) == 42.5
    assert deadline_s(-1.0) == 30.0
    assert pg_timeout_s(12.5) == 57.5  # 15 s past gpuval's own deadline: its line comes first


def test_collectives_plan_at_the_pessimistic_rates():
    options = CollectiveOptions(
        ops=["all_reduce", "all_gather"],
        min_bytes=4096,
        max_bytes=16384,
        step_factor=4,
        warmup=1,
        iters=2,
        repeats=3,
    )
    # sizes 4 KiB and 16 KiB; 1 + 2*3 + 1 (the check) = 8 calls per op and size
    cpu = 2 * 8 * ((0.02 + 4096 / 5e7) + (0.02 + 16384 / 5e7))
    gpu = 2 * 8 * ((0.005 + 4096 / 5e9) + (0.005 + 16384 / 5e9))
    assert collectives_s(options, CPU) == pytest.approx(
        cpu
    )  # 16 × (0.04 s + 20,480 B at 50 MB/s) = 0.6465536 s
    assert collectives_s(options, GPU) == pytest.approx(gpu)
    assert expected_benchmark_s("collectives", options, CPU) == pytest.approx(0.6465536)


def test_collectives_pairs_scope_is_one_round_per_node():
    options = CollectiveOptions(
        min_bytes=4096, max_bytes=4096, scope="pairs", pair_bytes=2**30, warmup=0, iters=1, repeats=1
    )
    four_nodes = SimpleNamespace(on_gpu=True, num_nodes=4, local_world_size=8)
    # 4 rounds × 1 op (all_reduce) × 2 calls × (5 ms + 1 GiB at 5 GB/s)
    assert collectives_s(options, four_nodes) == pytest.approx(4 * 2 * (0.005 + 2**30 / 5e9))


def test_matmul_plan_at_the_pessimistic_rate():
    options = MatmulOptions(
        dtypes=["bf16", "fp32"],
        shapes=[(1000, 1000, 1000)],
        slow_shapes=[(2000, 1000, 1000)],
        warmup=1,
        repeats=2,
        warmup_s=0.5,
        min_time_s=0.1,
        window_s=0.0,
    )
    # bf16: 2e9 flop at 1e13/s = 0.2 ms per call; fp32's slow shape 4e9 flop = 0.4 ms
    # each: (warmup + 2) calls + warmup_s + max(min_time_s, repeats × call)
    bf16 = 3 * 2e-4 + 0.5 + max(0.1, 2 * 2e-4)
    fp32 = 3 * 4e-4 + 0.5 + max(0.1, 2 * 4e-4)
    assert matmul_s(options, GPU) == pytest.approx(bf16 + fp32)


def test_a_benchmark_without_a_plan_gets_the_unplanned_allowance():
    assert expected_benchmark_s("train", None, CPU) == 900.0  # the trainer's first-step allowance
    assert UNPLANNED_S == 600.0


def test_a_training_steps_deadline_follows_the_slowest_step_so_far():
    assert step_expected_s([], 900.0, 5.0, 10.0) == 900.0  # build, compile and the first step
    assert step_expected_s([0.5, 0.7, 0.6], 900.0, 5.0, 10.0) == 10.0  # 5 × 0.7 s is under the floor
    assert step_expected_s([3.0, 12.0, 4.0], 900.0, 5.0, 10.0) == 60.0
    assert deadline_s(step_expected_s([3.0, 12.0, 4.0], 900.0, 5.0, 10.0)) == 90.0


def _beat(phase="collectives", seq=3, expected_s=2.0, age_s=1.0, waiting=True, where="all_reduce (x.py:1)"):
    return {
        "phase": phase,
        "seq": seq,
        "expected_s": expected_s,
        "age_s": age_s,
        "waiting": waiting,
        "where": where,
        "count": 7,
        "done": False,
    }


def test_all_well_is_no_decision():
    beats = {0: _beat(), 1: _beat()}
    assert decide(beats, {0: 0.0, 1: 3.0}, 2) is None


def test_a_silent_rank_is_named_with_its_phase_and_silence_and_the_lowest_other_rank_prints():
    beats = {0: _beat(), 1: _beat(), 2: _beat(phase="health", seq=1)}
    decision = decide(beats, {0: 0.0, 1: 2.0, 2: 21.4}, 3, states={2: "stopped by a signal"})
    assert decision.ranks == [2] and decision.silent == [2]
    assert decision.line == (
        "rank 2 (stopped by a signal) silent for 21 s in phase 'health' (no heartbeat; the limit is 20 s): "
        "stopped by gpuval"
    )
    assert printer(decision, 3) == 0
    assert printer(Decision([0], "x"), 3) == 1
    assert printer(Decision([0, 1, 2], "x"), 3) == 0


def test_a_done_rank_is_never_silent():
    beats = {0: _beat(), 1: {**_beat(), "done": True}}
    assert decide(beats, {0: 0.0, 1: 100.0}, 2) is None


def test_an_overrun_names_the_rank_that_is_not_waiting_for_the_others():
    beats = {
        0: _beat(age_s=33.0),
        1: _beat(age_s=33.0, waiting=False, where="_hang (sitecustomize.py:27)"),
    }
    assert decide({0: _beat(age_s=31.0), 1: _beat(age_s=31.0)}, {}, 2) is None  # 31 s < 2 + 30 s
    decision = decide(beats, {}, 2)
    assert decision.ranks == [1] and decision.silent == []
    assert decision.line == (
        "rank 1 still in phase 'collectives' 33 s after it began (expected 2 s + 30 s margin), at _hang "
        "(sitecustomize.py:27): hung, stopped by gpuval"
    )


def test_an_overrun_where_every_rank_waits_names_the_rank_behind_or_else_all():
    waiting = {0: _beat(seq=4, age_s=40.0), 1: _beat(seq=4, age_s=40.0), 2: _beat(phase="", seq=3)}
    decision = decide(waiting, {}, 3)
    assert decision.ranks == [2]
    assert decision.line.startswith("rank 2 behind, outside any phase, while the others waited 40 s")
    everyone = {0: _beat(age_s=40.0), 1: _beat(age_s=40.0)}
    assert decide(everyone, {}, 2).ranks == [0, 1]


def test_a_waiting_rank_over_first_waits_for_the_working_rank_to_be_over_too():
    """Beats lag each other by up to one beat: the rank waiting in a collective can pass the deadline first
    while the rank that hangs (and began the phase a moment later) has not yet. Naming the waiting rank
    would blame the healthy one; the decision waits for the working rank's own beat instead."""
    hung = _beat(age_s=31.5, waiting=False, where="_hang (sitecustomize.py:27)")
    assert decide({0: _beat(age_s=32.5), 1: hung}, {}, 2) is None
    decision = decide({0: _beat(age_s=34.5), 1: {**hung, "age_s": 33.5}}, {}, 2)
    assert decision.ranks == [1] and decision.line.startswith("rank 1 still in phase 'collectives' 34 s")

"""Bad settings of `gpuval bench` and `gpuval monitor` (issue 50): one line naming the field, exit 2.

Every benchmark's own option is given generated bad values (zero, negative, too large, non-finite, a
boolean, text, an empty list) through `bench_options`, the validation that `bench --set`, a profile's
`benchmarks:` section and `accept --set benchmarks.NAME.KEY` all pass; good values at the bounds must still
pass. The size sweep ends whatever its options hold. Monitor's options are fuzzed in this process; a few
cases at the end run as child processes, as users run gpuval.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import cli_env, ends_within
from test_fuzz_inputs import assert_clean, invoke

from gpuval.bench.collectives import CollectiveOptions, sweep_sizes
from gpuval.bench.run import bench_options
from gpuval.cli.monitor import MAX_INTERVAL_S
from gpuval.errors import UsageError
from gpuval.monitor.exporter import parse_address
from gpuval.timing import MAX_CALLS, MAX_SECONDS
from gpuval.units import MAX_BYTES

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SETTINGS = settings(
    max_examples=30,
    deadline=None,
    database=None,  # no .hypothesis/ folder left behind
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
MAX_INT = 2**63 - 1  # the largest integer a profile or --set can hold (gpuval.inputs)
TEXT = st.sampled_from(["", " ", "abc", "five", "[/]", "1,5", "0x10", "nan", "-inf", "1e400"])


# --- bad values of each kind of option -------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """Bad values of one option: its edges, each tried every run (the values gpuval once took: 0, 2.0, true),
    and a strategy that generates more."""

    edges: tuple[Any, ...]
    more: st.SearchStrategy[Any]

    @property
    def any(self) -> st.SearchStrategy[Any]:
        return st.one_of(st.sampled_from(self.edges), self.more)


def bad_count(low: int, high: int | None) -> Bad:
    """Not an integer in [low, high]: out of range, a float (even 2.0), a boolean, text, nothing."""
    more = [
        st.booleans(),
        st.none(),
        TEXT,
        st.integers(min_value=-MAX_INT, max_value=low - 1),
        st.floats(allow_nan=True, allow_infinity=True),
    ]
    if high is not None:
        more.append(st.integers(min_value=high + 1, max_value=MAX_INT))
    above = () if high is None else (high + 1, MAX_INT)
    return Bad((low - 1, True, float(low), str(low), *above), st.one_of(more))


def bad_number(low: float, high: float, low_allowed: bool = True) -> Bad:
    """Not a finite number in [low, high] ((low, high] where low itself is not allowed)."""
    below = st.floats(max_value=low, allow_infinity=True).filter(lambda v: v < low or not low_allowed)
    edges = (True, False, math.inf, math.nan, low - 1, high * 2, f"{high * 2:g}", "1e308", ".inf")
    more = st.one_of(
        st.none(),
        TEXT,
        below,
        st.floats(min_value=high, allow_infinity=True).filter(lambda v: v > high),
        st.integers(min_value=int(high) + 1, max_value=MAX_INT),
    )
    return Bad(edges + (() if low_allowed else (low,)), more)


def _good_size(value: Any, least: int) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value == int(value) and least <= value


def bad_size(least: int) -> Bad:
    """Not a byte size of at least `least` and at most 1 PiB: zero, negative, fractional, too large, ..."""
    edges = (0, least - 1, -1, True, "0", "0KiB", str(least - 1), MAX_BYTES + 1, "2048TiB", 1.5, math.inf)
    more = st.one_of(
        st.none(),
        st.sampled_from(["", "abc", "-1", "1.5", "1iB", "nan"]),
        st.integers(min_value=-MAX_INT, max_value=least - 1),
        st.integers(min_value=MAX_BYTES + 1, max_value=MAX_INT),
        st.floats(allow_nan=True, allow_infinity=True).filter(
            lambda v: not (_good_size(v, least) and v <= MAX_BYTES)
        ),
    )
    return Bad(edges, more)


def with_one_bad(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """A list of good items with one bad item somewhere in it."""
    return st.tuples(st.lists(good, max_size=3), bad, st.integers(min_value=0, max_value=3)).map(
        lambda parts: [*parts[0][: parts[2]], parts[1], *parts[0][parts[2] :]]
    )


DIM = st.integers(min_value=1, max_value=2**20)
BAD_SHAPES = Bad(
    ([], [[-1, 1, 1]], [[0, 0, 0]], [[1, 1, True]], [[1.0, 1, 1]], [[1, 1, 2**20 + 1]], [[1, 1]]),
    with_one_bad(
        st.tuples(DIM, DIM, DIM).map(list),
        st.one_of(
            st.tuples(DIM, DIM, bad_count(1, 2**20).any).flatmap(
                lambda dims: st.permutations(dims).map(list)
            ),
            st.lists(DIM, max_size=2),  # too few sides
            st.lists(DIM, min_size=4, max_size=5),  # too many
        ),
    ),
)


def bad_names(names: list[str]) -> Bad:
    """An empty list (nothing measured), or one with a name that is not one of `names`."""
    unknown = st.sampled_from(["", "bf8", "int8", "all-reduce", "ALL"])
    return Bad(([], ["nope"], names[0]), with_one_bad(st.sampled_from(names), unknown))


def bad_sizes(least: int) -> Bad:
    """A list of sizes with one bad size in it."""
    good = st.integers(min_value=least, max_value=MAX_BYTES)
    return Bad(([0], [least, 0], [True], ["0"], [-1]), with_one_bad(good, bad_size(least).any))


TIMED = {
    "warmup": bad_count(0, MAX_CALLS),
    "repeats": bad_count(1, MAX_CALLS),
    "warmup_s": bad_number(0, MAX_SECONDS),
    "min_time_s": bad_number(0, MAX_SECONDS),
    "window_s": bad_number(0, 10),
}
OPS = ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "sendrecv"]
BAD: dict[str, dict[str, Bad]] = {
    "collectives": {
        "ops": bad_names(OPS),
        "pair_ops": bad_names(OPS),
        "min_bytes": bad_size(1),
        "max_bytes": bad_size(1),
        "pair_bytes": bad_size(1),
        "extra_sizes": bad_sizes(1),
        "step_factor": bad_count(2, None),
        "warmup": bad_count(0, MAX_CALLS),
        "iters": bad_count(1, MAX_CALLS),
        "repeats": bad_count(1, MAX_CALLS),
    },
    "matmul": {
        **TIMED,
        "dtypes": bad_names(["bf16", "fp16", "fp8", "tf32", "fp32"]),
        "shapes": BAD_SHAPES,
        "slow_shapes": BAD_SHAPES,
    },
    "membw": {**TIMED, "device_bytes": bad_size(4), "host_bytes": bad_size(4)},
    "p2p": {**TIMED, "bytes": bad_size(4)},
    "train": {
        "seq_len": bad_count(16, 2**20),
        "records": bad_count(1, 10**6),
        "steps": bad_count(1, MAX_CALLS),
        "untimed_steps": bad_count(0, MAX_CALLS),
        "micro_batch_size": bad_count(1, 1024),
        "grad_accum_steps": bad_count(1, 1024),
        "lr": bad_number(0, 1, low_allowed=False),
    },
}
FIELDS = [(bench, field) for bench, fields in BAD.items() for field in fields]
FIELD_IDS = [f"{bench}.{field}" for bench, field in FIELDS]


def assert_refused(bench: str, field: str, value: Any, quick: bool, on_gpu: bool) -> None:
    """The options are refused in one line that names the benchmark and the field."""
    with pytest.raises(UsageError) as refused:
        bench_options(bench, {field: value}, quick, on_gpu)
    message = str(refused.value)
    assert message.startswith(f"bench {bench}: ") and f"'{field}" in message, (value, message)
    assert "\n" not in message, message


@pytest.mark.parametrize(("bench", "field"), FIELDS, ids=FIELD_IDS)
def test_the_edges_are_refused(bench, field):
    for value in BAD[bench][field].edges:
        for on_gpu in (False, True):
            assert_refused(bench, field, value, quick=on_gpu, on_gpu=on_gpu)


@pytest.mark.parametrize(("bench", "field"), FIELDS, ids=FIELD_IDS)
@SETTINGS
@given(data=st.data(), quick=st.booleans(), on_gpu=st.booleans())
def test_a_bad_value_is_refused_in_one_line_naming_the_field(bench, field, data, quick, on_gpu):
    assert_refused(bench, field, data.draw(BAD[bench][field].any, label=field), quick, on_gpu)


@SETTINGS
@given(
    smallest=st.integers(min_value=2, max_value=MAX_BYTES),
    less=st.integers(min_value=1, max_value=MAX_BYTES),
)
def test_max_bytes_below_min_bytes_is_refused(smallest, less):
    largest = max(1, smallest - less)
    with pytest.raises(UsageError, match=r"'max_bytes': .*below min_bytes .*give max_bytes >= min_bytes"):
        bench_options("collectives", {"min_bytes": smallest, "max_bytes": largest}, True, False)


@SETTINGS
@given(
    min_bytes=st.integers(min_value=0, max_value=MAX_BYTES),
    max_bytes=st.integers(min_value=0, max_value=MAX_BYTES),
    step_factor=st.integers(min_value=0, max_value=2**20),
    extra=st.lists(st.integers(min_value=0, max_value=MAX_BYTES), max_size=3),
)
def test_the_size_sweep_ends_whatever_its_options_hold(min_bytes, max_bytes, step_factor, extra):
    # model_construct: no validation, as if a caller skipped it; the loop itself must still end
    options = CollectiveOptions.model_construct(
        min_bytes=min_bytes, max_bytes=max_bytes, step_factor=step_factor, extra_sizes=extra
    )
    with ends_within(5):
        sizes = sweep_sizes(options)
    assert sizes == sorted(set(sizes)) and len(sizes) <= 64 + len(extra)


@SETTINGS
@given(
    smallest=st.integers(min_value=1, max_value=MAX_BYTES),
    factor=st.integers(min_value=2, max_value=16),
    data=st.data(),
)
def test_a_valid_sweep_holds_every_step_up_to_max_bytes(smallest, factor, data):
    largest = data.draw(st.integers(min_value=smallest, max_value=MAX_BYTES))
    values = {"min_bytes": smallest, "max_bytes": largest, "step_factor": factor}
    sizes = sweep_sizes(bench_options("collectives", values, True, False))
    assert sizes[0] == smallest and sizes[-1] <= largest < sizes[-1] * factor
    assert all(b == a * factor for a, b in zip(sizes, sizes[1:], strict=False))


@pytest.mark.parametrize(
    ("bench", "values"),
    [
        ("collectives", {"min_bytes": 1, "max_bytes": 1, "extra_sizes": [1, MAX_BYTES], "pair_bytes": "1"}),
        ("collectives", {"warmup": 0, "iters": MAX_CALLS, "repeats": 1, "step_factor": 2**40}),
        ("matmul", {"dtypes": ["fp32"], "shapes": [[1, 1, 2**20]], "slow_shapes": [(2**20, 1, 1)]}),
        ("matmul", {"warmup": MAX_CALLS, "min_time_s": "1e-3", "warmup_s": 0, "window_s": 10}),
        ("membw", {"device_bytes": 4, "host_bytes": "1GiB", "min_time_s": MAX_SECONDS}),
        ("p2p", {"bytes": "4", "repeats": MAX_CALLS}),
        ("train", {"seq_len": 16, "lr": "2e-3", "untimed_steps": 0, "micro_batch_size": 1024}),
        ("train", {"lr": 1, "records": 10**6, "steps": MAX_CALLS}),
    ],
)
def test_values_at_the_bounds_are_taken(bench, values):
    for quick in (False, True):
        for on_gpu in (False, True):
            bench_options(bench, values, quick, on_gpu)


# --- monitor's options ------------------------------------------------------------------------------------


@SETTINGS
@given(
    host=st.sampled_from(["", "127.0.0.1:", ":", "[::1]:", "node1:"]),
    port=st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=6).filter(
        lambda text: not text.isascii()
    ),
)
def test_a_port_of_other_digits_is_refused(host, port):
    # '²' and '٣' pass str.isdigit() but int() refuses '²' and reads '٣' as 3
    with pytest.raises(UsageError, match="expected HOST:PORT"):
        parse_address(host + port)


@SETTINGS
@given(text=st.text(max_size=30))
def test_any_prometheus_address_is_an_address_or_refused(text):
    try:
        host, port = parse_address(text)
    except UsageError:  # the one refusal; any other exception would be an internal error
        return
    assert isinstance(port, int) and 0 <= port <= 65535 and host


BAD_INTERVALS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda v: not 0.1 <= v <= MAX_INTERVAL_S),
    st.sampled_from(["inf", "-inf", "nan", "1e308", "1e400", "infinity"]),
)


@SETTINGS
@given(interval=BAD_INTERVALS)
def test_a_bad_interval_is_refused_in_one_line(interval, tmp_path):
    args = ["monitor", "--once", "--interval", str(interval)]
    with ends_within(20):  # an interval taken would sleep that long (or overflow)
        result = invoke(args, tmp_path)
    assert_clean(result, {2}, args)
    assert "--interval" in result[2], result[2]


# --- as users run it --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["bench", "collectives", "--quick", "--set", "min_bytes=0"], "'min_bytes'"),
        (["bench", "matmul", "--set", "shapes=[[-1,1,1]]"], "'shapes.0.0'"),
        (["bench", "membw", "--quick", "--nproc", "0"], "--nproc"),
        (["monitor", "--prometheus", "²"], "--prometheus '²'"),
        (["monitor", "--once", "--interval", "inf"], "--interval"),
    ],
)
def test_as_a_child_process(args, fragment, tmp_path):
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gpuval", *args], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert_clean((proc.returncode, proc.stdout, proc.stderr), {2}, args)
    assert fragment in proc.stderr, proc.stderr
    assert time.monotonic() - began < 20, "a refusal comes before any work"
    assert not any(tmp_path.iterdir()), "nothing written"


@pytest.mark.parametrize(
    "field",
    ["lora.alpha", "lora.dropout", "prepare.eval_fraction", "prepare.unseen_fraction", "train.optim.lr",
     "train.optim.weight_decay", "train.optim.grad_clip"],
)  # fmt: skip
def test_a_boolean_is_no_number_in_a_finetune_config(field):
    """The fine-tune config's floats (also the train benchmark's lora section) refuse true/false, which
    pydantic's lax float reads as 1.0 or 0.0; a number written as text stays a number."""
    from pathlib import Path

    from gpuval.finetune.config import load_finetune_config

    config = Path(__file__).parents[1] / "configs" / "finetune" / "tiny-cpu.yaml"
    with pytest.raises(UsageError, match=field.rsplit(".", 1)[1]):
        load_finetune_config(config, [f"{field}=true"])
    assert load_finetune_config(config, [f"{field}=0.0625"]) is not None

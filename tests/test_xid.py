"""Which kernel-log XIDs count: those logged since the latest of boot, the node's last passing
`gpuval accept` (a real history database) and `health.xid_since`.

The recorded kernel logs (tests/data/kmsg/) are /dev/kmsg records of a node booted at 08:00:00Z (the fake
/proc/stat says so): Xid 48 on GPU 0 at 09:00, Xid 13 on GPU 1 at 09:30, Xid 94 on GPU 1 at 10:30.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from nvml_replay import ReplayNvml, load

from gpuval.config import load_profile
from gpuval.errors import UsageError
from gpuval.health import xid
from gpuval.health.run import node_health
from gpuval.history import last_passing_run, record
from gpuval.results import Check, Result, Status, World

KMSG = Path(__file__).parent / "data" / "kmsg"
BOOT = 1795507200  # 2026-11-24T08:00:00Z
NODE = "n1"
ALL_THREE = [
    ("gpu:n1/0", Status.FAIL, 48),
    ("gpu:n1/1", Status.FAIL, 94),
    ("gpu:n1/1", Status.WARN, 13),
]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root whose /proc/stat says the node booted at 08:00:00Z."""
    (tmp_path / "root" / "proc").mkdir(parents=True)
    (tmp_path / "root" / "proc" / "stat").write_text(f"cpu  10 0 5 900\nbtime {BOOT}\nprocesses 4242\n")
    return tmp_path / "root"


def kernel_log(root: Path, sets=(), history: Path | None = None, kmsg="xid-window.txt") -> list[Check]:
    profile = load_profile("h200-sxm", ["expect.gpu_count=2", *sets])
    checks = node_health(
        profile, NODE, library=ReplayNvml(load("h200x2")), root=root, kmsg=KMSG / kmsg, history=history
    )
    return [c for c in checks if c.name == "xid.kernel_log"]


def judged(checks: list[Check]) -> list[tuple[str, Status, int]]:
    return sorted((c.scope, c.status, c.value) for c in checks if c.status is not Status.PASS)


def accept_run(history: Path, started_at: str, verdict: Status, nodes=(NODE,)) -> None:
    """One `gpuval accept` run stored by gpuval's own history writer."""
    record(
        history,
        Result(
            verdict=verdict,
            started_at=started_at,
            duration_s=60.0,
            profile="h200-sxm",
            world=World(size=2, nodes=len(nodes), backend="nccl"),
            inventory={"nodes": [{"node": node} for node in nodes]},
            checks=[Check(name="expect.gpu_count", status=verdict, value=2, scope=f"node:{nodes[0]}")],
        ),
    )


def test_by_default_every_xid_since_boot_counts(root):
    checks = kernel_log(root)
    assert judged(checks) == ALL_THREE
    for check in checks:
        assert " in the kernel log since boot " in check.detail


def test_an_xid_before_health_xid_since_is_not_a_fail_one_after_is(root):
    checks = kernel_log(root, ["health.xid_since=2026-11-24T09:15:00Z"])
    assert judged(checks) == [("gpu:n1/1", Status.FAIL, 94), ("gpu:n1/1", Status.WARN, 13)]
    assert all("in the kernel log since 2026-11-24T09:15:00Z (health.xid_since)" in c.detail for c in checks)


def test_health_xid_since_in_another_zone_is_the_same_instant(root):
    checks = kernel_log(root, ["health.xid_since=2026-11-24T11:15:00+01:00"])  # 10:15Z
    assert judged(checks) == [("gpu:n1/1", Status.FAIL, 94)]
    assert "since 2026-11-24T10:15:00Z (health.xid_since)" in checks[0].detail


def test_no_xid_after_the_window_passes_and_counts_the_earlier_ones(root):
    (check,) = kernel_log(root, ["health.xid_since=2026-11-24T11:00:00Z"])
    assert check.status is Status.PASS
    assert check.detail == (
        f"no NVRM Xid line in {KMSG / 'xid-window.txt'} since 2026-11-24T11:00:00Z (health.xid_since); "
        "3 logged before it not counted"
    )


def test_health_xid_since_before_boot_leaves_the_boot_window(root):
    checks = kernel_log(root, ["health.xid_since=2026-11-01T00:00:00Z"])
    assert judged(checks) == ALL_THREE
    assert all(" since boot " in c.detail for c in checks)


def test_an_xid_before_the_last_passing_run_is_not_a_fail(root, tmp_path):
    history = tmp_path / "history.sqlite"
    accept_run(history, "2026-11-24T09:45:00+00:00", Status.PASS)
    checks = kernel_log(root, history=history)
    assert judged(checks) == [("gpu:n1/1", Status.FAIL, 94)]
    assert "in the kernel log since 2026-11-24T09:45:00Z (last passing run)" in checks[0].detail


def test_an_xid_before_a_failing_run_still_counts(root, tmp_path):
    history = tmp_path / "history.sqlite"
    accept_run(history, "2026-11-24T08:30:00+00:00", Status.PASS)
    accept_run(history, "2026-11-24T10:45:00+00:00", Status.FAIL)  # later, but it did not pass
    accept_run(history, "2026-11-24T10:50:00+00:00", Status.ERROR)
    checks = kernel_log(root, history=history)
    assert judged(checks) == ALL_THREE
    assert all("since 2026-11-24T08:30:00Z (last passing run)" in c.detail for c in checks)


def test_only_passing_runs_that_included_this_node_count(root, tmp_path):
    history = tmp_path / "history.sqlite"
    accept_run(history, "2026-11-24T10:45:00+00:00", Status.PASS, nodes=("n2",))
    accept_run(history, "2026-11-24T10:40:00+00:00", Status.PASS, nodes=("n10", "n11"))
    assert judged(kernel_log(root, history=history)) == ALL_THREE
    accept_run(history, "2026-11-24T09:10:00+00:00", Status.PASS, nodes=("n1", "n2"))
    assert judged(kernel_log(root, history=history)) == [
        ("gpu:n1/1", Status.FAIL, 94),
        ("gpu:n1/1", Status.WARN, 13),
    ]


def test_the_later_of_the_passing_run_and_health_xid_since_wins(root, tmp_path):
    history = tmp_path / "history.sqlite"
    accept_run(history, "2026-11-24T09:15:00+00:00", Status.PASS)
    checks = kernel_log(root, ["health.xid_since=2026-11-24T09:45:00Z"], history=history)
    assert judged(checks) == [("gpu:n1/1", Status.FAIL, 94)]
    assert "since 2026-11-24T09:45:00Z (health.xid_since)" in checks[0].detail
    checks = kernel_log(root, ["health.xid_since=2026-11-24T08:45:00Z"], history=history)
    assert judged(checks) == [("gpu:n1/1", Status.FAIL, 94), ("gpu:n1/1", Status.WARN, 13)]
    assert "since 2026-11-24T09:15:00Z (last passing run)" in checks[0].detail


def test_a_missing_or_broken_history_is_no_passing_run_and_is_not_created(root, tmp_path):
    missing = tmp_path / "nowhere" / "history.sqlite"
    assert judged(kernel_log(root, history=missing)) == ALL_THREE
    assert not missing.parent.exists()  # read-only: health never creates the database
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(b"not a database at all" * 100)
    assert last_passing_run(broken, NODE) is None
    assert judged(kernel_log(root, history=broken)) == ALL_THREE


def test_every_critical_xid_says_how_it_stops_counting(root):
    for check in kernel_log(root):
        said = "--set health.xid_since=<time of the reset, ISO 8601> are not counted" in check.detail
        assert said is (check.status is Status.FAIL), check.detail
    assert all(xid.AFTER_RESET not in info.action for info in xid.XIDS.values())  # added once, in the check


def test_malformed_timestamps_do_not_crash_and_count(root):
    """Lines whose stamp cannot be read cannot be shown to predate the window: they count; a dmesg-style
    stamp is read like a /dev/kmsg one; an absurdly late one is simply after the window."""
    checks = kernel_log(root, ["health.xid_since=2026-11-24T10:00:00Z"], kmsg="xid-bad-stamps.txt")
    assert judged(checks) == [
        ("gpu:n1/0", Status.FAIL, 48),
        ("gpu:n1/1", Status.FAIL, 94),
        ("gpu:n1/1", Status.WARN, 13),
    ]
    by_xid = {c.value: c.detail for c in checks}
    assert "on GPU 0 3 times in the kernel log since 2026-11-24T10:00:00Z" in by_xid[48]
    # of the two Xid 13 lines, the one stamped [ 5400.000001] (09:30Z) is not counted
    assert "on GPU 1 in the kernel log" in by_xid[13]


def test_kernel_log_stamps():
    lines = (
        "3,2471,9000987654,-;NVRM: Xid (PCI:0000:00:07): 94, pid=6060, Contained: SM (0x1).\n"
        "4,12,5000000,-,caller=T42;NVRM: Xid (PCI:0000:3b:00): 31, pid=7, name=a.out\n"
        "Nov 24 09:30:00 n1 kernel: [ 5400.000001] NVRM: Xid (0000:3b:00): 13, pid=1, name=x\n"
        "Nov 24 09:30:00 n1 kernel: NVRM: Xid (0000:3b:00): 43, pid=1, name=x\n"
    )
    assert [(x.uptime_s, x.xid) for x in xid.parse_kernel_log(lines)] == [
        (9000.987654, 94),
        (5.0, 31),
        (5400.000001, 13),
        (None, 43),
    ]


def test_boot_time_comes_from_proc_stat_else_from_the_clocks(root, tmp_path, monkeypatch):
    assert xid.boot_time(root) == BOOT
    monkeypatch.setattr(xid.time, "time", lambda: 5000.0)
    monkeypatch.setattr(xid.time, "monotonic", lambda: 1200.0)
    assert xid.boot_time(tmp_path / "no-root") == 3800.0
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "stat").write_text("btime soon\n")
    assert xid.boot_time(tmp_path) == 3800.0  # a broken file is no crash


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("2026-11-24T10:00:00", "give the time zone"),
        ("2026-11-24", "with the time of day"),
        ("yesterday", "expected an ISO-8601 time"),
        ("1795507200", "with the time of day"),  # not epoch seconds
    ],
)
def test_a_bad_health_xid_since_is_a_one_line_usage_error(value, says):
    with pytest.raises(UsageError, match=f"'health.xid_since': Value error, .*{says}") as raised:
        load_profile("cpu", [f"health.xid_since={value}"])
    assert "\n" not in str(raised.value)

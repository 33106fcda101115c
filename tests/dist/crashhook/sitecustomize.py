"""Test hook, put on PYTHONPATH by tests/test_crash.py only: an exception gpuval does not foresee.

Active only where the test sets GPUVAL_TEST_CRASH:
- `launcher`: the launcher's call into torch's engine raises TypeError (as torch 2.11 did for a keyword
  it did not know), before any rank starts;
- `rank0` / `rank1`: that rank's benchmarks raise TypeError in the middle of accept (or bench);
- `usage-rank1`: that rank's benchmarks raise a UsageError (an error gpuval foresaw, said in one line);
- `stop-start-rank1`: that rank stops itself (SIGSTOP) as its interpreter starts: it never arrives;
- `stop-join-rank1`: that rank stops itself just before it joins the process group (having said it would);
- `stop-first-rank1`: that rank stops itself once the group formed, before the group's first collective.
Several, comma-separated, for several ranks. Anywhere else it imports nothing.
"""

import os

_wheres = os.environ.get("GPUVAL_TEST_CRASH", "").split(",")
_where = _wheres[0]
_rank = os.environ.get("RANK", "0")


def _stop() -> None:
    """SIGSTOP this process, having written when into TMPDIR/stopped-rankN (the test times from there)."""
    import signal
    import time

    with open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"stopped-rank{_rank}"), "w") as handle:
        handle.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGSTOP)


if _where == "launcher" and "RANK" not in os.environ:
    import gpuval.launch as _launch

    def _launch_local(nproc, argv, timeout_s=300.0, shutdown_s=_launch.SHUTDOWN_TIMEOUT_S):
        raise TypeError("LaunchConfig.__init__() got an unexpected keyword argument 'from_the_test'")

    _launch.launch_local = _launch_local

if f"rank{_rank}" in _wheres:
    import gpuval.bench.run as _run

    def _run_benchmarks(*args, **kwargs):
        raise TypeError("an argument this torch does not take (from the test)")

    _run.run_benchmarks = _run_benchmarks

if f"usage-rank{_rank}" in _wheres:
    import gpuval.bench.run as _run
    from gpuval.errors import UsageError

    def _run_benchmarks(*args, **kwargs):
        raise UsageError(f"GPU {_rank}: a setting this rank cannot use (from the test); change it")

    _run.run_benchmarks = _run_benchmarks

if f"stop-join-rank{_rank}" in _wheres:
    import torch.distributed as _dist

    _join = _dist.init_process_group

    def _stopped_join(*args, **kwargs):
        _stop()
        return _join(*args, **kwargs)

    _dist.init_process_group = _stopped_join

if f"stop-start-rank{_rank}" in _wheres and "RANK" in os.environ:
    _stop()

if f"stop-first-rank{_rank}" in _wheres:
    import gpuval.runtime as _runtime

    _gather = _runtime.Runtime.all_gather_object

    def _stopped_gather(self, obj):
        _stop()
        return _gather(self, obj)

    _runtime.Runtime.all_gather_object = _stopped_gather

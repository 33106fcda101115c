"""Test hook, put on PYTHONPATH by tests/test_lifecycle.py and tests/test_slurm.py only: one rank hangs at
its first all_reduce.

Active only in a process whose RANK (or, under srun, SLURM_PROCID) equals GPUVAL_TEST_HANG_RANK (set by
the test; '-' is a process without either, a single-process run); anywhere else, including the parent
`gpuval` process of a self-launched run, it does nothing. GPUVAL_TEST_HANG says how: 'stop' (the rank stops itself with SIGSTOP,
as `kill -STOP` would) or 'sleep' (it blocks for an hour). Before it hangs it creates the file
GPUVAL_TEST_HANG_MARK, so the test knows every rank is mid-run.
"""

import os

_rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "-"))  # torchrun's or srun's numbering
if os.environ.get("GPUVAL_TEST_HANG_RANK") is not None and _rank == os.environ.get("GPUVAL_TEST_HANG_RANK"):
    import signal
    import time

    import torch.distributed as _dist

    def _hang(*args, **kwargs):
        mark = os.environ.get("GPUVAL_TEST_HANG_MARK")
        if mark:
            with open(mark, "w") as handle:
                handle.write(str(os.getpid()))
        if os.environ.get("GPUVAL_TEST_HANG") == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)

    _dist.all_reduce = _hang

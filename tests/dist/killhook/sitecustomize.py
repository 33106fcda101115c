"""Test hook, put on PYTHONPATH by tests/test_collectives.py only: kills one rank at its first collective.

Active only in a process whose RANK equals GPUVAL_TEST_KILL_RANK (set by the test); anywhere else,
including the parent `gpuval` process that has no RANK, it does nothing.
"""

import os

if os.environ.get("RANK") is not None and os.environ.get("RANK") == os.environ.get("GPUVAL_TEST_KILL_RANK"):
    import torch.distributed as _dist

    def _die(*args, **kwargs):
        os._exit(9)  # no cleanup, no message: a process killed mid-collective

    _dist.all_reduce = _die

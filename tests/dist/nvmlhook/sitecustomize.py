"""Test hook, put on PYTHONPATH by tests that start gpuval as a child process: gpuval's NVML layer answers
from a recording made on a real machine (tests/data/nvml/), as on a GPU node.

- GPUVAL_TEST_NVML=STEM replays tests/data/nvml/STEM.json in every process that has the hook;
  GPUVAL_TEST_NVML_INIT_ERROR=NVMLError_DriverNotLoaded (any pynvml error class) makes nvmlInit fail
  with it instead, as on a node whose driver is not loaded (tests/test_health.py).
- GPUVAL_TEST_NVML_NODE=NAME (tests/test_slurm.py) replays the H100 recording (h100x1, unless
  GPUVAL_TEST_NVML names another) only in processes on that Slurm node (SLURMD_NODENAME, as srun sets
  it): that node looks like a GPU node to a CPU profile that expects none, so its health FAILs while the
  other node's passes.

- GPUVAL_TEST_SLOW_EXIT_NODE=NAME (tests/test_slurm.py): processes on that Slurm node wait 5 s before
  they exit, as a rank on a loaded node leaves late: Slurm's --kill-on-bad-exit then kills it on its way
  out once another rank has exited with the verdict's FAIL.

NVML cannot exist on the CPU machine; this is the recorded real answer, not an invented one. Only gpuval's
layer is replaced: torch and accelerate consult pynvml too, and a GPU they cannot use sends them down other
paths. Without these variables the hook does nothing.
"""

import os
import sys

_node = os.environ.get("GPUVAL_TEST_NVML_NODE")
_recording = os.environ.get("GPUVAL_TEST_NVML") or ("h100x1" if _node else "")
if _recording and (not _node or os.environ.get("SLURMD_NODENAME") == _node):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/: nvml_replay
    from nvml_replay import ReplayNvml, load

    from gpuval import nvml as _nvml

    _recorded = ReplayNvml(load(_recording), init_error=os.environ.get("GPUVAL_TEST_NVML_INIT_ERROR"))
    _init = _nvml.Nvml.__init__

    def _replayed(self, library=None):  # gpuval's NVML layer only: torch and the rest keep the real one
        _init(self, _recorded if library is None else library)

    _nvml.Nvml.__init__ = _replayed

_slow = os.environ.get("GPUVAL_TEST_SLOW_EXIT_NODE")
if _slow and _slow == os.environ.get("SLURMD_NODENAME"):
    import atexit
    import time

    _exit = os._exit

    def _late_exit(code):  # gpuval's ranks leave through os._exit (runtime.py), which skips atexit
        time.sleep(5)
        _exit(code)

    os._exit = _late_exit
    atexit.register(time.sleep, 5)

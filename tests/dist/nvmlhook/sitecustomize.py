"""Test hook, put on PYTHONPATH by tests/test_slurm.py only: one Slurm node answers NVML from a recording.

In a process on the node named by GPUVAL_TEST_NVML_NODE (SLURMD_NODENAME, as srun sets it), gpuval's
NVML layer answers from a real H100 recording (tests/data/nvml/h100x1.json): that node looks like a GPU
node to a CPU profile that expects none, so its health FAILs while the other node's passes. NVML cannot
exist on the CPU machine; this is the recorded real answer, not an invented one. Only gpuval's layer is
replaced: torch and accelerate consult pynvml too, and a GPU they cannot use sends them down other paths.
Anywhere else the hook does nothing.
"""

import os
import sys

if os.environ.get("GPUVAL_TEST_NVML_NODE") and os.environ.get("SLURMD_NODENAME") == os.environ.get(
    "GPUVAL_TEST_NVML_NODE"
):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/: nvml_replay
    from nvml_replay import ReplayNvml, load

    from gpuval import nvml as _nvml

    _recorded = ReplayNvml(load("h100x1"))
    _init = _nvml.Nvml.__init__

    def _replayed(self, library=None):  # gpuval's NVML layer only: torch and the rest keep the real one
        _init(self, _recorded if library is None else library)

    _nvml.Nvml.__init__ = _replayed

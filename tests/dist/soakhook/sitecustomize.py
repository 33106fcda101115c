"""Test hook, put on PYTHONPATH by tests/test_soak.py only: a fault that starts in one iteration of a soak.

Which iteration runs is read from the soak's own record: while GPUVAL_TEST_SOAK_LOG (the run's
iterations.jsonl) holds GPUVAL_TEST_SOAK_AFTER lines, iteration AFTER+1 runs on every rank (rank 0 writes
a line before any rank starts the next iteration). Then:

- GPUVAL_TEST_SOAK_SLOW=F (ranks only): torch.matmul takes F times as long in that iteration, as on a GPU
  whose clocks dropped (each product sleeps F-1 times its own duration); the others run at full speed.
- GPUVAL_TEST_SOAK_ECC=N: gpuval's NVML layer answers from the H100 recording (tests/data/nvml/h100x1.json,
  as tests/dist/nvmlhook does) with N more uncorrectable volatile ECC errors on GPU 0 from that iteration
  on (the count never goes back).

Without GPUVAL_TEST_SOAK_LOG the hook does nothing.
"""

import os
import sys

_log = os.environ.get("GPUVAL_TEST_SOAK_LOG")
if _log:
    import time

    _after = int(os.environ.get("GPUVAL_TEST_SOAK_AFTER", "1"))
    _seen = [-1, 0]  # file size, lines: counted again only when the file grew

    def _lines() -> int:
        try:
            size = os.stat(_log).st_size
        except OSError:
            return 0
        if size != _seen[0]:
            with open(_log, "rb") as handle:
                _seen[:] = [size, handle.read().count(b"\n")]
        return _seen[1]

    _slow = float(os.environ.get("GPUVAL_TEST_SOAK_SLOW", "0"))
    if _slow > 1 and os.environ.get("RANK") is not None:
        import torch

        _matmul = torch.matmul

        def _throttled(*args, **kwargs):
            began = time.perf_counter()
            product = _matmul(*args, **kwargs)
            if _lines() == _after:
                time.sleep((_slow - 1) * (time.perf_counter() - began))
            return product

        torch.matmul = _throttled

    _ecc = int(os.environ.get("GPUVAL_TEST_SOAK_ECC", "0"))
    if _ecc:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/: nvml_replay
        import pynvml
        from nvml_replay import ReplayNvml, load

        from gpuval import nvml as _nvml

        class _Creeping(ReplayNvml):
            def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter):  # noqa: N802 - pynvml's name
                value = super().nvmlDeviceGetTotalEccErrors(handle, error_type, counter)
                grown = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED and handle == 0
                return value + _ecc if grown and _lines() >= _after else value

        _recorded = _Creeping(load("h100x1"))
        _init = _nvml.Nvml.__init__

        def _replayed(self, library=None):
            _init(self, _recorded if library is None else library)

        _nvml.Nvml.__init__ = _replayed

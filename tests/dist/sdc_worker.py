"""Worker for tests/test_sdc.py under `torchrun --standalone --nproc_per_node=3`: sdc_worker.py BAD OUT.json

Every rank computes the SDC fingerprint on its CPU; rank BAD (-1: none) has one element of its chain's
input flipped, as a corrupting multiplier would leave it. Rank 0 writes the checks as JSON.
"""

from __future__ import annotations

import json
import sys

import torch

from gpuval.health import sdc
from gpuval.runtime import init_runtime


def main() -> None:
    bad, out = int(sys.argv[1]), sys.argv[2]
    runtime = init_runtime(timeout_s=60)
    if runtime.rank == bad:
        real_tanh = torch.tanh

        def corrupt(x):  # the first element flips sign once per product: a wrong multiply, no error
            y = real_tanh(x)
            y.view(-1)[0] = -y.view(-1)[0]
            return y

        torch.tanh = corrupt
    checks = sdc.run_sdc(runtime)
    if runtime.is_main:
        with open(out, "w") as handle:
            json.dump([c.model_dump(mode="json") for c in checks], handle)
    runtime.shutdown()


if __name__ == "__main__":
    main()

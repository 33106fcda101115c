"""GPU kernel time of a PyTorch profiler trace (two profiled steps), per kind of kernel, in ms per step.

python3 buckets.py TRACE.json.gz [TRACE.json.gz ...]
"""

import gzip
import json
import re
import sys
from collections import defaultdict

KINDS = [  # first match wins
    ("attention (cuDNN)", r"cudnn|sdpa|flash"),
    ("products (cuBLAS nvjet/cutlass)", r"nvjet|cutlass|gemm|sm90_xmma"),
    ("dropout", r"dropout"),
    (
        "RMSNorm / RoPE / SwiGLU / loss (Triton)",
        r"rms|rope|silu|layernorm|logsumexp|cross_entropy|fused_linear_ce|triton",
    ),
    ("copies and fills", r"[Mm]emcpy|[Mm]emset|copy|fill|elementwise_kernel|vectorized"),
]
STEPS = 2

for path in sys.argv[1:]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    per: dict[str, float] = defaultdict(float)
    for event in kernels:
        kind = next((k for k, rx in KINDS if re.search(rx, event["name"])), "other")
        per[kind] += event["dur"] / 1000 / STEPS
    start = min(e["ts"] for e in kernels)
    end = max(e["ts"] + e["dur"] for e in kernels)
    out = {
        "trace": path,
        "window_ms_per_step": round((end - start) / 1000 / STEPS, 1),
        "kernel_ms_per_step": round(sum(per.values()), 1),
        "kinds_ms_per_step": {k: round(v, 1) for k, v in sorted(per.items(), key=lambda kv: -kv[1])},
    }
    print(json.dumps(out))

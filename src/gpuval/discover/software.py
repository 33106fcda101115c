"""Software versions that decide how a GPU run behaves: Python, torch and the CUDA libraries it ships
(CUDA runtime, NCCL, cuDNN), and the driver as NVML reports it. A CPU-only torch gives None, not a crash.
"""

from __future__ import annotations

import importlib.util
import platform
import runpy
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuval import __version__
from gpuval.nvml import NvmlSnapshot, available


def version_text(code: Any) -> str | None:
    """NCCL's (2, 21, 5) or 21905, cuDNN's 90100 or 8907 -> '2.21.5', '9.1.0', '8.9.7'."""
    if isinstance(code, (tuple, list)):
        return ".".join(str(part) for part in code)
    if not isinstance(code, int) or isinstance(code, bool):
        return None
    # Both libraries moved from major*1000 + minor*100 + patch to major*10000 + minor*100 + patch
    # (NCCL at 2.9, cuDNN at 9.0: nccl.h NCCL_VERSION, cudnn_version.h CUDNN_VERSION).
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def torch_build() -> dict[str, Any] | None:
    """torch's own torch/version.py (__version__, cuda), read without importing torch, which takes 2-3 s;
    None when torch is not installed or the file cannot be read."""
    if "torch" in sys.modules:
        version = sys.modules["torch"].version
        return {"__version__": version.__version__, "cuda": version.cuda}
    try:
        spec = importlib.util.find_spec("torch")
        locations = list(spec.submodule_search_locations or []) if spec else []
        return runpy.run_path(str(Path(locations[0]) / "version.py")) if locations else None
    except Exception:  # noqa: BLE001 - an unusual install: the caller imports torch instead
        return None


def _torch_versions() -> dict[str, Any]:
    found: dict[str, Any] = {"torch": None, "cuda_runtime": None, "nccl": None, "cudnn": None}
    build = torch_build()
    if build is not None and build.get("cuda") is None and build.get("__version__"):
        found["torch"] = build["__version__"]  # a CPU build: no CUDA library to ask, no import needed
        return found
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken torch install is reported, not raised
        found["torch_error"] = f"{type(exc).__name__}: {exc}"
        return found
    found["torch"] = torch.__version__
    found["cuda_runtime"] = torch.version.cuda  # None on a CPU-only build
    if torch.version.cuda:
        try:  # ncclGetVersion needs no GPU, only a CUDA build of torch
            found["nccl"] = version_text(torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - a build without NCCL (Windows, ROCm) has none to report
            pass
    try:
        found["cudnn"] = version_text(torch.backends.cudnn.version())
    except Exception:  # noqa: BLE001 - cuDNN missing from the install: None
        pass
    return found


def software_versions(nvml: NvmlSnapshot | None = None) -> dict[str, Any]:
    """Versions as strings (None where absent); driver keys come from the NVML snapshot."""

    def plain(value: Any) -> Any:
        return value if available(value) else None

    return {
        "python": platform.python_version(),
        "gpuval": __version__,
        **_torch_versions(),
        "driver_version": plain(nvml.driver_version) if nvml else None,
        "cuda_driver_version": plain(nvml.cuda_driver_version) if nvml else None,
        "nvml_version": plain(nvml.nvml_version) if nvml else None,
    }


# Variables that change how NCCL, gloo and torch.distributed move data (or report on it).
COMMUNICATION_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_", "NVSHMEM_", "UCX_")
COMMUNICATION_VARIABLES = ("CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_SYMM_MEM_DISABLE_MULTICAST")


def communication_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The NCCL environment profile this process runs under (GPUVAL_ENV_PROFILE, set by every file in
    deploy/env/) and every communication variable set, whoever set it: the profile, the image, the user."""
    variables = {
        key: value
        for key, value in sorted(environ.items())
        if key.startswith(COMMUNICATION_PREFIXES) or key in COMMUNICATION_VARIABLES
    }
    return {"profile": environ.get("GPUVAL_ENV_PROFILE") or None, "variables": variables}

"""Third-party chatter off the console: Python warnings (FutureWarnings and the like from torch,
transformers, peft) and transformers' / huggingface_hub's logging and loading bars go to a log file in the
run's output folder, so a user's console shows gpuval's own lines and progress only.

Every rank writes its own file (`third_party.log` for rank 0, `third_party.rank<N>.log` for the others):
a warning one rank alone raises is kept, and no two processes append to one file.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

LOG_NAME = "third_party.log"
_LOGGERS = (
    "py.warnings",
    "transformers",
    "huggingface_hub",
    "peft",
    "accelerate",
    "datasets",
    "torch",
    "DeepSpeed",
)


def log_path(folder: Path, rank: int) -> Path:
    return folder / (LOG_NAME if rank == 0 else f"third_party.rank{rank}.log")


def nccl_log_paths(folder: Path, rank: int) -> dict[str, str]:
    """Where NCCL and PyTorch's NCCL watchdog write, beside the rank's third-party log: NCCL's debug output
    (NCCL_DEBUG_FILE; NCCL opens it for writing, so it gets a file of its own instead of sharing one with
    Python's logging) and the flight recorder's dump on a timeout (TORCH_FR_DUMP_TEMP_FILE, called
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE before; torch adds the rank to the name). docs/deadlines.md."""
    stem = log_path(folder, rank).stem  # third_party / third_party.rank<N>
    trace = str(folder / "nccl_trace_rank_")
    return {
        "NCCL_DEBUG_FILE": str(folder / f"{stem}.nccl.log"),
        "TORCH_FR_DUMP_TEMP_FILE": trace,
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": trace,
    }


def route_nccl_output(folder: str | Path, rank: int) -> None:
    """Set nccl_log_paths' variables where the user has set none (before the process group starts)."""
    paths = nccl_log_paths(Path(folder), rank)
    Path(folder).mkdir(parents=True, exist_ok=True)
    if "NCCL_DEBUG_FILE" not in os.environ:
        os.environ["NCCL_DEBUG_FILE"] = paths["NCCL_DEBUG_FILE"]
    if "TORCH_FR_DUMP_TEMP_FILE" not in os.environ and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in os.environ:
        os.environ["TORCH_FR_DUMP_TEMP_FILE"] = paths["TORCH_FR_DUMP_TEMP_FILE"]
        os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = paths["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]


def route_third_party_output(folder: str | Path, rank: int = 0) -> Path:
    """Send warnings and the libraries' logging to `folder`'s log file and switch their progress bars off.
    Returns the file's path. Safe to call more than once (a second call moves the output)."""
    path = log_path(Path(folder), rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    handler.set_name("gpuval-third-party")
    logging.captureWarnings(True)  # warnings.warn -> the 'py.warnings' logger
    warnings.simplefilter("default")  # each warning once per place it is raised from
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if h.get_name() == "gpuval-third-party"]:
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.propagate = False
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    # huggingface_hub's loading bars, and transformers', which follow the hub's switch when transformers is
    # imported: the variable where the hub is not loaded yet, its switch where it is
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "huggingface_hub" in sys.modules:
        _hub_bars_off()
    # transformers' own stderr handler and DeepSpeed's stdout one (accelerate imports deepspeed where it is
    # installed, and a merged export's save asks it for the accelerator): removed now where the library is
    # loaded, else right after it loads. Importing them here would cost every accept and bench rank about
    # a second of CPU for libraries that only the train benchmark and the fine-tune load.
    _after_import("transformers.utils.logging", _transformers_quiet)
    _after_import("deepspeed.utils.logging", _deepspeed_quiet)
    return path


def _after_import(name: str, then: Callable[[], None]) -> None:
    """`then()` now where the module `name` is loaded, else once it is (once, however often asked)."""
    if name in sys.modules:
        then()
    elif not any(isinstance(finder, _AfterImport) and finder.name == name for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, then))


def _hub_bars_off() -> None:
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:
        pass


def _transformers_quiet() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_default_handler()
    hf_logging.disable_progress_bar()


def _deepspeed_quiet() -> None:
    logger = logging.getLogger("DeepSpeed")
    for handler in [h for h in logger.handlers if h.get_name() != "gpuval-third-party"]:
        logger.removeHandler(handler)  # its console handler; gpuval's file handler stays


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then()` once the module `name` has been executed, whoever imports it: the finder steps aside
    for the real one and wraps the loader it returns. It stays on sys.meta_path until the module has run:
    a mere lookup (`importlib.util.find_spec`, as transformers' `is_peft_available` and accelerate's
    checks do) gets a spec that is never executed, and must not use the hook up."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then
        self._looking = self._done = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self._looking or self._done:
            return None
        self._looking = True  # the lookup below asks sys.meta_path again, this finder included
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._looking = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        load = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)  # the import system put the module in sys.modules before: `then` imports it
            if not self._done:
                self._done = True
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                self.then()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

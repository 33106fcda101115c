"""The flat benchmark registry (after torchtitan): a name maps to one Benchmark; duplicates are errors.

Adding a benchmark = one module in gpuval/bench/ ending with `register(Benchmark(...))`. Modules are
discovered by listing the package, so no central list needs editing.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from gpuval.errors import UsageError
from gpuval.results import Measurement


class BenchmarkSkipped(Exception):
    """Raised on every rank when the hardware here cannot run the benchmark (e.g. P2P with one GPU)."""


@dataclass
class Context:
    """What a benchmark run gets besides its options."""

    runtime: Any  # gpuval.runtime.Runtime
    quick: bool = False
    progress: Callable[[str], None] = lambda message: None


@dataclass(frozen=True)
class Benchmark:
    name: str
    summary: str
    options: type[BaseModel]
    # (quick, on_gpu) -> option values used where the user set none
    defaults: Callable[[bool, bool], dict[str, Any]]
    run: Callable[[Context, Any], list[Measurement]]
    # measurement names this benchmark emits: a profile check '<name>.<metric>' pulls the benchmark in
    produces: tuple[str, ...]
    # metrics compared across GPUs (or links) for the outlier check 'outliers.<benchmark>_pct': the first
    # one that was measured (bf16 on GPUs, fp32 on CPUs)
    outlier_metrics: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def make_options(self, overrides: dict[str, Any], quick: bool, on_gpu: bool, source: str) -> Any:
        from gpuval.config import validate_model

        values = {**self.defaults(quick, on_gpu), **overrides}
        return validate_model(self.options, values, source)


_REGISTRY: dict[str, Benchmark] = {}
_LOADED = False
_NOT_BENCHMARKS = {"registry", "run"}


def register(benchmark: Benchmark) -> Benchmark:
    if benchmark.name in _REGISTRY:
        raise ValueError(f"benchmark '{benchmark.name}' is registered twice")
    _REGISTRY[benchmark.name] = benchmark
    return benchmark


def load_all() -> None:
    global _LOADED
    if _LOADED:
        return
    import gpuval.bench as package

    for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda found: found.name):
        if module.name not in _NOT_BENCHMARKS and not module.name.startswith("_"):
            importlib.import_module(f"gpuval.bench.{module.name}")
    _LOADED = True


def all_benchmarks() -> dict[str, Benchmark]:
    """Every benchmark, by name in name order: the order they run and are reported in, whichever module
    happened to be imported first."""
    load_all()
    return {name: _REGISTRY[name] for name in sorted(_REGISTRY)}


def get(name: str) -> Benchmark:
    benchmarks = all_benchmarks()
    if name in benchmarks:
        return benchmarks[name]
    close = difflib.get_close_matches(name, list(benchmarks), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise UsageError(f"unknown benchmark '{name}'{hint}; available: {', '.join(sorted(benchmarks))}")


def producer_of(measurement_name: str) -> Benchmark | None:
    for benchmark in all_benchmarks().values():
        if measurement_name in benchmark.produces:
            return benchmark
    return None

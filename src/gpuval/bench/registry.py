"""The flat benchmark registry (after torchtitan): a name maps to one Benchmark; duplicates are errors.

Adding a benchmark = one module in gpuval/bench/ ending with `register(Benchmark(...))`. Modules are
discovered by listing the package, so no central list needs editing. The registration also declares what
its measurements' metrics mean (gpuval.metrics), and any rule that sets the benchmark apart (its own plan
from the profile's thresholds, crossing nodes) is a field here, never its name tested elsewhere.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from gpuval.errors import UsageError
from gpuval.results import Measurement

if TYPE_CHECKING:
    from gpuval.metrics import MeasurementDecl


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
    # the measurements this benchmark emits, with their metrics' meaning: a profile check
    # '<name>.<metric>' on one of them pulls the benchmark in
    metrics: tuple[MeasurementDecl, ...]
    # metrics compared across GPUs (or links) for the outlier check 'outliers.<benchmark>_pct': the first
    # one that was measured (bf16 on GPUs, fp32 on CPUs)
    outlier_metrics: tuple[str, ...] = ()
    # (option overrides, the profile's thresholds on this benchmark's measurements) -> overrides: what the
    # thresholds imply for the options (a size a threshold names is measured)
    plan: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None
    # runs across nodes: not run when a node failed health (its numbers would go through that node)
    crosses_nodes: bool = False
    # (options, runtime) -> the seconds its plan takes at a pessimistic rate: its phase's deadline
    # (gpuval.deadline); None: bench/run.py's UNPLANNED_S
    expected_s: Callable[[Any, Any], float] | None = None

    @property
    def produces(self) -> tuple[str, ...]:
        """Measurement names this benchmark emits."""
        return tuple(decl.name for decl in self.metrics)

    def make_options(self, overrides: dict[str, Any], quick: bool, on_gpu: bool, source: str) -> Any:
        from gpuval.config import deep_merge, validate_model

        # deep: overriding one key of a section (train's step.compile) keeps that section's other defaults
        values = deep_merge(self.defaults(quick, on_gpu), overrides)
        return validate_model(self.options, values, source)


_REGISTRY: dict[str, Benchmark] = {}
_LOADED = False
_NOT_BENCHMARKS = {"registry", "run"}


def register(benchmark: Benchmark) -> Benchmark:
    if benchmark.name in _REGISTRY:
        raise ValueError(f"benchmark '{benchmark.name}' is registered twice")
    for other in _REGISTRY.values():  # one producer per measurement name: one meaning for its metrics
        if shared := set(benchmark.produces) & set(other.produces):
            raise ValueError(f"benchmarks '{benchmark.name}', '{other.name}' both declare {sorted(shared)}")
    _REGISTRY[benchmark.name] = benchmark
    return benchmark


def unregister(name: str) -> None:
    """Remove a benchmark and so its declarations (a test's toy benchmark cleans up with it)."""
    _REGISTRY.pop(name, None)


def load_all() -> None:
    global _LOADED
    if _LOADED:
        return
    # the package's modules found by listing its folder (importing the package from here would be a cycle)
    for module in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda found: found.name):
        if module.name not in _NOT_BENCHMARKS and not module.name.startswith("_"):
            importlib.import_module(f"{__package__}.{module.name}")
    _LOADED = True


def all_benchmarks() -> dict[str, Benchmark]:
    """Every benchmark, by name in name order: the order they run and are reported in, whichever module
    happened to be imported first."""
    load_all()
    return {name: _REGISTRY[name] for name in sorted(_REGISTRY)}


def producers() -> dict[str, str]:
    """Measurement name -> the benchmark that emits it: how a profile check finds the benchmark to run."""
    return {produced: bench.name for bench in all_benchmarks().values() for produced in bench.produces}


def get(name: str) -> Benchmark:
    benchmarks = all_benchmarks()
    if name in benchmarks:
        return benchmarks[name]
    close = difflib.get_close_matches(name, list(benchmarks), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise UsageError(f"unknown benchmark '{name}'{hint}; available: {', '.join(sorted(benchmarks))}")

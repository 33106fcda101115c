"""What every metric means, declared once: its unit, which way is better, whether runs are compared on it,
what to look at when it misses its bound, and which parameters say *what* a measurement measured.

Checks, `gpuval compare`, history drift and the console and HTML reports all read this registry and nothing
else, so a metric is either declared here (and then judged, compared, drift-checked and rendered with its
unit) or visibly undeclared: `find` answers None, `metric` raises, and `undeclared` lists every metric of
a result that no declaration covers (a test holds it empty for everything gpuval produces).

Declarations live beside their producer: a benchmark passes its `MeasurementDecl`s to
`register(Benchmark(..., metrics=...))`; a derived measurement ('outliers', made from the benchmarks' own
metrics) passes its own to gpuval.derived's registry. Lookups load both packages first, so a reader of an
old result.json needs no benchmark to have run.

A metric `<key>_min` / `<key>_max` is the spread (slowest and fastest window) of `<key>`: it shares the
unit and is never compared; such companions are derived, not declared.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

from gpuval.checkref import CheckRef
from gpuval.results import Measurement

SPREAD_SUFFIXES = ("_min", "_max")
DEFAULT_HINT = "compare with the node's earlier runs"
# How a measurement is shown (console table, report plot); the renderers are keyed by these, not by names.
VIEWS = ("table", "size_sweep", "per_gpu", "pair_matrix", "throughput", "none")


@dataclass(frozen=True)
class Metric:
    """One metric key of a measurement. `key` may hold a '*' wildcard ('*_pct') for a family of keys."""

    key: str
    unit: str
    better: int  # +1: higher is better, -1: lower is better, 0: neither
    compared: bool = True  # judged by `gpuval compare` and history drift (a loss or a spread is not)
    hint: str = ""  # what to look at when it misses its bound; '' falls back to the measurement's hint
    description: str = ""  # a few words for a plot axis or a table
    plot: bool = False  # drawn in its measurement's report plot
    # the one metric `gpuval compare` shows for its measurement in its summary; unset, the first plotted
    # compared metric is, else the first compared one declared (MeasurementDecl.headline_keys)
    headline: bool = False
    # depends on the host more than on the GPU (pinned host<->device copies): accept measures it again
    # once before its check FAILs and judges the better of the two (gpuval.remeasure)
    noisy: bool = False

    def __post_init__(self) -> None:
        if self.better not in (-1, 0, 1):
            raise ValueError(f"metric '{self.key}': better must be +1, -1 or 0, not {self.better!r}")

    @property
    def direction(self) -> int:
        """+1 when higher is better, -1 when lower is, 0 when runs are not judged on it."""
        return self.better if self.compared else 0


@dataclass(frozen=True)
class MeasurementDecl:
    """A measurement name (Measurement.name), its metrics and the parameters that identify it.

    `identity`: the params that say *what* was measured (a collective's bytes and dtype), as opposed to
    how (iterations, kernels): two runs' measurements match on name, scope and these.
    """

    name: str
    metrics: tuple[Metric, ...]
    identity: tuple[str, ...] = ()
    hint: str = ""
    view: str = "table"
    # its figures depend on how many GPUs take part (collectives, P2P through NVSwitch): profiles bound it
    # per GPU count (Threshold.by_gpus) and `gpuval profiles derive` derives it per count
    by_gpu_count: bool = False

    def __post_init__(self) -> None:
        if self.view not in VIEWS:
            raise ValueError(f"measurement '{self.name}': view '{self.view}' is not one of {VIEWS}")
        keys = [m.key for m in self.metrics]
        if len(set(keys)) != len(keys):
            raise ValueError(f"measurement '{self.name}' declares a metric twice: {keys}")
        if sum(m.headline for m in self.metrics) > 1:
            raise ValueError(f"measurement '{self.name}' declares more than one headline metric")

    def find(self, key: str) -> Metric | None:
        """The declared metric `key`, its derived spread companion, or a wildcard family member."""
        for metric in self.metrics:
            if metric.key == key:
                return metric
        for suffix in SPREAD_SUFFIXES:
            if key.endswith(suffix) and (base := self.find(key[: -len(suffix)])) is not None:
                return dataclasses.replace(base, key=key, compared=False, plot=False)
        for metric in self.metrics:
            if "*" in metric.key and fnmatch.fnmatchcase(key, metric.key):
                return dataclasses.replace(metric, key=key)
        return None

    def plotted(self) -> list[Metric]:
        return [m for m in self.metrics if m.plot]

    def headline_keys(self) -> list[str]:
        """The compared metrics, the one to summarise the measurement by first: the declared headline,
        then the plotted ones (what its report draws), then the rest in declared order."""
        compared = [m for m in self.metrics if m.compared]
        return [m.key for m in sorted(compared, key=lambda m: (not m.headline, not m.plot))]


class UndeclaredMetric(KeyError):
    """A metric that no declaration covers."""


def _load() -> dict[str, MeasurementDecl]:
    """Every declaration: each registered benchmark's (the registry loads the benchmark package, and
    refuses a measurement name two benchmarks both emit) and each derived measurement's (gpuval.derived).
    Read on every lookup, so a benchmark registered later (a plugin, a test's toy one) is judged, compared
    and rendered at once."""
    from gpuval import derived
    from gpuval.bench.registry import all_benchmarks

    found = {decl.name: decl for decl in derived.declarations()}
    for benchmark in all_benchmarks().values():
        found.update((decl.name, decl) for decl in benchmark.metrics)
    return found


def declared() -> dict[str, MeasurementDecl]:
    """Every declaration by measurement name."""
    return _load()


def measurement(name: str) -> MeasurementDecl | None:
    return _load().get(name)


def find(name: str, key: str) -> Metric | None:
    """The metric `key` of measurement `name`, or None when nothing declares it."""
    decl = measurement(name)
    return decl.find(key) if decl is not None else None


def metric(name: str, key: str) -> Metric:
    """Like `find`, but an undeclared metric raises UndeclaredMetric naming what is declared."""
    found = find(name, key)
    if found is None:
        decl = measurement(name)
        known = ", ".join(m.key for m in decl.metrics) if decl else "nothing (no such measurement)"
        raise UndeclaredMetric(f"'{name}.{key}' is not declared; '{name}' declares {known}")
    return found


def unit(name: str, key: str) -> str:
    """The unit of `name.key` ('' when undeclared)."""
    found = find(name, key)
    return found.unit if found else ""


def direction(name: str, key: str) -> int:
    """+1 when higher is better, -1 when lower is, 0 when undeclared or not compared."""
    found = find(name, key)
    return found.direction if found else 0


def of_check(check_name: str) -> Metric | None:
    """The metric a check '<measurement>.<metric>' judges; None for a health check or anything undeclared."""
    ref = CheckRef.read(check_name)
    return find(ref.measurement, ref.metric) if ref is not None else None


def noisy(name: str, key: str) -> bool:
    """Whether `name.key` is measured again once before its check FAILs."""
    found = find(name, key)
    return bool(found and found.noisy)


def by_gpu_count(name: str) -> bool:
    """Whether measurement `name` is bounded per GPU count."""
    decl = measurement(name)
    return bool(decl and decl.by_gpu_count)


def identity(name: str) -> tuple[str, ...] | None:
    """The identifying params of measurement `name`; None when undeclared (a caller then uses them all)."""
    decl = measurement(name)
    return decl.identity if decl else None


def hint(name: str, key: str) -> str:
    """What to look at when `name.key` misses its bound: the metric's hint, else its measurement's."""
    decl = measurement(name)
    found = decl.find(key) if decl else None
    return (found.hint if found else "") or (decl.hint if decl else "") or DEFAULT_HINT


def view(name: str) -> str:
    """How measurement `name` is shown ('table' when undeclared)."""
    decl = measurement(name)
    return decl.view if decl else "table"


def undeclared(measurements: Iterable[Measurement]) -> list[str]:
    """Every 'name.key' of these measurements that no declaration covers, sorted."""
    return sorted({f"{m.name}.{key}" for m in measurements for key in m.metrics if find(m.name, key) is None})

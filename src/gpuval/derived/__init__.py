"""Derived measurements: what gpuval makes from the benchmarks' own measurements after they ran.

Each is one module of this package that declares its metrics, computes its measurements or checks and
says what to look at when one misses its bound, ending with `register(Derived(...))` (as the benchmarks
do in gpuval.bench.registry). Modules are found by listing the package, so the code that judges, plans
and renders asks this registry what a name is instead of testing for it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuval.checkref import CheckRef
    from gpuval.config import Threshold
    from gpuval.metrics import MeasurementDecl
    from gpuval.results import Check, Measurement


@dataclass(frozen=True)
class Derived:
    """One derived measurement (or check) and what the rest of gpuval needs to know of it."""

    name: str
    # its metrics' declarations, joined to gpuval.metrics' (None: its checks carry their own unit)
    decl: MeasurementDecl | None = None
    # (every measurement, the benchmarks that ran by name) -> the measurements it derives from them
    derive: Callable[[list[Measurement], Mapping[str, Any]], list[Measurement]] | None = None
    # every measurement -> the checks it makes on its own, with no profile bound
    checks: Callable[[list[Measurement]], list[Check]] | None = None
    # (a profile check on it, every benchmark by name, the profile's name) -> the benchmark it needs run;
    # a check it cannot make is a one-line UsageError
    plan: Callable[[CheckRef, Mapping[str, Any], str], str] | None = None
    # a profile check on it -> the benchmark its figure comes from (None: it cannot say)
    source: Callable[[CheckRef], str | None] = lambda ref: None
    # why a check on it has nothing to judge although its benchmark ran (SKIP); '' : an ERROR
    nothing_derived: str = ""
    # (its measurement, the metric, the value, the bound described) -> the detail of a check past its bound
    explain: Callable[[Measurement, str, float, str], str] | None = None
    # checks made whenever their measurement exists, with this bound unless the profile sets its own
    default_checks: dict[str, Threshold] = field(default_factory=dict)


_REGISTRY: dict[str, Derived] = {}
_LOADED = False


def register(derived: Derived) -> Derived:
    if derived.name in _REGISTRY:
        raise ValueError(f"derived measurement '{derived.name}' is registered twice")
    _REGISTRY[derived.name] = derived
    return derived


def all_derived() -> dict[str, Derived]:
    """Every derived measurement by name, in name order."""
    global _LOADED
    if not _LOADED:
        # the package's modules found by listing its folder (a static import of them would be a cycle
        # through gpuval.metrics, which reads their declarations)
        for module in sorted(
            pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda found: found.name
        ):
            importlib.import_module(f"{__package__}.{module.name}")
        _LOADED = True
    return dict(sorted(_REGISTRY.items()))


def get(name: str) -> Derived | None:
    """The derived measurement called `name`, None for a benchmark's own."""
    return all_derived().get(name)


def of_check(check_name: str) -> Derived | None:
    """The derived measurement a check judges ('outliers.matmul_pct' -> outliers), None for any other.

    Such a check compares a run's own figures with each other (the slowest GPU against its peers' median)
    and is bounded absolutely in every run: a relative change from one run to the next says nothing (a gap
    of 1 % that becomes 3 % is "200 % worse", and the GPU it names changes from run to run), so drift
    over a soak's iterations and over a node's history leaves it out."""
    from gpuval.checkref import CheckRef

    ref = CheckRef.read(check_name)
    return get(ref.measurement) if ref is not None else None


def declarations() -> list[MeasurementDecl]:
    return [d.decl for d in all_derived().values() if d.decl is not None]


def derive(measurements: list[Measurement], benchmarks: Mapping[str, Any]) -> list[Measurement]:
    """Every derived measurement made from `measurements` of the benchmarks that ran."""
    return [m for d in all_derived().values() if d.derive for m in d.derive(measurements, benchmarks)]


def derived_checks(measurements: list[Measurement]) -> list[Check]:
    """The checks every derived measurement makes on its own."""
    return [c for d in all_derived().values() if d.checks for c in d.checks(measurements)]


def default_checks() -> list[tuple[CheckRef, Threshold]]:
    from gpuval.checkref import CheckRef

    return [(CheckRef.parse(n), t) for d in all_derived().values() for n, t in d.default_checks.items()]

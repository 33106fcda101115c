"""The '<measurement>.correct' check: every collective result compared exactly with the expected values.

Made from the 'wrong_elements' metric each collective measures at each size, summed over a measurement's
sizes. A check of its own, judged exactly (any wrong element is a FAIL: silent data corruption), so it is
neither compared between runs nor drift-checked, and no profile bounds it. Declared, computed and
explained here.
"""

from __future__ import annotations

from collections import defaultdict

from gpuval.checkref import CheckRef
from gpuval.derived import Derived, register
from gpuval.metrics import Metric
from gpuval.results import Check, Measurement, Status
from gpuval.units import format_bytes

CORRECT = Metric("correct", "elements", -1, compared=False, description="wrong elements over all sizes")
SOURCE_METRIC = "wrong_elements"  # what a measurement counts to be checked for correctness
HINT = "run it per node (--set scope=node) to isolate the node, then check NVLink/IB errors"


def correctness_checks(measurements: list[Measurement]) -> list[Check]:
    """Every collective result is compared exactly; any wrong element is a FAIL (silent data corruption)."""
    grouped: dict[tuple[str, str], list[Measurement]] = defaultdict(list)
    for m in measurements:
        if SOURCE_METRIC in m.metrics:
            grouped[(m.name, m.scope)].append(m)
    checks = []
    for (name, scope), items in grouped.items():
        check_name = CheckRef(name, CORRECT.key).name
        if any(m.metrics[SOURCE_METRIC] is None for m in items):
            checks.append(
                Check(
                    name=check_name,
                    status=Status.ERROR,
                    threshold={"max": 0},
                    unit=CORRECT.unit,
                    scope=scope,
                    detail="the result check produced no count: correctness unknown, rerun",
                )
            )
            continue
        bad = [m for m in items if (m.metrics[SOURCE_METRIC] or 0) > 0]
        wrong = sum(m.metrics[SOURCE_METRIC] or 0 for m in bad)
        if bad:
            sizes = ", ".join(format_bytes(m.params["bytes"]) for m in bad)
            detail = f"{int(wrong)} wrong elements at {sizes}: results differ from the exact expected values"
            detail += f"; {HINT}"
        else:
            detail = f"exact at all {len(items)} sizes"
        checks.append(
            Check(
                name=check_name,
                status=Status.FAIL if bad else Status.PASS,
                value=wrong,
                threshold={"max": 0},
                unit=CORRECT.unit,
                scope=scope,
                detail=detail,
            )
        )
    return checks


register(Derived(CORRECT.key, checks=correctness_checks))

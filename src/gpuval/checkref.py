"""Check names, built and read here and nowhere else: a profile check's reference, and the families.

A profile names a check '<measurement>.<metric>' ('all_reduce.busbw_gbps', 'outliers.matmul_pct') and may
select one size of a swept measurement with its threshold's `bytes`. `CheckRef` is that name and size as a
value: gpuval.config parses every check of a profile into one when the profile is validated
(`Profile.check_refs`), and the name and its size are written out here and nowhere else.

Every check name is '<family>.<member>' or a family alone: a health family's checks ('ecc.uncorrected'),
a benchmark's ('matmul.bf16_tflops', its 'matmul.run'), and the checks made of other checks, whose member
is that other check's name or a label: DRIFT (a check against the node's own past,
'drift.matmul.bf16_tflops'), SOAK (over a soak's iterations, 'soak.membw.copy_tbps', 'soak.iterations')
and FLEET (across the nodes of one run, 'fleet.driver'). `in_family` builds such a name, `member_of` and
`family_of` read one back (tests/test_structure.py holds every other module to them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuval.units import format_bytes

if TYPE_CHECKING:
    from gpuval.results import Measurement

_NAME = re.compile(r"(?P<measurement>[a-z0-9_]+)\.(?P<metric>[a-z0-9_]+)")


class CheckRefError(ValueError):
    """A check name that is not '<measurement>.<metric>' (a ValueError: pydantic reports it at its key)."""


@dataclass(frozen=True)
class CheckRef:
    """Measurement `measurement`'s metric `metric`, at `bytes` where the check selects one size."""

    measurement: str
    metric: str
    bytes: int | None = None

    @classmethod
    def parse(cls, name: str, bytes: int | None = None) -> CheckRef:
        """The reference a check name makes; anything else is a one-line CheckRefError naming it."""
        match = _NAME.fullmatch(name) if isinstance(name, str) else None
        if match is None:
            raise CheckRefError(f"check name '{name}' must look like '<measurement>.<metric>'")
        return cls(match["measurement"], match["metric"], bytes)

    @classmethod
    def read(cls, name: str) -> CheckRef | None:
        """The reference a check's name makes, None for a name of another shape (a health check such as
        'drift.matmul.bf16_tflops'): for readers of checks already made."""
        try:
            return cls.parse(name)
        except CheckRefError:
            return None

    @property
    def name(self) -> str:
        """The check's name, as results and profiles hold it: 'all_reduce.busbw_gbps'."""
        return f"{self.measurement}.{self.metric}"

    def __str__(self) -> str:
        return self.name

    @property
    def where(self) -> str:
        """' at 1 GiB' where the check selects one size, else ''."""
        return f" at {format_bytes(self.bytes)}" if self.bytes is not None else ""

    def selects(self, measurement: Measurement) -> bool:
        """Whether `measurement` is one this check judges: its name, the metric measured, the size."""
        return (
            measurement.name == self.measurement
            and self.metric in measurement.metrics
            and (self.bytes is None or measurement.params.get("bytes") == self.bytes)
        )


DRIFT = "drift"  # a check against the node's own recent past (gpuval.history)
SOAK = "soak"  # a check over a soak's iterations (gpuval.soak_judge)
FLEET = "fleet"  # a check across the nodes of one run (gpuval.health.fleet)


def in_family(family: str, member: str) -> str:
    """The name of `family`'s check `member`: in_family(DRIFT, 'matmul.bf16_tflops') is
    'drift.matmul.bf16_tflops', in_family('matmul', 'run') is 'matmul.run'."""
    return f"{family}.{member}"


def member_of(name: str, family: str) -> str | None:
    """What check `name` of `family` is of: member_of('drift.matmul.bf16_tflops', DRIFT) is
    'matmul.bf16_tflops'; None for a name of another family, or the family's own name alone."""
    found, dot, member = name.partition(".")
    return member if found == family and dot and member else None


def family_of(name: str) -> str:
    """A check's family: its name up to the first '.' ('ecc' for 'ecc.uncorrected', 'drift' for every
    drift check), the whole name where it has none ('drift', 'processes')."""
    return name.partition(".")[0]

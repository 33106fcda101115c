"""Outliers among values that should agree, by a robust rule: the values far on the bad side of their median.

The median and the median absolute deviation (MAD) of a group hardly move when a few of its values are
wild, where a mean and a standard deviation are dragged towards them. Iglewicz and Hoaglin's modified
z-score (B. Iglewicz, D. Hoaglin, "How to Detect and Handle Outliers", ASQC 1993; NIST/SEMATECH e-Handbook
of Statistical Methods, section 1.3.5.17) measures a value's distance from the median in MADs:

    M = 0.6745 (x - median) / MAD,   an outlier where |M| > 3.5

0.6745 is the standard normal's 0.75 quantile: for normally spread values MAD / 0.6745 estimates the
standard deviation, so M reads like an ordinary z-score. Here a value is left out only when it also lies
on the bad side of the median (below it where higher is better, above it where lower is) and at least
LEAST_GAP of the median away: values that agree to a fraction of a percent have a tiny MAD, and their
noise alone would score far past 3.5. When the MAD is 0 (more than half the values equal), the gap alone
decides. Fewer than LEAST_VALUES values are not judged at all.

Fewer than half the values can ever be left out: more than half of them lie within two MADs of the
median (by the MAD's definition), and a value left out lies more than 3.5 / 0.6745 = 5.2 MADs from it
(or, MAD 0, more than half equal the median and a value left out differs from it). The median is the
anchor; where half the values are bad there is none, and nothing is left out. `gpuval profiles derive`
uses this rule (docs/thresholds.md).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

MAD_SCALE = 0.6745  # the standard normal's 0.75 quantile: MAD / 0.6745 estimates sd for normal values
Z_LIMIT = 3.5  # Iglewicz and Hoaglin's cut for the modified z-score
# Healthy lent H200s read host-to-device copies up to 11.5 % below their group's median in the committed
# runs (a noisy host-side metric, docs/thresholds.md): 20 % leaves such a machine in, a GPU at half speed out.
LEAST_GAP = 0.20
LEAST_VALUES = 4  # with three, one disagreeing value has only two to be judged against


@dataclass(frozen=True)
class Outlier:
    index: int  # its place in the values judged
    value: float
    gap: float  # |value - median| / |median|; infinite where the median is 0
    z: float | None  # the modified z-score's size on the bad side; None where the MAD is 0

    def why(self, z_limit: float = Z_LIMIT) -> str:
        side = f"{self.gap:.0%} from the median" if math.isfinite(self.gap) else "the median is 0"
        if self.z is None:
            return f"{side}, MAD 0 (the gap alone decides)"
        return f"{side}, modified z {self.z:.3g} > {z_limit:g}"


@dataclass(frozen=True)
class Judgement:
    median: float
    mad: float
    outliers: tuple[Outlier, ...]
    judged: bool  # False: fewer than least_values values, none judged


def modified_z(value: float, median: float, mad: float) -> float:
    """Iglewicz and Hoaglin's modified z-score of `value` (mad > 0)."""
    return MAD_SCALE * (value - median) / mad


def judge(
    values: list[float],
    direction: int,
    z_limit: float = Z_LIMIT,
    least_gap: float = LEAST_GAP,
    least_values: int = LEAST_VALUES,
) -> Judgement:
    """The values to leave out: on the bad side of the median (direction +1: higher is better, below it;
    -1: above it), past `z_limit` in modified z where the MAD is not 0, and at least `least_gap` of the
    median away."""
    if not values:
        return Judgement(math.nan, math.nan, (), False)
    median = statistics.median(values)
    mad = statistics.median(abs(value - median) for value in values)
    if len(values) < least_values:
        return Judgement(median, mad, (), False)
    found = []
    for index, value in enumerate(values):
        distance = (median - value) * direction  # > 0 on the bad side
        if distance <= 0:
            continue
        gap = distance / abs(median) if median else math.inf
        z = abs(modified_z(value, median, mad)) if mad else None
        if gap >= least_gap and (z is None or z > z_limit):
            found.append(Outlier(index, value, gap, z))
    return Judgement(median, mad, tuple(found), True)

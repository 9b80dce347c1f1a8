"""Paired ratios, their spread, and goals: how the benchmarks judge a ratio.

    Ratio(median, spread, pairs)      a summary of paired ratios
    Goal(label, bound, at_least)      a ratio's bound: ``.holds(value)``, ``.text`` (">= 0.98")
    paired(numerators, denominators)  median of the per-pair ratios, its spread, the pair count
    spread(values)                    relative half-width of a 95% confidence interval of the median

A pair is two measurements taken one right after the other (one request on each engine, or one
batch), so slow drift of the machine cancels in their ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from kvtier.apps.bench.common.timing import median

CONFIDENCE_Z = 1.96  # 95%


class Ratio(NamedTuple):
    median: float  # median of the per-pair ratios
    spread: float  # relative half-width of a 95% confidence interval of that median
    pairs: int


@dataclass(frozen=True)
class Goal:
    label: str
    bound: float
    at_least: bool = False  # the ratio must be >= bound (else <=)

    def holds(self, value: float) -> bool:
        return value >= self.bound if self.at_least else value <= self.bound

    @property
    def text(self) -> str:
        return f"{'>=' if self.at_least else '<='} {self.bound:g}"


def paired(numerators: list[float], denominators: list[float]) -> Ratio:
    """The ratios ``numerators[i] / denominators[i]``, summarised. Needs one pair or more."""
    ratios = [n / d for n, d in zip(numerators, denominators, strict=True)]
    return Ratio(median(ratios), spread(ratios), len(ratios))


def spread(values: list[float]) -> float:
    """Half the width of a distribution-free 95% confidence interval of the median of
    ``values``, over that median: the interval between the order statistics of ranks
    ``n/2 -+ 1.96 sqrt(n)/2`` (normal approximation of the binomial; the whole range when
    ``n`` is small). It shrinks as 1/sqrt(n) with more pairs."""
    ordered = sorted(values)
    n = len(ordered)
    half = CONFIDENCE_Z * math.sqrt(n) / 2
    low = max(1, math.floor(n / 2 - half))  # 1-based ranks
    high = min(n, math.ceil(1 + n / 2 + half))
    return (ordered[high - 1] - ordered[low - 1]) / 2 / abs(median(ordered))

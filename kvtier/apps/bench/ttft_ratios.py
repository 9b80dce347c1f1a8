"""``kvtier bench ttft``'s ratios: paired ratios, their spread, and the no-regret goals.

    paired(numerators, denominators)  median of the per-pair ratios, its spread, the pair count
    spread(values)                    relative half-width of a 95% confidence interval of the median
    GOALS                             each no-regret ratio's bound, by key
    verdict(key, ratio, tokens)       one no-regret row: the ratio against its goal, PASS or FAIL

A pair is two measurements taken one right after the other (one request on each engine, or one
batch), so slow drift of the machine cancels in their ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from kvtier.apps.bench.report import median

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


GOALS = {
    "engine_hit_on_over_off": Goal("engine's own hit, kvtier on / off", 1.1),
    "kvtier_over_engine_hit": Goal("kvtier hit / engine's own hit", 1.0),
    "throughput_ratio": Goal("0%-hit throughput, kvtier / none", 0.98, at_least=True),
}
INFO = {  # ratios reported beside the goals, without one
    "kvtier_miss_over_recompute": "never-seen prompt TTFT, kvtier on / off",
    "kvtier_over_example": "kvtier hit / ExampleConnector hit",
}


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


def verdict(key: str, ratio: Ratio, prompt_tokens: int | None) -> dict[str, Any]:
    """A no-regret row: ``key`` (one of ``GOALS``) at ``prompt_tokens`` (None: not per length)."""
    goal = GOALS[key]
    return {
        "key": key, "label": goal.label, "prompt_tokens": prompt_tokens,
        "ratio": round(ratio.median, 3), "spread": round(ratio.spread, 3), "pairs": ratio.pairs,
        "goal": goal.text, "pass": goal.holds(round(ratio.median, 3)),  # as written: consistent
    }  # fmt: skip

"""``kvtier bench ttft``'s no-regret goals, and a ratio judged against its goal.

    GOALS                        each no-regret ratio's bound, by key
    INFO                         the ratios reported beside them, without a goal
    verdict(key, ratio, tokens)  one no-regret row: the ratio against its goal, PASS or FAIL

The ratios themselves are paired (``common.ratios``).
"""

from __future__ import annotations

from typing import Any

from kvtier.apps.bench.common.ratios import Goal, Ratio

GOALS = {
    "engine_hit_on_over_off": Goal("engine's own hit, kvtier on / off", 1.1),
    "kvtier_over_engine_hit": Goal("kvtier hit / engine's own hit", 1.0),
    "throughput_ratio": Goal("0%-hit throughput, kvtier / none", 0.98, at_least=True),
}
INFO = {  # ratios reported beside the goals, without one
    "kvtier_miss_over_recompute": "never-seen prompt TTFT, kvtier on / off",
    "kvtier_over_example": "kvtier hit / ExampleConnector hit",
}


def verdict(key: str, ratio: Ratio, prompt_tokens: int | None) -> dict[str, Any]:
    """A no-regret row: ``key`` (one of ``GOALS``) at ``prompt_tokens`` (None: not per length)."""
    goal = GOALS[key]
    return {
        "key": key, "label": goal.label, "prompt_tokens": prompt_tokens,
        "ratio": round(ratio.median, 3), "spread": round(ratio.spread, 3), "pairs": ratio.pairs,
        "goal": goal.text, "pass": goal.holds(round(ratio.median, 3)),  # as written: consistent
    }  # fmt: skip

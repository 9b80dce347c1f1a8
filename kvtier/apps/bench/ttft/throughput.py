"""``kvtier bench ttft``, throughput: prompts never seen, served with kvtier / without (0% hit).

The ``baseline`` and ``kvtier`` engines, alive together (``process``). Each pair: fresh
prompts, never seen by either engine (the same prompts for both), served as one batch by each
engine, the order alternating (A/B, then B/A); the kvtier batch counts until its stores drained.
The ratio of a pair is kvtier's tokens/s over the baseline's. At least ``Workload.pairs`` pairs,
then more, up to ``max_pairs``, while the spread of the median ratio (``common.ratios.spread``) is
above ``spread_goal``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tqdm import tqdm

from kvtier.apps.bench.common.ratios import Ratio, paired
from kvtier.apps.bench.common.timing import median
from kvtier.apps.bench.ttft.process import EngineProcess
from kvtier.apps.bench.ttft.setup import Setup
from kvtier.apps.bench.ttft.timing import Served
from kvtier.apps.prompts import make_prompt

CONFIGS = ("baseline", "kvtier")


def measure_throughput(
    engines: Mapping[str, EngineProcess], setup: Setup, progress: tqdm[Any]
) -> tuple[Ratio, dict[str, Any]]:
    """The paired ratio and its record for the JSON; ``progress`` advances by the prompt tokens
    both engines served (its total grows when more pairs are needed)."""
    work = setup.workload
    tokens_out = work.prompts * (work.tokens + work.max_tokens)
    rates: dict[str, list[float]] = {config: [] for config in CONFIGS}
    drains: list[float] = []
    warmup = [make_prompt(setup.model, work.tokens // 4, seed=11 + i) for i in range(2)]
    for config in CONFIGS:  # first-call costs of a batch, discarded
        engines[config].serve(warmup, 2)
    ratio = Ratio(0.0, float("inf"), 0)
    while ratio.pairs < work.pairs or (
        ratio.spread > work.spread_goal and ratio.pairs < work.max_pairs
    ):
        if ratio.pairs >= work.pairs:
            progress.total += work.tokens_per_pair
        prompts = [
            make_prompt(setup.model, work.tokens, seed=1_000_003 + ratio.pairs * 1000 + i)
            for i in range(work.prompts)
        ]
        order = CONFIGS if ratio.pairs % 2 == 0 else CONFIGS[::-1]
        for config in order:
            served: Served = engines[config].serve(prompts, work.max_tokens)
            rates[config].append(tokens_out / served.seconds)
            drains += [served.drain_seconds] if config == "kvtier" else []
            progress.update(work.tokens_per_pair // 2)
        ratio = paired(rates["kvtier"], rates["baseline"])
        progress.set_postfix(pairs=ratio.pairs, ratio=f"{ratio.median:.3f}±{ratio.spread:.1%}")
    record = {
        "prompts": work.prompts, "prompt_tokens": work.tokens, "max_tokens": work.max_tokens,
        "pairs": ratio.pairs, "min_pairs": work.pairs, "max_pairs": work.max_pairs,
        "order": "A/B, B/A alternating; both engines alive, fresh prompts each pair",
        "baseline_tokens_per_s": round(median(rates["baseline"]), 1),
        "kvtier_tokens_per_s": round(median(rates["kvtier"]), 1),
        "ratio": round(ratio.median, 4), "spread": round(ratio.spread, 4),
        "spread_goal": work.spread_goal, "precise": ratio.spread <= work.spread_goal,
        "ratios": [round(k / b, 4) for k, b in zip(rates["kvtier"], rates["baseline"])],
        "kvtier_drain_s": round(median(drains), 4),
    }  # fmt: skip
    return ratio, record

"""``kvtier bench redis``, TTFT part: a prompt served from Redis by another engine, in vLLM.

One in-process engine at a time (``ttft.engine.on_engine``); one ``max_tokens=1`` request at a
time; a fresh prompt of ``tokens`` tokens per repetition; the TTFT driver on a Redis tier
(``ttft.tier.redis_tier``, keys under a fresh prefix):

    recompute     no connector, the prompt never seen
    kvtier_host   engine A (kvtier with a Redis tier) serves the prompt, settles (its chunks
                  reach Redis), empties vLLM's own prefix cache, and serves it again: from host
                  memory (checked in kvtier's host-tier counters)
    kvtier_redis  engine B (an empty host tier, the same Redis: another engine of the fleet)
                  serves each prompt engine A stored; kvtier's Redis counters must show >= 90%
                  of the prompt's chunks loaded from Redis, else the run raises

Each engine first serves a warm-up prompt (first-call costs, discarded). Goal: kvtier redis
<= 0.1 x recompute.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from kvtier.apps.bench.common.timing import median
from kvtier.apps.bench.ttft.driver import Engines, Passes, recompute, run_phases, tier_engines
from kvtier.apps.bench.ttft.results import TTFTResults
from kvtier.apps.bench.ttft.setup import Setup
from kvtier.apps.bench.ttft.tier import redis_tier
from kvtier.apps.models import model_path
from kvtier.apps.prompts import make_prompt

WARMUP_TOKENS = 512
MEASURES = ("recompute", "kvtier_host", "kvtier_redis")
GOAL = 0.1  # kvtier redis / recompute


class TTFTOptions(NamedTuple):
    tokens: int = 4096
    repeats: int = 3
    model: str | Path = "bench"  # a local model's name or directory
    dtype: str = "bfloat16"


def measure(url: str, tokens: int, repeats: int, model: str | Path, dtype: str) -> dict[str, Any]:
    """TTFT per configuration against the Redis at ``url`` (keys under a fresh prefix).
    ``RuntimeError`` when a hit did not come from Redis."""
    model_dir = model if isinstance(model, Path) else model_path(model)
    setup = Setup(model_dir, dtype, (tokens,), repeats)
    tier = redis_tier(url, f"bench-{os.getpid()}-{tokens}")
    prompts = [
        make_prompt(model_dir, tokens, seed=rep * 100_019 + tokens) for rep in range(repeats)
    ]
    warmup = make_prompt(model_dir, min(tokens, WARMUP_TOKENS), seed=11)
    results = TTFTResults()
    passes = Passes("kvtier_redis", host="kvtier_host")
    phases: dict[str, Engines] = {
        "recompute": [(None, recompute(warmup, prompts, results))],
        "kvtier_redis": tier_engines(tier, warmup, prompts, results, passes),
    }
    run_phases(setup, phases, results, "bench redis: TTFT")
    return _summary(setup, tier.chunk_tokens or 1, results)


def _summary(setup: Setup, chunk_tokens: int, results: TTFTResults) -> dict[str, Any]:
    tokens = setup.lengths[0]
    s = {m: results.median_s(m, tokens) for m in MEASURES}
    ratio = s["kvtier_redis"] / s["recompute"]
    checks = [c.as_json() for c in results.check_list("kvtier_redis")]
    taken = list(dict.fromkeys(m for m, _ in results.samples))
    return {
        "model": setup.model.name, "dtype": setup.dtype, "prompt_tokens": tokens,
        "repeats": setup.repeats, "chunk_tokens": chunk_tokens,
        **{f"{m}_s": round(v, 4) for m, v in s.items()},
        "kvtier_redis_over_recompute": round(ratio, 3),
        "kvtier_redis_over_host": round(s["kvtier_redis"] / s["kvtier_host"], 3),
        "kvtier_host_over_recompute": round(s["kvtier_host"] / s["recompute"], 3),
        "goal_redis_over_recompute": GOAL,
        "goal_met": round(ratio, 3) <= GOAL,
        "redis_load_s": median([check["load_s"] for check in checks]),
        "checks": checks,
        "samples_s": {m: [round(v, 4) for v in results.seconds(m, tokens)] for m in taken},
        "other_load_cores": results.other_load,
    }  # fmt: skip

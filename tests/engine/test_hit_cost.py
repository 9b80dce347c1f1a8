"""A hit that would cost more than computing it is computed instead, in real vLLM (CPU).

The outside memory tier (``memory_tier.py``, plugged by its import path) holds the prompts'
chunks; the host tier is reset, so each prompt's prefix is in that tier only. Slowed by a read
delay, the tier is loaded three times (not measured yet: kvtier is optimistic, and no single
load decides), measured slower than the engine's prefill, and from then on the engine computes
those prompts: their time to first token is the engine's own for a new prompt of the same
length. Unslowed, every hit is still loaded.

Times to first token are taken one request at a time (a one-token ``generate`` on an engine with
nothing else to do), each tier prompt paired with a new prompt of the same length, the pair's
order alternating. The machine is shared and noisy (other engines on the same two cores make a
prefill 1x to 30x slower from one request to the next), so pairs are taken until the median of
their ratios is known to within +-3% (a distribution-free 95% interval of the median), at most
MAX_PAIRS or BUDGET_S: how many depends on the noise, never on the answer.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

import memory_tier
import pytest
from harness import connector, engine, generate, greedy, kvtier_transfer, prompts, settle

import kvtier
from kvtier.scheduler.costs.fit import WINDOW
from kvtier.scheduler.costs.model import PROBE_AFTER_S

CHUNK = 64  # tokens per chunk: two engine blocks of 32
LENGTH = 1024  # tokens per prompt: 16 chunks, about 10 ms of prefill on an idle core
CHUNKS = LENGTH // CHUNK
READ_DELAY_S = 0.03  # per chunk read: 0.48 s a prompt, slower than its prefill on a busy machine
# the median's bound. Alone here, with or without a CPU hog beside it, the median is 1.00-1.01;
# beside another test worker's engines it ranged 0.96-1.09 with no change to the code (their
# bursts are not the independent noise the interval assumes). A tier still loaded costs 20x;
# a hit that waits a step for nothing, 1.3x or more
RATIO_BOUND = 1.10
MIN_PAIRS, MAX_PAIRS = 21, 81
PRECISION = 1.06  # the median's 95% interval spans at most this ratio: +-3%
BUDGET_S = 90.0


def _extra(read_delay_s: float) -> dict[str, Any]:
    memory = {"max_chunks": 8192, "read_delay_s": read_delay_s}
    # a connector reset empties host memory only: the hits are the tier's
    keeps = {"reset_keeps_tiers": True}
    return {"block_size": CHUNK, "tiers": ["memory_tier:SPEC"], "memory": memory, **keeps}


def _ttft(llm: Any, prompt: list[int]) -> float:
    """Seconds from asking to the first token of ``prompt`` alone (its only token), on an
    engine with nothing left to do (the writes of the request before it done)."""
    settle(llm)
    started = time.perf_counter()
    llm.generate([{"prompt_token_ids": prompt}], greedy(1), use_tqdm=False)
    return time.perf_counter() - started


def _prepared(llm: Any, model: Path, held: list[list[int]]) -> None:
    """The engine's steps are measured (prompts computed, then decoded a few tokens), and the
    tier holds ``held`` while neither host memory nor the engine's own cache does."""
    for prompt in prompts(model, [LENGTH] * 3, seed=71):
        generate(llm, [prompt], greedy(4))
    generate(llm, held, greedy(1))
    settle(llm)
    assert llm.reset_prefix_cache(reset_connector=True)
    scheduler = connector(llm).scheduler
    assert len(scheduler.tier("memory").ready) >= len(held) * CHUNKS  # type: ignore[attr-defined]
    costs = scheduler.costs
    assert costs is not None and costs.view() is not None, "the engine's steps were not measured"


def _median_interval(ratios: list[float]) -> tuple[float, float]:
    """A distribution-free 95% interval of the median of ``ratios`` (order statistics)."""
    ordered, n = sorted(ratios), len(ratios)
    k = max(0, math.floor((n - 1.96 * math.sqrt(n)) / 2))
    return ordered[k], ordered[n - 1 - k]


def test_a_tier_slower_than_the_prefill_is_computed_in_the_prefills_time(
    tiny_model: Path,
) -> None:
    held = prompts(tiny_model, [LENGTH] * (MAX_PAIRS + WINDOW), seed=72)
    fresh = prompts(tiny_model, [LENGTH] * MAX_PAIRS, seed=73)
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(**_extra(READ_DELAY_S))) as llm:
        _prepared(llm, tiny_model, held)
        memory = kvtier.stats(llm).tiers["memory"]
        probe = max(_ttft(llm, p) for p in held[:WINDOW])  # not measured yet: loaded
        assert memory.loaded_chunks == WINDOW * CHUNKS, memory
        ratios, tier_s, fresh_s = [], [], []
        started = time.monotonic()
        for i, (tier_prompt, new_prompt) in enumerate(zip(held[WINDOW:], fresh)):
            if i % 2:
                fresh_s.append(_ttft(llm, new_prompt))
                tier_s.append(_ttft(llm, tier_prompt))
            else:
                tier_s.append(_ttft(llm, tier_prompt))
                fresh_s.append(_ttft(llm, new_prompt))
            ratios.append(tier_s[-1] / fresh_s[-1])
            low, high = _median_interval(ratios)
            precise = len(ratios) >= MIN_PAIRS and high / low <= PRECISION
            if precise or time.monotonic() - started > BUDGET_S:
                break
        elapsed = time.monotonic() - started
        settle(llm)
        median, tier_ms, new_ms = (statistics.median(x) for x in (ratios, tier_s, fresh_s))
        figures = (
            f"{len(ratios)} pairs in {elapsed:.0f} s: ratio min {min(ratios):.3f} median "
            f"{median:.3f} (95% {low:.3f}-{high:.3f}) max {max(ratios):.3f}; ttft ms median: "
            f"tier {tier_ms * 1e3:.1f}, new {new_ms * 1e3:.1f}, loads until measured up to "
            f"{probe * 1e3:.1f}; "
            f"{memory}"
        )
        print(figures)
        # a tier judged too slow is loaded again now and then (a probe): at most once an interval
        probes = 1 + math.ceil(elapsed / PROBE_AFTER_S)
        assert memory.loaded_chunks <= (WINDOW + probes) * CHUNKS, figures
        assert memory.declined_chunks >= (len(ratios) - probes) * CHUNKS, figures
        assert median <= RATIO_BOUND, figures
        connector(llm).scheduler.check_integrity()


def test_an_unslowed_tier_still_serves_every_hit(tiny_model: Path, reference: Any) -> None:
    held = prompts(tiny_model, [LENGTH] * 6, seed=74)
    expected = reference(tiny_model, held, 1)
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(**_extra(0.0))) as llm:
        _prepared(llm, tiny_model, held)
        outputs = [generate(llm, [prompt], greedy(1))[0] for prompt in held]  # one by one
        assert outputs == expected
        settle(llm)
        memory = kvtier.stats(llm).tiers["memory"]
        assert memory.hit_chunks == memory.loaded_chunks == len(held) * CHUNKS, memory
        assert memory.declined_chunks == 0, memory
        connector(llm).scheduler.check_integrity()


@pytest.fixture(autouse=True)
def _empty_memory_tier() -> Any:
    memory_tier.STORE.clear()
    yield
    memory_tier.STORE.clear()

"""``kvtier bench redis``, TTFT part: a prompt served from Redis by another engine, in vLLM.

One in-process engine at a time (``ttft_engine.on_engine``); one ``max_tokens=1`` request at a
time, timed around ``LLM.generate``; a fresh prompt of ``tokens`` tokens per repetition:

    recompute     no connector, the prompt never seen
    kvtier host   engine A (kvtier with a Redis tier) serves the prompt, drains (its chunks reach
                  Redis), empties vLLM's own prefix cache, and serves it again: from host memory
    kvtier redis  engine B (an empty host tier, the same Redis: another engine of the fleet)
                  serves each prompt engine A stored; kvtier's Redis counters must show >= 90%
                  of the prompt's chunks loaded from Redis, else the run raises

Each engine first serves a warm-up prompt (first-call costs, discarded). Goal: kvtier redis
<= 0.1 x recompute.
"""

from __future__ import annotations

import copy
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

import kvtier
from kvtier.apps.bench.report import median
from kvtier.apps.bench.ttft_engine import on_engine
from kvtier.apps.bench.ttft_setup import CHUNK_TOKENS, HIT_FRACTION, Setup, Workload, set_engine_env
from kvtier.apps.bench.ttft_timing import timed
from kvtier.apps.models import model_path
from kvtier.apps.prompts import make_prompt

if TYPE_CHECKING:
    from vllm import LLM

HOST_BYTES = "1GiB"
WARMUP_TOKENS = 512
MEASURES = ("recompute", "kvtier_host", "kvtier_redis")
GOAL = 0.1  # kvtier redis / recompute


@dataclass(frozen=True)
class _RedisSetup(Setup):
    url: str = field(kw_only=True)
    prefix: str = field(kw_only=True)

    def transfer(self, config: str) -> dict[str, Any] | None:
        if config != "kvtier_redis":
            return super().transfer(config)
        redis = {"url": self.url, "prefix": self.prefix}
        extra = {"cpu_bytes_to_use": HOST_BYTES, "block_size": CHUNK_TOKENS, "redis": redis}
        return {"kv_connector": "KVTierConnector", "kv_connector_module_path": "kvtier.vllm",
                "kv_role": "kv_both", "kv_connector_extra_config": extra}  # fmt: skip


@dataclass
class _Results:
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    checks: list[dict[str, Any]] = field(default_factory=list)

    def record(self, measure: str, llm: LLM, prompt: list[int]) -> None:
        self.seconds[measure].append(timed(llm, prompt).seconds)


def measure(
    work: Path, url: str, tokens: int, repeats: int, model: str | Path, dtype: str
) -> dict[str, Any]:
    """TTFT per configuration against the Redis at ``url`` (keys under a fresh prefix).

    Sets the engine environment (in-process engines) for the whole process. Raises
    ``RuntimeError`` when a hit did not come from Redis.
    """
    set_engine_env()
    model_dir = model if isinstance(model, Path) else model_path(model)
    setup = _RedisSetup(model_dir, dtype, (tokens,), repeats, Workload(), work / "example",
                        url=url, prefix=f"bench-{os.getpid()}-{tokens}")  # fmt: skip
    prompts = [
        make_prompt(model_dir, tokens, seed=rep * 100_019 + tokens) for rep in range(repeats)
    ]
    warmup = make_prompt(model_dir, min(tokens, WARMUP_TOKENS), seed=11)
    results = _Results()
    engines = [
        ("baseline", lambda llm: _recompute(warmup, prompts, results, llm)),
        ("kvtier_redis", lambda llm: _store_and_host(warmup, prompts, results, llm)),
        ("kvtier_redis", lambda llm: _from_redis(warmup, prompts, results, llm)),
    ]
    for config, body in tqdm(engines, desc="bench redis: TTFT", unit="engine"):
        on_engine(setup, config, body)
    return _summary(setup, results)


def _recompute(warmup: list[int], prompts: list[list[int]], results: _Results, llm: LLM) -> None:
    timed(llm, warmup)
    for prompt in prompts:
        results.record("recompute", llm, prompt)


def _store_and_host(
    warmup: list[int], prompts: list[list[int]], results: _Results, llm: LLM
) -> None:
    from kvtier.vllm import settle

    timed(llm, warmup)
    settle(llm)
    for prompt in prompts:
        timed(llm, prompt)
        settle(llm)  # its chunks are in the host tier and in Redis
        llm.reset_prefix_cache()  # vLLM's own cache: the next request is kvtier's hit
        results.record("kvtier_host", llm, prompt)
        settle(llm)
    stored = kvtier.stats(llm).tiers["redis"].stored_chunks
    wanted = sum(len(p) // CHUNK_TOKENS for p in [warmup, *prompts])
    if stored < wanted:
        raise RuntimeError(f"kvtier bench redis: engine A wrote {stored} of {wanted} chunks")


def _from_redis(warmup: list[int], prompts: list[list[int]], results: _Results, llm: LLM) -> None:
    from kvtier.vllm import settle

    timed(llm, warmup)
    settle(llm)
    for prompt in prompts:
        before = copy.deepcopy(kvtier.stats(llm))  # the engine's counters change in place
        results.record("kvtier_redis", llm, prompt)
        settle(llm)
        after = kvtier.stats(llm)
        redis, was = after.tiers["redis"], before.tiers["redis"]
        check = {
            "full_chunks": len(prompt) // CHUNK_TOKENS,
            "redis_loaded_chunks": redis.loaded_chunks - was.loaded_chunks,
            "cpu_hit_chunks": after.cpu.hit_chunks - before.cpu.hit_chunks,
            "bad_chunks": redis.bad_chunks - was.bad_chunks,
            "failed_loads": redis.failed_loads - was.failed_loads,
            "load_s": round(redis.load_seconds - was.load_seconds, 4),
        }
        results.checks.append(check)
        wanted = HIT_FRACTION * check["full_chunks"]
        if check["redis_loaded_chunks"] < wanted or check["bad_chunks"] or check["failed_loads"]:
            raise RuntimeError(f"kvtier bench redis: invalid run, not a hit from Redis: {check}")


def _summary(setup: _RedisSetup, results: _Results) -> dict[str, Any]:
    s = {m: median(results.seconds[m]) for m in MEASURES}
    ratio = s["kvtier_redis"] / s["recompute"]
    return {
        "model": setup.model.name, "dtype": setup.dtype, "prompt_tokens": setup.lengths[0],
        "repeats": setup.repeats, "chunk_tokens": CHUNK_TOKENS,
        **{f"{m}_s": round(v, 4) for m, v in s.items()},
        "kvtier_redis_over_recompute": round(ratio, 3),
        "kvtier_redis_over_host": round(s["kvtier_redis"] / s["kvtier_host"], 3),
        "kvtier_host_over_recompute": round(s["kvtier_host"] / s["recompute"], 3),
        "goal_redis_over_recompute": GOAL,
        "goal_met": round(ratio, 3) <= GOAL,
        "redis_load_s": median([check["load_s"] for check in results.checks]),
        "checks": results.checks,
        "samples_s": {m: [round(v, 4) for v in values] for m, values in results.seconds.items()},
    }  # fmt: skip

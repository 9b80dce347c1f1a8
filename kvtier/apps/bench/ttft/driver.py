"""The TTFT driver: prompts stored into a tier by one pass and served from it by the next, every
request that should come from the tier checked in kvtier's counters.

    Engine                                  what the driver asks of an engine (``EngineHost`` in
                                            this process, ``EngineProcess`` in a child)
    store(engine, prompt, results, measure)         one timed request of a prompt never seen
    observe(engine, tier, prompt, settle)           one timed request and what the tier did
    load(engine, tier, prompt, results, measure, least)   what ``tier`` does between the passes,
                                            then one timed request that must come from it
                                            (``RuntimeError`` if not); recorded with its check
    recompute(warmup, prompts, results)             an engine's body: each prompt computed
    tier_engines(tier, warmup, prompts, results, passes)  the engines that store and load,
                                            as (``kv_transfer_config``, body) for ``on_engine``
    run_phases(setup, phases, results, desc)        each phase's engines in turn, one alive at
                                            a time; the other load of each phase recorded

Every engine first serves a warm-up prompt (first-call costs, not recorded). The tier decides
what happens between the passes (``tier.TierTTFT``): the same engine, settled and its own
prefix cache emptied (the host tier), or a fresh engine with an empty host tier (disk, Redis),
and, for a tier of files, their page cache dropped right before each load.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from tqdm import tqdm

from kvtier.apps.bench.common.timing import OtherLoad
from kvtier.apps.bench.ttft.engine import on_engine
from kvtier.apps.bench.ttft.results import TierCheck, TTFTResults
from kvtier.apps.bench.ttft.setup import HIT_FRACTION, Setup, loadable_chunks
from kvtier.apps.bench.ttft.tier import TierTTFT
from kvtier.apps.bench.ttft.timing import Sample

if TYPE_CHECKING:
    from kvtier.counters import KVTierStats


class Engine(Protocol):
    def ttft(self, prompt: list[int]) -> Sample: ...
    def settle(self) -> None: ...
    def reset_prefix_cache(self) -> None: ...
    def kvtier_stats(self) -> KVTierStats: ...


Body = Callable[[Any], object]  # what runs on one engine (an ``EngineHost``)
Engines = list[tuple[dict[str, Any] | None, Body]]  # (kv_transfer_config, body), in order


class Passes(NamedTuple):
    """The measures a tier's passes record: the storing request, the request served from the
    tier, and (optional) the same prompt served again from the storing engine's host tier."""

    load: str
    first: str = "kvtier_first"
    host: str | None = None


def store(engine: Engine, prompt: list[int], results: TTFTResults, measure: str) -> Sample:
    """One timed request of a prompt the engine never saw (kvtier misses, then stores it)."""
    return results.record(measure, len(prompt), engine.ttft(prompt))


def observe(
    engine: Engine,
    tier: TierTTFT,
    prompt: list[int],
    settle: bool = True,
    resident: float | None = None,
) -> tuple[Sample, TierCheck]:
    """One timed request, and what ``tier``'s counters rose by (after the transfers it started
    finished, with ``settle``)."""
    chunk = tier.chunk_tokens or 1
    before = engine.kvtier_stats()
    sample = engine.ttft(prompt)
    if settle:
        engine.settle()
    check = TierCheck.of(tier.name, len(prompt) // chunk, before, engine.kvtier_stats(), sample,
                         resident)  # fmt: skip
    return sample, check


def load(
    engine: Engine,
    tier: TierTTFT,
    prompt: list[int],
    results: TTFTResults,
    measure: str,
    least: float,
) -> TierCheck:
    """``prompt`` served from ``tier``: at least ``least`` chunks found and loaded there."""
    if not tier.fresh_engine:
        engine.settle()
        engine.reset_prefix_cache()  # vLLM's own cache: the request can only come from kvtier
    sample, check = observe(engine, tier, prompt, resident=tier.before_load())
    if not check.served(least, tier.chunk_tokens or 1):
        raise RuntimeError(
            f"kvtier bench: invalid run, a {len(prompt)}-token prompt was not served from the "
            f"{tier.name} tier (wanted {least:g} chunks): {check.as_json()}, "
            f"{check.cached_tokens} tokens not computed"
        )
    results.record(measure, len(prompt), sample)
    results.checks[measure, len(prompt)].append(check)
    return check


def least_of(prompt: list[int], tier: TierTTFT, whole: bool = True) -> float:
    """The chunks a hit of ``prompt`` must load: ``HIT_FRACTION`` of its whole chunks, or (not
    ``whole``) of those before its last token (``setup.loadable_chunks``)."""
    chunk = tier.chunk_tokens or 1
    return HIT_FRACTION * (len(prompt) // chunk if whole else loadable_chunks(len(prompt), chunk))


def recompute(
    warmup: list[int], prompts: list[list[int]], results: TTFTResults, measure: str = "recompute"
) -> Body:
    def body(engine: Engine) -> None:
        engine.ttft(warmup)
        for prompt in prompts:
            store(engine, prompt, results, measure)

    return body


def tier_engines(
    tier: TierTTFT,
    warmup: list[int],
    prompts: list[list[int]],
    results: TTFTResults,
    passes: Passes,
) -> Engines:
    def stores(engine: Engine) -> None:
        engine.ttft(warmup)
        engine.settle()
        for prompt in prompts:
            store(engine, prompt, results, passes.first)
            engine.settle()  # an idle engine: its chunks reach the tier
            if passes.host is not None:
                host = tier.host()
                load(engine, host, prompt, results, passes.host, least_of(prompt, host, False))
            elif not tier.fresh_engine:
                load(engine, tier, prompt, results, passes.load, least_of(prompt, tier, False))
        stored = engine.kvtier_stats().tiers[tier.name].stored_chunks
        wanted = sum(len(p) // (tier.chunk_tokens or 1) for p in [warmup, *prompts])
        if stored < wanted:
            raise RuntimeError(f"kvtier bench: the engine wrote {stored} of {wanted} chunks to "
                               f"the {tier.name} tier")  # fmt: skip

    def loads(engine: Engine) -> None:
        engine.ttft(warmup)
        engine.settle()
        for prompt in prompts:
            load(engine, tier, prompt, results, passes.load, least_of(prompt, tier))

    transfer = tier.transfer()
    return [(transfer, stores), (transfer, loads)] if tier.fresh_engine else [(transfer, stores)]


def run_phases(setup: Setup, phases: dict[str, Engines], results: TTFTResults, desc: str) -> None:
    total = sum(len(engines) for engines in phases.values())
    with tqdm(total=total, desc=desc, unit="engine") as progress:
        for phase, engines in phases.items():
            others = OtherLoad()
            for transfer, body in engines:
                on_engine(setup, transfer, body)
                progress.update()
            results.other_load[phase] = others.cores()

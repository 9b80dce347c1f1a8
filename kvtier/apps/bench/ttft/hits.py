"""``kvtier bench ttft``, hits: the TTFT of a prompt sent again, served by whom it should be.

Three engines alive together, one per process (``process.EngineProcess``): ``baseline`` (no
connector), ``kvtier`` and ``example`` (vLLM's ExampleConnector). Per repetition and prompt length
(repetition-major, so slow drift of the machine spreads over every length), one fresh prompt goes
to each engine in turn (baseline and kvtier alternating which goes first, then example); on each
engine one ``max_tokens=1`` request at a time:

    baseline  recompute      the prompt never seen: the ceiling
              engine_hit     the same prompt again, right after: the engine's own prefix-cache
                             hit with kvtier off, the floor
    kvtier    kvtier_miss    the prompt never seen, kvtier on (it looks up, misses, stores)
              engine_hit_on  the same prompt again, right after (stores may be in flight): the
                             engine's own hit with kvtier on
              kvtier_hit     settled, ``reset_prefix_cache()``, the prompt again: it can only come
                             from kvtier (``driver.load`` on the host tier)
    example   example_miss   the prompt never seen (ExampleConnector saves it to its files)
              example_hit    ``reset_prefix_cache()``, the prompt again: from its files
                             (only at ``example_lengths``)

Each request is checked, else ``RuntimeError``: a recompute or miss has no cached token; an own
hit has at least the engine's whole blocks before the last token cached; a kvtier hit shows, in
kvtier's counters, at least ``HIT_FRACTION`` of the prompt's loadable chunks found and loaded
from its host tier with no failed load, and the engine skipped computing those tokens
(``results.TierCheck``); an Example hit read the folder its miss wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kvtier.apps.bench.ttft.driver import least_of, load, observe, store
from kvtier.apps.bench.ttft.process import EngineProcess
from kvtier.apps.bench.ttft.results import TTFTResults
from kvtier.apps.bench.ttft.setup import ENGINE_BLOCK, Setup
from kvtier.apps.bench.ttft.tier import TierTTFT
from kvtier.apps.bench.ttft.timing import Sample
from kvtier.apps.prompts import make_prompt

MEASURES = (  # in the order they are taken
    "recompute", "engine_hit", "kvtier_miss", "engine_hit_on", "kvtier_hit",
    "example_miss", "example_hit",
)  # fmt: skip


def measure_hits(
    engines: Mapping[str, EngineProcess],
    setup: Setup,
    tier: TierTTFT,
    storage: Path,
    example_lengths: tuple[int, ...],
    progress: tqdm[Any],
) -> TTFTResults:
    """Run the sequence above on ``engines`` (``baseline``, ``kvtier`` with ``tier``, ``example``
    with its files in ``storage``) for every length of ``setup`` (the Example engine:
    ``example_lengths`` only); ``progress`` advances by the prompt's tokens once every engine
    served it. ``kvtier_hit``'s checks and ``engine_hit_on``'s (what kvtier loaded while the
    engine served its own hit: expected nothing) are kept in the results."""
    results = TTFTResults()
    warmup = make_prompt(setup.model, min(setup.lengths), seed=7)
    for engine in engines.values():  # first-call costs, discarded
        engine.ttft(warmup)
        engine.ttft(warmup)
        engine.settle()
        engine.reset_prefix_cache()
    for rep in range(setup.repeats):
        for index, length in enumerate(setup.lengths):
            prompt = make_prompt(setup.model, length, seed=rep * 100_003 + length)
            # who goes first alternates between repetitions of a length, and between lengths
            pair = ("baseline", "kvtier") if (rep + index) % 2 == 0 else ("kvtier", "baseline")
            for name in (*pair, "example"):
                if name == "baseline":
                    _baseline(engines[name], prompt, results)
                elif name == "kvtier":
                    _kvtier(engines[name], tier, prompt, results)
                elif length in example_lengths:
                    _example(engines[name], storage, prompt, results)
            progress.update(length)
    return results


def _baseline(engine: EngineProcess, prompt: list[int], results: TTFTResults) -> None:
    length = len(prompt)
    recompute, own = engine.ttft(prompt), engine.ttft(prompt)
    _check_cached("recompute", length, recompute, most=0)
    _check_cached("engine hit", length, own, least=_own_hit_tokens(length))
    results.record("recompute", length, recompute)
    results.record("engine_hit", length, own)


def _kvtier(engine: EngineProcess, tier: TierTTFT, prompt: list[int], results: TTFTResults) -> None:
    length = len(prompt)
    miss = store(engine, prompt, results, "kvtier_miss")
    own, own_check = observe(engine, tier, prompt, settle=False)
    load(engine, tier, prompt, results, "kvtier_hit", least_of(prompt, tier, whole=False))
    _check_cached("kvtier miss", length, miss, most=0)
    _check_cached("engine hit (kvtier on)", length, own, least=_own_hit_tokens(length))
    results.record("engine_hit_on", length, own)
    results.checks["engine_hit_on", length].append(own_check)


def _example(engine: EngineProcess, storage: Path, prompt: list[int], results: TTFTResults) -> None:
    length = len(prompt)
    saved = _folders(storage)
    miss = engine.ttft(prompt)
    if len(_folders(storage) - saved) != 1:  # one folder per prompt, holding every layer's file
        raise RuntimeError(f"kvtier bench ttft: ExampleConnector did not save {length} tokens")
    engine.reset_prefix_cache()
    hit = engine.ttft(prompt)
    _check_cached("Example miss", length, miss, most=0)
    _check_cached("Example hit", length, hit, least=1)
    results.record("example_miss", length, miss)
    results.record("example_hit", length, hit)


def _own_hit_tokens(length: int) -> int:
    """Tokens vLLM serves from its own cache for a prompt it holds: its whole blocks before the
    prompt's last token (it always computes the last token)."""
    return (length - 1) // ENGINE_BLOCK * ENGINE_BLOCK


def _check_cached(
    what: str, length: int, sample: Sample, least: int = 0, most: int | None = None
) -> None:
    """``RuntimeError`` unless the request had ``least`` to ``most`` tokens cached."""
    if sample.cached_tokens < least or (most is not None and sample.cached_tokens > most):
        raise RuntimeError(
            f"kvtier bench ttft: invalid run, a {length}-token {what} had "
            f"{sample.cached_tokens} cached tokens (expected at least {least}, at most {most})"
        )


def _folders(storage: Path) -> set[Path]:
    return {p for p in storage.iterdir() if p.is_dir()} if storage.exists() else set()

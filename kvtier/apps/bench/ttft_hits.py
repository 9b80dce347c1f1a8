"""``kvtier bench ttft``, hits: the TTFT of a prompt sent again, served by whom it should be.

Three engines alive together, one per process (``ttft_process``): ``baseline`` (no connector),
``kvtier`` and ``example`` (vLLM's ExampleConnector). Per repetition and prompt length
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
                             from kvtier
    example   example_miss   the prompt never seen (ExampleConnector saves it to its files)
              example_hit    ``reset_prefix_cache()``, the prompt again: from its files
                             (only at ``example_lengths``)

Each request is checked, else ``RuntimeError``: a recompute or miss has no cached token; an own
hit has at least the engine's whole blocks before the last token cached; a kvtier hit shows, in
kvtier's counters, at least ``HIT_FRACTION`` of the prompt's loadable chunks found and loaded
from its host tier with no failed load, and the engine skipped computing those tokens; an
Example hit read the folder its miss wrote.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kvtier.apps.bench.ttft_process import EngineProcess
from kvtier.apps.bench.ttft_setup import ENGINE_BLOCK, HIT_FRACTION, Setup, loadable_chunks
from kvtier.apps.bench.ttft_timing import Sample
from kvtier.apps.prompts import make_prompt
from kvtier.counters import TierStats

MEASURES = (  # in the order they are taken
    "recompute", "engine_hit", "kvtier_miss", "engine_hit_on", "kvtier_hit",
    "example_miss", "example_hit",
)  # fmt: skip


@dataclass
class HitSamples:
    """Everything measured, keyed by (measure, prompt length); lists in repetition order."""

    runs: dict[tuple[str, int], list[Sample]] = field(default_factory=lambda: defaultdict(list))
    kvtier_chunks: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    kvtier_load_s: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    # chunks kvtier loaded while the engine served its own hit (kvtier on); expected 0
    own_hit_kvtier_chunks: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))

    def seconds(self, measure: str, length: int) -> list[float]:
        return [s.seconds for s in self.runs[measure, length]]


def measure_hits(
    engines: Mapping[str, EngineProcess],
    setup: Setup,
    example_lengths: tuple[int, ...],
    progress: tqdm[Any],
) -> HitSamples:
    """Run the sequence above on ``engines`` (``baseline``, ``kvtier``, ``example``) for every
    length of ``setup`` (the Example engine: ``example_lengths`` only); ``progress`` advances
    by the prompt's tokens once every engine served it."""
    samples = HitSamples()
    warmup = make_prompt(setup.model, min(setup.lengths), seed=7)
    for engine in engines.values():  # first-call costs, discarded
        engine.call("ttft", warmup)
        engine.call("ttft", warmup)
        engine.call("settle")
        engine.call("reset_prefix_cache")
    for rep in range(setup.repeats):
        for index, length in enumerate(setup.lengths):
            prompt = make_prompt(setup.model, length, seed=rep * 100_003 + length)
            # who goes first alternates between repetitions of a length, and between lengths
            pair = ("baseline", "kvtier") if (rep + index) % 2 == 0 else ("kvtier", "baseline")
            for name in (*pair, "example"):
                if name == "baseline":
                    _baseline(engines[name], length, prompt, samples)
                elif name == "kvtier":
                    _kvtier(engines[name], length, prompt, samples, setup.chunk_tokens)
                elif length in example_lengths:
                    _example(engines[name], setup.storage, length, prompt, samples)
            progress.update(length)
    return samples


def _baseline(engine: EngineProcess, length: int, prompt: list[int], samples: HitSamples) -> None:
    recompute: Sample = engine.call("ttft", prompt)
    own: Sample = engine.call("ttft", prompt)
    _check_cached("recompute", length, recompute, most=0)
    _check_cached("engine hit", length, own, least=_own_hit_tokens(length))
    samples.runs["recompute", length].append(recompute)
    samples.runs["engine_hit", length].append(own)


def _kvtier(
    engine: EngineProcess, length: int, prompt: list[int], samples: HitSamples, chunk_tokens: int
) -> None:
    miss: Sample = engine.call("ttft", prompt)
    before_own = _host(engine)
    own: Sample = engine.call("ttft", prompt)
    own_chunks = _host(engine).loaded_chunks - before_own.loaded_chunks
    engine.call("settle")
    engine.call("reset_prefix_cache")
    before = _host(engine)
    hit: Sample = engine.call("ttft", prompt)
    engine.call("settle")
    after = _host(engine)
    _check_cached("kvtier miss", length, miss, most=0)
    _check_cached("engine hit (kvtier on)", length, own, least=_own_hit_tokens(length))
    found, loaded = after.hit_chunks - before.hit_chunks, after.loaded_chunks - before.loaded_chunks
    failed = after.failed_loads - before.failed_loads + after.bad_chunks - before.bad_chunks
    wanted = HIT_FRACTION * loadable_chunks(length, chunk_tokens)
    if min(found, loaded) < wanted or failed or hit.cached_tokens < wanted * chunk_tokens:
        raise RuntimeError(
            f"kvtier bench ttft: invalid run, a {length}-token prompt was not served from kvtier: "
            f"{found} chunks found, {loaded} loaded of {loadable_chunks(length, chunk_tokens)} "
            f"loadable, {failed} failed, {hit.cached_tokens} tokens not computed"
        )
    samples.runs["kvtier_miss", length].append(miss)
    samples.runs["engine_hit_on", length].append(own)
    samples.runs["kvtier_hit", length].append(hit)
    samples.kvtier_chunks[length].append(loaded)
    samples.kvtier_load_s[length].append(after.load_seconds - before.load_seconds)
    samples.own_hit_kvtier_chunks[length].append(own_chunks)


def _example(
    engine: EngineProcess, storage: Path, length: int, prompt: list[int], samples: HitSamples
) -> None:
    saved = _folders(storage)
    miss: Sample = engine.call("ttft", prompt)
    if len(_folders(storage) - saved) != 1:  # one folder per prompt, holding every layer's file
        raise RuntimeError(f"kvtier bench ttft: ExampleConnector did not save {length} tokens")
    engine.call("reset_prefix_cache")
    hit: Sample = engine.call("ttft", prompt)
    _check_cached("Example miss", length, miss, most=0)
    _check_cached("Example hit", length, hit, least=1)
    samples.runs["example_miss", length].append(miss)
    samples.runs["example_hit", length].append(hit)


def _host(engine: EngineProcess) -> TierStats:
    """kvtier's host-tier counters, now (a copy)."""
    return engine.call("kvtier_stats").cpu  # type: ignore[no-any-return]


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

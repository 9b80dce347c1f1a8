"""kvtier's tiers as vLLM's cache-hit sources (``vllm:prompt_tokens_cached_by_source``): each
tier's spec names its source (``TierSpec.hit_source``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvtier.tiers.registry import specs


def tier_sources(extra: Sequence[str] = ()) -> dict[str, CacheHitSource]:
    """Each known tier's source (``extra``: the outside tiers' import paths)."""
    return {spec.name: CacheHitSource[spec.hit_source] for spec in specs(extra)}


def hit_sources(
    loaded_tokens: Mapping[str, int],
    num_external_tokens: int,
    sources_of: Mapping[str, CacheHitSource] | None = None,
) -> dict[CacheHitSource, int]:
    """Split the engine's ``num_external_tokens`` by the tier each came from.

    ``loaded_tokens`` maps a tier to the tokens it loads, in load order. The counts always sum to
    ``num_external_tokens`` (vLLM's contract): tokens no tier accounts for are
    ``external_unspecified``, and tiers past the total are cut. Only non-zero counts are listed.
    """
    sources_of = tier_sources() if sources_of is None else sources_of
    sources: dict[CacheHitSource, int] = {}
    left = num_external_tokens
    for tier, tokens in loaded_tokens.items():
        tokens = min(tokens, left)
        if tokens > 0:
            source = sources_of.get(tier, CacheHitSource.EXTERNAL_UNSPECIFIED)
            sources[source] = sources.get(source, 0) + tokens
            left -= tokens
    if left > 0:
        unknown = CacheHitSource.EXTERNAL_UNSPECIFIED
        sources[unknown] = sources.get(unknown, 0) + left
    return sources

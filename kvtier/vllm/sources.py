"""kvtier's tiers as vLLM's cache-hit sources (``vllm:prompt_tokens_cached_by_source``)."""

from __future__ import annotations

from collections.abc import Mapping

from vllm.v1.metrics.cache_hit_source import CacheHitSource

TIER_SOURCES = {
    "cpu": CacheHitSource.HOST,
    "disk": CacheHitSource.DISK,
    "peer": CacheHitSource.P2P,  # a prefill engine's KV
    "redis": CacheHitSource.EXTERNAL_UNSPECIFIED,  # a remote store: vLLM has no source for it
}


def hit_sources(
    loaded_tokens: Mapping[str, int], num_external_tokens: int
) -> dict[CacheHitSource, int]:
    """Split the engine's ``num_external_tokens`` by the tier each came from.

    ``loaded_tokens`` maps a tier to the tokens it loads, in load order. The counts always sum to
    ``num_external_tokens`` (vLLM's contract): tokens no tier accounts for are
    ``external_unspecified``, and tiers past the total are cut. Only non-zero counts are listed.
    """
    sources: dict[CacheHitSource, int] = {}
    left = num_external_tokens
    for tier, tokens in loaded_tokens.items():
        tokens = min(tokens, left)
        if tokens > 0:
            source = TIER_SOURCES.get(tier, CacheHitSource.EXTERNAL_UNSPECIFIED)
            sources[source] = sources.get(source, 0) + tokens
            left -= tokens
    if left > 0:
        unknown = CacheHitSource.EXTERNAL_UNSPECIFIED
        sources[unknown] = sources.get(unknown, 0) + left
    return sources

"""kvtier: tiered, verified KV-cache offload for vLLM. ``kvtier.stats(llm)`` reads its counters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtier.counters import KVTierStats


def stats(llm: Any) -> KVTierStats:
    """kvtier's counters for an in-process ``vllm.LLM`` (imports vLLM on first use)."""
    from kvtier.vllm import stats as engine_stats

    return engine_stats(llm)

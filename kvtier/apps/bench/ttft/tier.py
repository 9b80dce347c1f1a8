"""A tier under the TTFT driver: how kvtier is configured for it, and what happens between the
pass that stores a prompt and the pass that serves it from the tier.

    TierTTFT(name, section, host_bytes, chunk_tokens, fresh_engine, page_cache)
    .extra()            kvtier's extra config: the host tier, the chunk, the tier's section
    .transfer(role)     vLLM's ``kv_transfer_config`` (``common.connector.kvtier_config``)
    .before_load()      what the driver does right before each timed load (None: nothing)
    host_tier(...)      the host tier: the same engine serves again, its own prefix cache emptied
    disk_tier(path)     a disk tier: a restarted engine, the files' page cache dropped first
    redis_tier(...)     a Redis tier: another engine of the fleet, its host tier empty
    peer_tier()         prefill→decode: the decode engine pulls what the prefill engine holds
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvtier.apps.bench.common import page_cache
from kvtier.apps.bench.common.connector import kvtier_config

CHUNK_TOKENS = 64  # kvtier's chunk in the TTFT benches (two engine blocks of 32 tokens)
HOST_BYTES = "2GiB"  # kvtier's host tier in ``kvtier bench ttft``'s engines
BELOW_HOST_BYTES = "1GiB"  # the host tier above a disk or Redis tier


@dataclass(frozen=True)
class TierTTFT:
    name: str  # the tier's name in kvtier's counters (``KVTierStats.tiers``) and /metrics
    section: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"disk": {"path": ...}}
    host_bytes: str = BELOW_HOST_BYTES
    chunk_tokens: int | None = CHUNK_TOKENS  # None: kvtier's default (one engine block)
    # the load pass runs on another engine, its host tier empty; else on the engine that
    # stored, settled and its own prefix cache emptied
    fresh_engine: bool = False
    page_cache: Path | None = None  # files whose page cache is dropped before each load

    def extra(self) -> dict[str, Any]:
        chunk = {} if self.chunk_tokens is None else {"block_size": self.chunk_tokens}
        return {"cpu_bytes_to_use": self.host_bytes, **chunk, **self.section}

    def transfer(self, role: str = "kv_both") -> dict[str, Any]:
        return kvtier_config(self.extra(), role)

    def before_load(self) -> float | None:
        """Drop the page cache of the tier's files (after ``os.sync``); the fraction still
        resident (~0), or None when the tier has no files."""
        return None if self.page_cache is None else page_cache.drop_tree(self.page_cache)

    def host(self) -> TierTTFT:
        """The host tier of this tier's engines, served again by the same engine."""
        return replace(self, name="cpu", fresh_engine=False, page_cache=None)


def host_tier(chunk_tokens: int = CHUNK_TOKENS, host_bytes: str = HOST_BYTES) -> TierTTFT:
    return TierTTFT("cpu", host_bytes=host_bytes, chunk_tokens=chunk_tokens)


def disk_tier(path: Path, disk_bytes: str = "4GiB") -> TierTTFT:
    section = {"disk": {"path": str(path), "bytes": disk_bytes}}
    return TierTTFT("disk", section, fresh_engine=True, page_cache=path)


def redis_tier(url: str, prefix: str) -> TierTTFT:
    return TierTTFT("redis", {"redis": {"url": url, "prefix": prefix}}, fresh_engine=True)


def peer_tier(host_bytes: str = BELOW_HOST_BYTES) -> TierTTFT:
    return TierTTFT("peer", host_bytes=host_bytes, chunk_tokens=None, fresh_engine=True)

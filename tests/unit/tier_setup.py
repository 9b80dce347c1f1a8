"""A worker rank's tiers as the vLLM connector builds them (``kvtier/vllm/assembly.py``), for
tests that drive a ``WorkerConnector`` without vLLM: each tier's spec builds its side."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from kvtier.keys import LayoutFingerprint
from kvtier.layout import KVLayout
from kvtier.tiers.base.spec import TierSpec, WorkerContext, WorkerTier
from kvtier.tiers.disk import SPEC as DISK
from kvtier.tiers.disk.config import DiskConfig
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.peer import SPEC as PEER
from kvtier.tiers.peer.config import TransferConfig
from kvtier.tiers.redis import SPEC as REDIS
from kvtier.tiers.redis.config import RedisConfig
from kvtier.worker.connector import TierBuilder


def _builder(
    spec: TierSpec, config: Any, rank: int, fingerprint: LayoutFingerprint, **context: Any
) -> TierBuilder:
    """``context``: ``WorkerContext``'s other fields (``role``, ``server_rank``)."""

    def build(layout: KVLayout, host: HostTier, description: str) -> WorkerTier | None:
        assert spec.worker is not None
        mine = dataclasses.replace(fingerprint, layout=description)
        factor = host.block_size_factor
        return spec.worker(WorkerContext(config, layout, host, rank, mine, factor, **context))

    return build


def disk_tier(root: Path, rank: int, fingerprint: LayoutFingerprint) -> TierBuilder:
    """This rank's disk tier in ``root`` (the budget is the scheduler's: unused here)."""
    return _builder(DISK, DiskConfig(str(root), 1), rank, fingerprint)


def redis_tier(config: RedisConfig, rank: int, fingerprint: LayoutFingerprint) -> TierBuilder:
    return _builder(REDIS, config, rank, fingerprint)


def peer_tier(
    config: TransferConfig, role: str, fingerprint: LayoutFingerprint, server_rank: int = 0
) -> TierBuilder:
    """Rank 0's side of prefill→decode (``role``: kv_producer or kv_consumer) in the engine whose
    ranks start at ``server_rank`` among a server's data-parallel engines."""
    return _builder(PEER, config, 0, fingerprint, role=role, server_rank=server_rank)

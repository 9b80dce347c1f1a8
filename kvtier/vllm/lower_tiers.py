"""The tier chain below host memory as the vLLM connector's scheduler side builds it: the disk
tier (built by the connector, first), then Redis (``scheduler/redis_index.py``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKey
from kvtier.scheduler.lower_tier import LowerTier

logger = logging.getLogger(__name__)


def scheduler_lower_tiers(config: KVTierConfig, world_size: int) -> list[LowerTier]:
    """The chain's entries after the disk tier (which the connector builds first)."""
    if config.redis is None:
        return []
    from kvtier.tiers.redis.index import RedisIndex  # imported only where Redis is used
    from kvtier.tiers.redis.keys import redis_key
    from kvtier.tiers.redis.start import checked_store

    store = checked_store(config.redis)
    if store is None:
        return []
    prefix = config.redis.prefix

    def exists(keys: Sequence[ChunkKey]) -> list[bool]:
        names = [redis_key(prefix, key, rank) for key in keys for rank in range(world_size)]
        found = store.exists(names)
        return [all(found[i * world_size : (i + 1) * world_size]) for i in range(len(keys))]

    index = RedisIndex(
        exists,
        config.redis.timeout_s,
        config.redis.max_queued_chunks,
        available=lambda: store.available,
    )
    logger.info("kvtier: Redis tier (key prefix %r, %d rank(s), timeout %.2f s)",
                prefix, world_size, config.redis.timeout_s)  # fmt: skip
    return [index]

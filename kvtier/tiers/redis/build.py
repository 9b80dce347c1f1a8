"""The Redis tier's two halves, built from its config section (``TierSpec`` builders).

Each half opens its own connections (the scheduler's for lookups, each rank's for its records);
a Redis that does not answer at start-up is an error, or, with ``redis.required`` false, a
warning and no tier (``start.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvtier.keys import ChunkKey
from kvtier.tiers.base.spec import SchedulerContext, WorkerContext, WorkerTier
from kvtier.tiers.redis.config import RedisConfig

if TYPE_CHECKING:  # built only when the tier is (a config is parsed without them)
    from kvtier.tiers.redis.index import RedisIndex

logger = logging.getLogger(__name__)

NAME = "redis"


def scheduler_index(ctx: SchedulerContext[RedisConfig]) -> RedisIndex | None:
    from kvtier.tiers.redis.index import RedisIndex
    from kvtier.tiers.redis.keys import redis_key
    from kvtier.tiers.redis.start import checked_store

    config, world_size = ctx.config, ctx.world_size
    store = checked_store(config)
    if store is None:
        return None
    prefix = config.prefix

    def exists(keys: Sequence[ChunkKey]) -> list[bool]:
        names = [redis_key(prefix, key, rank) for key in keys for rank in range(world_size)]
        found = store.exists(names)
        return [all(found[i * world_size : (i + 1) * world_size]) for i in range(len(keys))]

    index = RedisIndex(
        exists,
        config.timeout_s,
        config.max_queued_chunks,
        available=lambda: store.available,
        lookup_wait_s=config.lookup_wait_s,
    )
    logger.info("kvtier: Redis tier (key prefix %r, %d rank(s), timeout %.2f s)",
                prefix, world_size, config.timeout_s)  # fmt: skip
    return index


def worker_tier(ctx: WorkerContext[RedisConfig]) -> WorkerTier | None:
    """This rank's records; none (loads fail, stores are skipped) when Redis did not answer at
    start-up and ``redis.required`` is false."""
    from kvtier.tiers.redis.io import RedisLoadHandler, RedisWriteHandler
    from kvtier.tiers.redis.start import checked_store
    from kvtier.tiers.redis.tier import RedisTier

    store = checked_store(ctx.config)
    if store is None:
        return None
    records = RedisTier(
        store, ctx.rank, ctx.fingerprint.digest(), ctx.fingerprint.describe(), ctx.layout,
        ctx.factor,
    )  # fmt: skip
    return WorkerTier(
        NAME,
        load=RedisLoadHandler(ctx.layout, records),
        write=RedisWriteHandler(ctx.host, records),
        flush=records,
        on_close=records.close,
    )

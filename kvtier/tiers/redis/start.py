"""Start-up of the Redis tier, in the scheduler and in every worker rank: is Redis there?

A Redis that cannot be reached, or refuses the credentials or the TLS handshake, at start-up is a
``ValueError`` naming the setting (``RedisStore.check``); with ``redis.required`` false it is a
warning, and the engine runs without the Redis tier.
"""

from __future__ import annotations

import logging

from kvtier.tiers.redis.config import RedisConfig
from kvtier.tiers.redis.store import RedisStore

logger = logging.getLogger(__name__)


def checked_store(config: RedisConfig) -> RedisStore | None:
    """A store that answered at start-up; None (and a warning) when it did not and
    ``redis.required`` is false."""
    store = RedisStore(config)
    try:
        store.check()
    except ValueError as error:
        store.close()
        if config.required:
            raise
        logger.warning("kvtier: the Redis tier is off ('redis.required' is false): %s", error)
        return None
    return store

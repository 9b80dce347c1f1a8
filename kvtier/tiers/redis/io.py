"""Transfers of the Redis tier: the handler pair of ``tiers/chunk_io.py`` over Redis records.

Loads: ``RedisTier.prefetch`` pipelines the GETs of the next chunks while one is received
straight into the staging buffer, verified, and scattered into the engine blocks; a record that
is absent (Redis evicted it), bad (deleted) or unreachable is a bad chunk of the job: the engine
recomputes, and the scheduler forgets the chunk. Writes: the job's records go out as pipelined
SETs; a write that fails (Redis down, out of memory) is a bad chunk of the job, counted, which
the scheduler writes again while host memory holds it (``scheduler/tier_writes.py``).
"""

from __future__ import annotations

import logging
import time

from kvtier.keys import ChunkKey
from kvtier.layout import KVLayout
from kvtier.tiers.base.chunk_format import Buffer
from kvtier.tiers.base.chunk_io import WARN_EVERY, TierLoadHandler, TierWriteHandler
from kvtier.tiers.base.handler import TransferResult
from kvtier.tiers.base.records import HostRecords
from kvtier.tiers.redis.tier import RedisTier

logger = logging.getLogger(__name__)


class RedisLoadHandler(TierLoadHandler):
    def __init__(self, layout: KVLayout, tier: RedisTier) -> None:
        super().__init__(layout, tier, "redis")


class RedisWriteHandler(TierWriteHandler):
    def __init__(self, host: HostRecords, tier: RedisTier) -> None:
        super().__init__(host, tier, "redis")
        self.redis = tier

    def _write(
        self, job_id: int, keys: tuple[ChunkKey, ...], payloads: list[list[Buffer]]
    ) -> TransferResult:
        started = time.perf_counter()
        try:
            written = self.redis.write_many(keys, payloads)
        except OSError as error:
            written = [None] * len(keys)
            self._warn(len(keys), error)
        failed = [i for i, nbytes in enumerate(written) if nbytes is None]
        if failed and len(failed) < len(keys):
            self._warn(len(failed), "refused by Redis (out of memory?)")
        nbytes = sum(n for n in written if n is not None)
        return TransferResult(
            job_id, not failed, nbytes, time.perf_counter() - started, bad=tuple(failed)
        )

    def _warn(self, count: int, why: object) -> None:
        if self.write_errors // WARN_EVERY != (self.write_errors + count) // WARN_EVERY or (
            self.write_errors == 0
        ):
            logger.warning("kvtier: %d redis writes failed (%d so far; retried): %s",
                           count, self.write_errors + count, why)  # fmt: skip
        self.write_errors += count

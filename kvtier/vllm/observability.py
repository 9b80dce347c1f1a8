"""What kvtier tells vLLM, and through it the server's clients: a part of ``KVTierConnector``.

    stats()                      each step's changes (``stats.py``): the log line, /metrics
    maybe_log()                  kvtier's totals line, at most every LOG_INTERVAL_S
    hit_sources(request, n)      kvtier's tokens per vLLM cache-hit source (``sources.py``)
    finished(request, params)    hold blocks for stores; provenance as kv_transfer_params
    reset()                      reset_prefix_cache(reset_connector=True): the host tier

Built in the engine's scheduler process only (the worker connectors have none); the stats'
builders, which vLLM's stat loggers call in the API server, are the connector's class methods
(``KVTierConnectorStats``, ``prometheus.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from kvtier.vllm.metadata import KVTierConnectorStats
from kvtier.vllm.sources import hit_sources, tier_sources
from kvtier.vllm.stats import StatsInterval

if TYPE_CHECKING:
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
    from vllm.v1.request import Request

    from kvtier.scheduler.connector import SchedulerConnector

logger = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0  # kvtier's own totals line, at most this often, only when it changed


class Observability:
    """``scheduler``'s stats, metrics, hit sources, provenance and reset; ``chunk_bytes``: one
    host-tier chunk's bytes, all ranks (the tier's used bytes are counted in chunks)."""

    def __init__(
        self, scheduler: SchedulerConnector, chunk_bytes: int, outside_tiers: Sequence[str] = ()
    ) -> None:
        self.scheduler = scheduler
        self.chunk_bytes = chunk_bytes
        self._sources = tier_sources(outside_tiers)
        self._stats_interval = StatsInterval()
        self._last_log, self._last_line = time.monotonic(), ""

    # ---- stats -------------------------------------------------------------------------------

    def stats(self) -> KVConnectorStats | None:
        """What changed since the previous call (vLLM asks after every step), or None."""
        scheduler = self.scheduler
        host = scheduler.manager
        used = {"cpu": host.usage().used}
        for tier in scheduler.lower:
            used[tier.name] = tier.usage().used
        seconds = scheduler.job_log.seconds.take()
        payload = self._stats_interval.take(scheduler.stats, seconds, used, scheduler.chunk_tokens)
        return None if payload is None else KVTierConnectorStats(data=payload)

    def maybe_log(self) -> None:
        """kvtier's totals (``kvtier: cpu hit ...``) every LOG_INTERVAL_S, when they changed."""
        now = time.monotonic()
        if now - self._last_log < LOG_INTERVAL_S:
            return
        self._last_log = now
        line = self.scheduler.stats.log_line()
        if line != self._last_line:
            self._last_line = line
            logger.info(line)

    # ---- per request -----------------------------------------------------------------------

    def hit_sources(self, request: Request, num_external_tokens: int) -> dict[CacheHitSource, int]:
        """``num_external_tokens`` split by tier, each under its spec's ``hit_source`` (called
        after ``update_state_after_alloc`` planned the load)."""
        state = self.scheduler.requests.get(request.request_id)
        loaded = state.loaded_tokens if state else {}
        return hit_sources(loaded, num_external_tokens, self._sources)

    def finished(
        self, request: Request, params: dict[str, Any] | None = None
    ) -> tuple[bool, dict[str, Any] | None]:
        """True: keep the blocks until the workers release them (stores drained, a decode
        engine's pull). The params, ``{"kvtier": {...}}`` added to ``params``, reach the client
        as the completion's ``kv_transfer_params``."""
        found = self.scheduler.provenance(request.request_id, request.num_prompt_tokens)
        hold = self.scheduler.request_finished(request.request_id)
        if found is not None:
            params = {**(params or {}), **found.as_params()}
        return hold, params

    def reset(self) -> bool:
        """Forget the host tier's chunks (part of ``SchedulerSide.reset``, vLLM's connector
        reset, which also renames the keys unless ``reset_keeps_tiers``).

        The chain's tiers are kept: they persist across restarts and may be shared with other
        engines. Chunks that transfers use stay: False then, and the caller may retry.
        """
        before = len(self.scheduler.manager.stored())
        done = self.scheduler.drop_host_chunks()
        after = len(self.scheduler.manager.stored())
        logger.info("kvtier: reset dropped %d host chunk(s), %d in use kept", before - after, after)
        return done

"""What kvtier tells vLLM, and through it the server's clients: a mixin of ``KVTierConnector``.

    get_kv_connector_stats()             each step's changes (``stats.py``): the log line, /metrics
    build_kv_connector_stats(data)       vLLM's stat loggers rebuild those from the payload
    build_prom_metrics(...)              kvtier's series on /metrics (``prometheus.py``)
    get_external_cache_hit_sources(...)  kvtier's tokens per vLLM cache-hit source (``sources.py``)
    _finished(request, params)           hold blocks for stores; provenance as kv_transfer_params
    reset_cache()                        reset_prefix_cache(reset_connector=True): the host tier

Scheduler-side calls only (the worker connectors answer None): vLLM makes them in the engine's
scheduler process, except the two builders, which its stat loggers call in the API server.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)

from kvtier.layout import Placement, placement_bytes_per_block
from kvtier.vllm.logs import route_to_vllm_logging
from kvtier.vllm.metadata import KVTierConnectorStats
from kvtier.vllm.sources import hit_sources
from kvtier.vllm.stats import StatsInterval

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
    from vllm.v1.request import Request

    from kvtier.config import KVTierConfig
    from kvtier.scheduler.connector import SchedulerConnector

logger = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0  # kvtier's own totals line, at most this often, only when it changed


class ConnectorObservability:
    """Stats, metrics, hit sources, provenance and reset; ``_init_observability`` first."""

    config: KVTierConfig
    _scheduler: SchedulerConnector | None
    _vllm_config: VllmConfig
    _kv_cache_config: KVCacheConfig

    def _init_observability(self) -> None:
        route_to_vllm_logging()
        self._stats_interval = StatsInterval()
        self._host_chunk_bytes: int | None = None
        self._last_log, self._last_line = time.monotonic(), ""

    # ---- stats and metrics -----------------------------------------------------------------

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """What changed since the previous call (vLLM asks after every step), or None."""
        scheduler = self._scheduler
        if scheduler is None:
            return None
        host = scheduler.manager
        used = {"cpu": (host.capacity - host.num_free) * self._chunk_bytes()}
        for tier in scheduler.lower:
            used[tier.name] = tier.used
        seconds = scheduler.job_log.seconds.take()
        payload = self._stats_interval.take(scheduler.stats, seconds, used, scheduler.chunk_tokens)
        return None if payload is None else KVTierConnectorStats(data=payload)

    def _chunk_bytes(self) -> int:
        """Bytes of one host-tier chunk, all ranks: as the connector sized the tier."""
        if self._host_chunk_bytes is None:
            config = self._kv_cache_config
            placements = [Placement(t.size, tuple(t.layers)) for t in config.kv_cache_tensors]
            per_block = placement_bytes_per_block(placements, config.num_blocks)
            engine_block = self._vllm_config.cache_config.block_size
            factor = self.config.block_size_factor(engine_block)
            world_size = self._vllm_config.parallel_config.world_size
            self._host_chunk_bytes = per_block * factor * world_size
        return self._host_chunk_bytes

    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> KVConnectorStats | None:
        return KVTierConnectorStats(data=dict(data) if data else {})

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        from kvtier.vllm.prometheus import KVTierPromMetrics

        return KVTierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def _maybe_log(self) -> None:
        """kvtier's totals (``kvtier: cpu hit ...``) every LOG_INTERVAL_S, when they changed."""
        now = time.monotonic()
        if self._scheduler is None or now - self._last_log < LOG_INTERVAL_S:
            return
        self._last_log = now
        line = self._scheduler.stats.log_line()
        if line != self._last_line:
            self._last_line = line
            logger.info(line)

    # ---- per request -----------------------------------------------------------------------

    def get_external_cache_hit_sources(
        self, request: Request, num_external_tokens: int
    ) -> dict[CacheHitSource, int]:
        """``num_external_tokens`` split by tier: cpu -> host, disk -> disk (called after
        ``update_state_after_alloc`` planned the load)."""
        state = self._scheduler.requests.get(request.request_id) if self._scheduler else None
        return hit_sources(state.loaded_tokens if state else {}, num_external_tokens)

    def _finished(
        self, request: Request, params: dict[str, Any] | None = None
    ) -> tuple[bool, dict[str, Any] | None]:
        """True: keep the blocks until the workers release them (stores drained, a decode
        engine's pull). The params, ``{"kvtier": {...}}`` added to ``params``, reach the client
        as the completion's ``kv_transfer_params``."""
        assert self._scheduler is not None, "kvtier: request_finished on a worker connector"
        found = self._scheduler.provenance(request.request_id, request.num_prompt_tokens)
        hold = self._scheduler.request_finished(request.request_id)
        if found is not None:
            params = {**(params or {}), **found.as_params()}
        return hold, params

    def reset_cache(self) -> bool | None:
        """Forget the host tier's chunks (vLLM: ``reset_prefix_cache(reset_connector=True)``).

        The disk tier is kept: it persists across restarts and may be shared with other engines
        (point ``disk.path`` elsewhere after changing a model's weights in place). Chunks that
        transfers use stay: False then, and the caller may retry.
        """
        if self._scheduler is None:
            return None
        before = len(self._scheduler.manager.stored())
        done = self._scheduler.drop_host_chunks()
        after = len(self._scheduler.manager.stored())
        logger.info("kvtier: reset dropped %d host chunk(s), %d in use kept", before - after, after)
        return done

"""kvtier's series on vLLM's ``/metrics``: registered by ``KVTierConnector.build_prom_metrics``.

Every series carries vLLM's labels (``model_name``, ``engine``) and, per tier, ``tier`` (``cpu``,
``disk``, ...). Names start with ``vllm:kvtier_`` like vLLM's own connector series (vLLM drops
``vllm:`` collectors when it builds its Prometheus logger again); counters gain ``_total``.

    vllm:kvtier_{hit,miss,loaded,stored}_{chunks,tokens}   counters per tier (tokens: chunks x
                                                            the chunk's tokens)
    vllm:kvtier_{loaded,stored}_bytes                       counters per tier (summed over ranks)
    vllm:kvtier_{evicted_chunks,bad_chunks,failed_loads,failed_stores,skipped_stores,
                 failed_lookups,untrusted_stores}
    vllm:kvtier_lost_chunks{cause}                          counter per tier (below host
                                                            memory) and cause: chunks bound for
                                                            the tier that never reached it
                                                            (``TierStats.lost_*``)
    vllm:kvtier_hit_decisions{decision}                     counter per tier and decision:
                                                            chunks a lookup found and loaded
                                                            (``load``), or left to compute as
                                                            loading them was predicted slower
                                                            (``compute``)
    vllm:kvtier_{load,store}_seconds                        histograms per tier (one per job)
    vllm:kvtier_used_bytes                                  gauge per tier
    vllm:kvtier_lookups, vllm:kvtier_preemptions            counters
"""

from __future__ import annotations

from typing import Any

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    PromMetric,
    PromMetricT,
)

from kvtier.config import KVTierConfig
from kvtier.counters import LOST_CAUSES

PREFIX = "vllm:kvtier_"
TIER_COUNTERS = {  # TierStats field -> documentation
    "hit_chunks": "Chunks a lookup found in the tier (the engine then loaded them).",
    "miss_chunks": "Chunks looked up and not found in the tier.",
    "failed_lookups": "Lookups that got no answer (timed out, or the store is down): misses.",
    "loaded_chunks": "Chunks loaded from the tier into the engine.",
    "loaded_bytes": "Bytes loaded from the tier into the engine, summed over ranks.",
    "stored_chunks": "Chunks stored in the tier.",
    "stored_bytes": "Bytes stored in the tier, summed over ranks.",
    "evicted_chunks": "Chunks evicted from the tier to make room.",
    "bad_chunks": "Copies that failed a check on load (dropped; the engine recomputed).",
    "failed_loads": "Load jobs that failed on a rank (the engine recomputed those tokens).",
    "failed_stores": "Chunks (a tier of the chain) or store jobs (cpu) that failed to be stored.",
    "skipped_stores": "Chunks not stored for lack of room.",
    "untrusted_stores": "Chunks not stored: computed from a synchronous load that failed.",
}
TOKEN_COUNTERS = {  # tokens series -> the chunks field it scales
    "hit_tokens": "hit_chunks",
    "miss_tokens": "miss_chunks",
    "loaded_tokens": "loaded_chunks",
    "stored_tokens": "stored_chunks",
}
LOST_DOC = (
    "Chunks bound for the tier (below host memory) that never reached it, by cause: "
    "evicted_dirty (left host memory unwritten, too many writes queued to copy it aside), "
    "no_room (the tier had no room), tier_down (the tier was down), write_error (its write "
    "failed for good)."
)
DECISIONS = {"load": "hit_chunks", "compute": "declined_chunks"}  # decision -> TierStats field
DECISIONS_DOC = (
    "Chunks a lookup found in the tier, by what was decided: load (loaded) or compute (the engine "
    "computed them instead: loading them was predicted slower than computing them)."
)
ENGINE_DOCS = {
    "lookups": "Requests kvtier looked up.",
    "preemptions": "Requests the engine preempted (kvtier flushed their pending stores).",
}
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class KVTierPromMetrics(KVConnectorPromMetrics):
    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        by_tier = [*labelnames, "tier"]
        # vLLM's metric_types map each kind to its own class (or a Ray wrapper)
        histogram_cls: Any = self._histogram_cls
        gauge_cls: Any = self._gauge_cls
        self._tier_metrics: dict[str, Any] = {}
        for name, doc in TIER_COUNTERS.items():
            self._tier_metrics[name] = self._counter(name, doc, by_tier)
        for name, chunks in TOKEN_COUNTERS.items():
            doc = TIER_COUNTERS[chunks].replace("Chunks", "Tokens of the chunks", 1)
            self._tier_metrics[name] = self._counter(name, doc, by_tier)
        for name, what in (("load_seconds", "load"), ("store_seconds", "store")):
            self._tier_metrics[name] = histogram_cls(
                name=PREFIX + name,
                documentation=f"Seconds of each {what} job of the tier (its slowest rank).",
                buckets=SECONDS_BUCKETS,
                labelnames=by_tier,
            )
        self._tier_metrics["used_bytes"] = gauge_cls(
            name=PREFIX + "used_bytes",
            documentation="Bytes of KV the tier holds (all ranks).",
            labelnames=by_tier,
            multiprocess_mode="mostrecent",
        )
        self._lost = self._counter("lost_chunks", LOST_DOC, [*by_tier, "cause"])
        self._decisions = self._counter("hit_decisions", DECISIONS_DOC, [*by_tier, "decision"])
        self._engine_metrics = {
            name: self._counter(name, doc, labelnames) for name, doc in ENGINE_DOCS.items()
        }
        for labelvalues in per_engine_labelvalues.values():  # every series exists from the start
            for metric in self._engine_metrics.values():
                metric.labels(*labelvalues)
            for tier in _tiers(vllm_config):
                for metric in self._tier_metrics.values():
                    metric.labels(*labelvalues, tier)
                for cause in LOST_CAUSES if tier != "cpu" else ():
                    self._lost.labels(*labelvalues, tier, cause)
                for decision in DECISIONS:
                    self._decisions.labels(*labelvalues, tier, decision)

    def _counter(self, name: str, documentation: str, labelnames: list[str]) -> Any:
        return self._counter_cls(
            name=PREFIX + name, documentation=documentation, labelnames=labelnames
        )

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        """Add one step's payload (``kvtier.vllm.stats``) to the series of engine ``engine_idx``."""
        labels = self.per_engine_labelvalues[engine_idx]
        data = transfer_stats_data
        for name, metric in self._engine_metrics.items():
            if value := data.get(name, 0):
                metric.labels(*labels).inc(value)
        chunk_tokens = data.get("chunk_tokens", 0)
        for tier, changes in data.get("tiers", {}).items():
            for name, value in changes.items():
                if name in TIER_COUNTERS and value > 0:
                    self._tier_metrics[name].labels(*labels, tier).inc(value)
                elif name.startswith("lost_") and value > 0:
                    self._lost.labels(*labels, tier, name.removeprefix("lost_")).inc(value)
            for name, chunks in TOKEN_COUNTERS.items():
                if tokens := changes.get(chunks, 0) * chunk_tokens:
                    self._tier_metrics[name].labels(*labels, tier).inc(tokens)
            for decision, field in DECISIONS.items():
                if (count := changes.get(field, 0)) > 0:
                    self._decisions.labels(*labels, tier, decision).inc(count)
        for tier, used in data.get("used_bytes", {}).items():
            self._tier_metrics["used_bytes"].labels(*labels, tier).set(used)
        for name in ("load_seconds", "store_seconds"):
            for tier, samples in data.get(name, {}).items():
                histogram = self._tier_metrics[name].labels(*labels, tier)
                for seconds in samples:
                    histogram.observe(seconds)


def _tiers(vllm_config: VllmConfig) -> list[str]:
    """The tiers the engine's kvtier config names (host memory always; the chain's tiers that
    are configured, in its order)."""
    transfer = vllm_config.kv_transfer_config
    extra = transfer.kv_connector_extra_config if transfer is not None else None
    # only the tiers are read here: every chunk size is a multiple of an engine block of 1
    config = KVTierConfig.from_extra_config(extra, 1)
    return ["cpu", *(spec.name for spec in config.chain())]

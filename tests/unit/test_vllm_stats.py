"""kvtier's stats as vLLM carries them (no engine): per-step changes, their sum over a logging
interval, the log line's fields, the Prometheus series, the cache-hit sources, log routing."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvtier.counters import JobSeconds, KVTierStats, TierStats
from kvtier.vllm import KVTierConnector
from kvtier.vllm.logs import route_to_vllm_logging
from kvtier.vllm.metadata import KVTierConnectorStats
from kvtier.vllm.prometheus import KVTierPromMetrics
from kvtier.vllm.sources import hit_sources
from kvtier.vllm.stats import StatsInterval, merge


def _stats(**cpu: Any) -> KVTierStats:
    return KVTierStats(lookups=cpu.pop("lookups", 0), tiers={"cpu": TierStats(**cpu)})


def test_a_payload_holds_what_changed_since_the_last_one() -> None:
    interval, stats = StatsInterval(), _stats(lookups=2, hit_chunks=3, loaded_bytes=300)
    seconds = JobSeconds()
    seconds.add("cpu", 0.5, load=True)
    first = interval.take(stats, seconds.take(), {"cpu": 1000}, chunk_tokens=64)
    assert first == {
        "chunk_tokens": 64, "lookups": 2,
        "tiers": {"cpu": {"hit_chunks": 3, "loaded_bytes": 300}},
        "used_bytes": {"cpu": 1000}, "load_seconds": {"cpu": [0.5]},
    }  # fmt: skip
    assert interval.take(stats, seconds.take(), {"cpu": 1000}, 64) is None  # nothing changed
    stats.cpu.hit_chunks += 2
    stats.tiers["disk"] = TierStats(stored_chunks=1)
    second = interval.take(stats, seconds.take(), {"cpu": 1000, "disk": 7}, 64)
    assert second == {
        "chunk_tokens": 64,
        "tiers": {"cpu": {"hit_chunks": 2}, "disk": {"stored_chunks": 1}},
        "used_bytes": {"disk": 7},  # a gauge is sent when it changed
    }


def test_a_lowered_total_is_never_sent_twice() -> None:
    """Payloads add up to the highest total: Prometheus counters only ever grow."""
    interval, stats, none = StatsInterval(), _stats(miss_chunks=10), JobSeconds()
    assert interval.take(stats, none, {}, 32) == {
        "chunk_tokens": 32,
        "tiers": {"cpu": {"miss_chunks": 10}},
    }
    stats.cpu.miss_chunks = 8
    assert interval.take(stats, none, {}, 32) is None
    stats.cpu.miss_chunks = 12
    assert interval.take(stats, none, {}, 32) == {
        "chunk_tokens": 32,
        "tiers": {"cpu": {"miss_chunks": 2}},
    }


def test_an_intervals_payloads_sum_counters_keep_the_newest_gauge_and_every_sample() -> None:
    a = {"chunk_tokens": 64, "lookups": 1, "tiers": {"cpu": {"hit_chunks": 3}},
         "used_bytes": {"cpu": 10}, "load_seconds": {"cpu": [0.1]}}  # fmt: skip
    b = {"chunk_tokens": 64, "lookups": 2, "tiers": {"cpu": {"hit_chunks": 1, "miss_chunks": 1}},
         "used_bytes": {"cpu": 20, "disk": 5}, "load_seconds": {"cpu": [0.2]}}  # fmt: skip
    assert merge(a, b) == {
        "chunk_tokens": 64, "lookups": 3, "tiers": {"cpu": {"hit_chunks": 4, "miss_chunks": 1}},
        "used_bytes": {"cpu": 20, "disk": 5}, "load_seconds": {"cpu": [0.1, 0.2]},
    }  # fmt: skip
    assert a["lookups"] == 1 and a["load_seconds"] == {"cpu": [0.1]}  # unchanged


def test_vllms_logging_interval_sums_the_steps_and_logs_their_fields() -> None:
    accumulator = KVTierConnector.build_kv_connector_stats(
        {"chunk_tokens": 32, "tiers": {"cpu": {"hit_chunks": 3, "miss_chunks": 1}}}
    )
    step = KVTierConnector.build_kv_connector_stats(
        {"chunk_tokens": 32, "tiers": {"cpu": {"loaded_bytes": 3 * 2**20, "load_seconds": 0.002}},
         "used_bytes": {"cpu": 2**21}}
    )  # fmt: skip
    assert isinstance(accumulator, KVTierConnectorStats) and isinstance(step, KVTierConnectorStats)
    assert KVTierConnector.build_kv_connector_stats(None).is_empty()  # type: ignore[union-attr]
    accumulator = accumulator.aggregate(step)
    assert accumulator.reduce() == {
        "cpu_hit_rate": 0.75, "cpu_hit_chunks": 3, "cpu_miss_chunks": 1, "cpu_loaded_MiB": 3.0,
        "cpu_load_ms": 2.0, "cpu_used_MiB": 2.0,
    }  # fmt: skip
    accumulator.reset()
    assert accumulator.is_empty()


def _prom(extra: dict[str, Any]) -> tuple[KVTierPromMetrics, CollectorRegistry]:
    registry = CollectorRegistry()

    def bound(cls: Any) -> Any:
        class Bound(cls):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, registry=registry, **kwargs)

        return Bound

    config: Any = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra)
    )
    types = {cls: bound(cls) for cls in (Counter, Gauge, Histogram)}
    metrics = KVTierConnector.build_prom_metrics(
        config, types, ["model_name", "engine"], {0: ["m", "0"]}
    )
    assert isinstance(metrics, KVTierPromMetrics)
    return metrics, registry


def test_prometheus_counters_add_each_steps_changes() -> None:
    metrics, registry = _prom({"cpu_bytes_to_use": "1GiB", "disk": {"path": "/d", "bytes": "1GiB"}})
    labels = {"model_name": "m", "engine": "0"}
    cpu, disk = labels | {"tier": "cpu"}, labels | {"tier": "disk"}
    assert registry.get_sample_value("vllm:kvtier_hit_tokens_total", disk) == 0.0  # from the start
    changes = {"hit_chunks": 2, "loaded_bytes": 100}
    step = {"chunk_tokens": 32, "lookups": 1, "tiers": {"cpu": changes},
            "used_bytes": {"cpu": 64}, "load_seconds": {"cpu": [0.003, 0.2]}}  # fmt: skip
    metrics.observe(step, 0)
    metrics.observe(step | {"used_bytes": {"cpu": 32}}, 0)
    value = registry.get_sample_value
    assert value("vllm:kvtier_hit_chunks_total", cpu) == 4
    assert value("vllm:kvtier_hit_tokens_total", cpu) == 128
    assert value("vllm:kvtier_loaded_bytes_total", cpu) == 200
    assert value("vllm:kvtier_lookups_total", labels) == 2
    assert value("vllm:kvtier_used_bytes", cpu) == 32
    assert value("vllm:kvtier_load_seconds_count", cpu) == 4
    assert value("vllm:kvtier_load_seconds_bucket", cpu | {"le": "0.005"}) == 2
    assert value("vllm:kvtier_hit_chunks_total", disk) == 0


def test_chunks_lost_on_the_way_to_a_tier_are_one_counter_by_tier_and_cause() -> None:
    extra = {"cpu_bytes_to_use": "1GiB", "disk": {"path": "/d", "bytes": "1GiB"},
             "redis": {"url": "redis://127.0.0.1:1/0"}}  # fmt: skip
    metrics, registry = _prom(extra)
    labels = {"model_name": "m", "engine": "0"}
    cpu, disk, redis = (labels | {"tier": tier} for tier in ("cpu", "disk", "redis"))
    value = registry.get_sample_value
    assert value("vllm:kvtier_lost_chunks_total", redis | {"cause": "tier_down"}) == 0.0
    assert value("vllm:kvtier_lost_chunks_total", cpu | {"cause": "no_room"}) is None
    interval, stats = StatsInterval(), KVTierStats(tiers={"cpu": TierStats(), "redis": TierStats()})
    stats.tiers["redis"].lose("tier_down", 3)
    stats.tiers["redis"].lose("evicted_dirty", 1)
    payload = interval.take(stats, JobSeconds(), {}, 64)
    assert payload is not None
    assert payload["tiers"] == {"redis": {"lost_tier_down": 3, "lost_evicted_dirty": 1}}

    metrics.observe(payload, 0)

    assert value("vllm:kvtier_lost_chunks_total", redis | {"cause": "tier_down"}) == 3
    assert value("vllm:kvtier_lost_chunks_total", redis | {"cause": "evicted_dirty"}) == 1
    assert value("vllm:kvtier_lost_chunks_total", disk | {"cause": "no_room"}) == 0
    assert stats.tiers["redis"].lost == {"evicted_dirty": 1, "tier_down": 3}
    assert "redis hit 0/0" in stats.log_line()
    assert "lost 4 (evicted_dirty 1, tier_down 3)" in stats.log_line()
    assert stats.as_dict()["tiers"]["redis"]["lost_tier_down"] == 3  # type: ignore[index]


def test_hit_decisions_count_chunks_loaded_and_computed_instead_per_tier() -> None:
    metrics, registry = _prom({"cpu_bytes_to_use": "1GiB", "redis": {"url": "redis://h:1/0"}})
    labels = {"model_name": "m", "engine": "0"}
    cpu, redis = (labels | {"tier": tier} for tier in ("cpu", "redis"))
    value = registry.get_sample_value
    assert value("vllm:kvtier_hit_decisions_total", redis | {"decision": "compute"}) == 0.0
    stats = KVTierStats(tiers={"cpu": TierStats(hit_chunks=3, miss_chunks=7),
                               "redis": TierStats(hit_chunks=2, declined_chunks=5)})  # fmt: skip
    payload = StatsInterval().take(stats, JobSeconds(), {}, 64)
    assert payload is not None
    metrics.observe(payload, 0)
    assert value("vllm:kvtier_hit_decisions_total", cpu | {"decision": "load"}) == 3
    assert value("vllm:kvtier_hit_decisions_total", cpu | {"decision": "compute"}) == 0
    assert value("vllm:kvtier_hit_decisions_total", redis | {"decision": "load"}) == 2
    assert value("vllm:kvtier_hit_decisions_total", redis | {"decision": "compute"}) == 5
    fields = KVTierConnectorStats(data=payload).reduce()
    assert fields["redis_declined_chunks"] == 5 and fields["redis_hit_rate"] == round(2 / 7, 3)
    assert "redis hit 2/7 chunks (29%)" in stats.log_line()
    assert "computed instead 5" in stats.log_line()


@pytest.mark.parametrize(
    ("loaded", "external", "expected"),
    [
        ({"cpu": 64, "disk": 32}, 96, {CacheHitSource.HOST: 64, CacheHitSource.DISK: 32}),
        ({"disk": 96}, 96, {CacheHitSource.DISK: 96}),
        ({}, 0, {}),
        ({}, 32, {CacheHitSource.EXTERNAL_UNSPECIFIED: 32}),  # kvtier knows of no load
        ({"cpu": 64}, 96, {CacheHitSource.HOST: 64, CacheHitSource.EXTERNAL_UNSPECIFIED: 32}),
        ({"cpu": 64, "disk": 64}, 96, {CacheHitSource.HOST: 64, CacheHitSource.DISK: 32}),
        (
            {"peer": 10, "redis": 6},
            16,
            {CacheHitSource.P2P: 10, CacheHitSource.EXTERNAL_UNSPECIFIED: 6},
        ),
    ],
)
def test_hit_sources_always_sum_to_the_engines_external_tokens(
    loaded: dict[str, int], external: int, expected: dict[CacheHitSource, int]
) -> None:
    sources = hit_sources(loaded, external)
    assert sources == expected
    assert sum(sources.values()) == external


def test_kvtier_logs_through_vllms_handlers_only_when_logging_is_unconfigured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours, root, theirs = logging.getLogger("kvtier"), logging.getLogger(), logging.getLogger("vllm")
    handler = logging.StreamHandler()
    monkeypatch.setattr(theirs, "handlers", [handler])
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "level", logging.NOTSET)
    assert route_to_vllm_logging() is False  # pytest configured the root logger
    monkeypatch.setattr(root, "handlers", [])
    assert route_to_vllm_logging() is True
    assert ours.handlers == [handler] and ours.level == theirs.level
    assert route_to_vllm_logging() is False  # once
    assert ours.handlers == [handler]

"""kvtier's counters as vLLM's stats pipeline carries them: one payload per engine step.

vLLM's scheduler asks the connector for stats after every step and sends them to its stat
loggers: the log line (``KV Transfer metrics: ...``) sums the payloads of one logging interval,
and the Prometheus logger adds each payload to its counters. So a payload holds *changes*, never
running totals:

    counters      increments since the last payload (per tier: ``TierStats`` fields)
    used_bytes    gauges: bytes each tier holds now (only when changed)
    load_seconds, store_seconds   durations of the jobs finished since (histograms)

    StatsInterval.take(...) -> payload | None     the changes since the last take
    merge(a, b)             -> payload            ``a`` then ``b`` (sum, newest gauge, concat)
    summary(payload)        -> {name: number}     the log line's fields

A payload is a plain dict of str keys, numbers and lists (vLLM serializes it between processes).
"""

from __future__ import annotations

from typing import Any

from kvtier.counters import TIER_COUNTERS, JobSeconds, KVTierStats

Payload = dict[str, Any]
ENGINE_COUNTERS = ("lookups", "preemptions")
SAMPLES = ("load_seconds", "store_seconds")
LOOKED_UP = ("hit_chunks", "miss_chunks", "declined_chunks")  # a hit rate's denominator


class StatsInterval:
    """Remembers what the payloads so far covered, so the next one holds only what changed.

    A counter's increment is its rise above the highest value already sent: the payloads of a
    counter add up to its running total, and never to more, even if a total was ever lowered.
    """

    def __init__(self) -> None:
        self._sent: dict[str, float] = {}  # "lookups", "cpu.hit_chunks", ... -> highest sent
        self._used: dict[str, int] = {}

    def take(
        self, stats: KVTierStats, seconds: JobSeconds, used_bytes: dict[str, int], chunk_tokens: int
    ) -> Payload | None:
        """The changes since the last call, or None when nothing changed."""
        payload: Payload = {"chunk_tokens": chunk_tokens}
        for name in ENGINE_COUNTERS:
            if rise := self._rise(name, getattr(stats, name)):
                payload[name] = rise
        tiers = {}
        for tier, now in stats.tiers.items():
            rises = {
                name: self._rise(f"{tier}.{name}", getattr(now, name)) for name in TIER_COUNTERS
            }
            if rises := {name: value for name, value in rises.items() if value}:
                tiers[tier] = rises
        if tiers:
            payload["tiers"] = tiers
        used = {tier: n for tier, n in used_bytes.items() if self._used.get(tier) != n}
        if used:
            payload["used_bytes"] = used
            self._used.update(used)
        if seconds.loads:
            payload["load_seconds"] = seconds.loads
        if seconds.stores:
            payload["store_seconds"] = seconds.stores
        return payload if len(payload) > 1 else None

    def _rise(self, key: str, value: float) -> float:
        sent = self._sent.get(key, 0)
        if value <= sent:
            return 0
        self._sent[key] = value
        return value - sent


def merge(first: Payload, then: Payload) -> Payload:
    """One payload covering ``first`` and then ``then`` (neither is changed)."""
    out: Payload = {"chunk_tokens": then.get("chunk_tokens", first.get("chunk_tokens", 0))}
    for name in ENGINE_COUNTERS:
        if total := first.get(name, 0) + then.get(name, 0):
            out[name] = total
    tiers: dict[str, dict[str, float]] = {}
    for part in (first, then):
        for tier, changes in part.get("tiers", {}).items():
            merged = tiers.setdefault(tier, {})
            for name, value in changes.items():
                merged[name] = merged.get(name, 0) + value
    if tiers:
        out["tiers"] = tiers
    if used := {**first.get("used_bytes", {}), **then.get("used_bytes", {})}:
        out["used_bytes"] = used
    for key in SAMPLES:
        samples: dict[str, list[float]] = {}
        for part in (first, then):
            for tier, values in part.get(key, {}).items():
                samples.setdefault(tier, []).extend(values)
        if samples:
            out[key] = samples
    return out


def summary(payload: Payload) -> dict[str, int | float]:
    """The log line's fields: per tier its non-zero counters (bytes in MiB, seconds in ms), its
    hit rate when looked up, and the bytes it holds."""
    out: dict[str, int | float] = {n: payload[n] for n in ENGINE_COUNTERS if n in payload}
    tiers = payload.get("tiers", {})
    used = payload.get("used_bytes", {})
    for tier in dict.fromkeys([*tiers, *used]):
        changes = tiers.get(tier, {})
        looked = sum(changes.get(name, 0) for name in LOOKED_UP)
        if looked:
            out[f"{tier}_hit_rate"] = round(changes.get("hit_chunks", 0) / looked, 3)
        for name, value in changes.items():
            if name.endswith("_bytes"):
                out[f"{tier}_{name.removesuffix('_bytes')}_MiB"] = round(value / 2**20, 1)
            elif name.endswith("_seconds"):
                out[f"{tier}_{name.removesuffix('_seconds')}_ms"] = round(value * 1e3, 1)
            else:
                out[f"{tier}_{name}"] = value
        if tier in used:
            out[f"{tier}_used_MiB"] = round(used[tier] / 2**20, 1)
    return out

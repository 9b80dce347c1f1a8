"""Counters of what kvtier did, per tier: read by tests, the demo, logs and vLLM's stats.

KVTierStats   running totals since the engine started, per tier (``TierStats``)
JobSeconds    durations of the jobs finished since the last ``take`` (latency histograms)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

MAX_SAMPLES = 4096  # job durations kept per (tier, direction) between two takes
LOST_CAUSES = ("evicted_dirty", "no_room", "tier_down", "write_error", "reset")  # lost_*


@dataclass
class TierStats:
    hit_chunks: int = 0  # chunks a lookup found ready (and the engine then loaded)
    miss_chunks: int = 0  # chunks looked up and not found
    # chunks a lookup found that the engine computed instead: loading them was predicted
    # slower than computing them (``scheduler/hit_benefit.py``); neither hits nor misses
    declined_chunks: int = 0
    failed_lookups: int = 0  # lookups that got no answer (timed out, store down): misses
    loaded_chunks: int = 0
    loaded_bytes: int = 0  # summed over ranks
    load_seconds: float = 0.0  # slowest rank per job, summed over jobs
    failed_loads: int = 0  # load jobs that failed on a rank: the engine recomputes
    stored_chunks: int = 0
    stored_bytes: int = 0
    store_seconds: float = 0.0
    failed_stores: int = 0
    skipped_stores: int = 0  # chunks not stored: no room (everything pinned or in flight)
    evicted_chunks: int = 0
    bad_chunks: int = 0  # copies that failed a check on load (dropped; the engine recomputed)
    untrusted_stores: int = 0  # chunks not stored: computed from a failed synchronous load
    # chunks bound for this tier (below host memory) that never reached it, by cause:
    lost_evicted_dirty: int = 0  # left host memory unwritten, no room to copy it aside (too
    # many writes queued)
    lost_no_room: int = 0  # left host memory unwritten; the tier had no room (its budget pinned)
    lost_tier_down: int = 0  # left host memory unwritten, or its write failed, the tier down
    lost_write_error: int = 0  # its write failed (an I/O error, Redis refused it): not retried
    lost_reset: int = 0  # dropped from host memory unwritten by a reset of the connector

    @property
    def lost(self) -> dict[str, int]:
        """Chunks lost on their way to this tier, by cause (``evicted_dirty``, ``no_room``,
        ``tier_down``, ``write_error``, ``reset``); causes with none left out."""
        return {name: getattr(self, f"lost_{name}") for name in LOST_CAUSES
                if getattr(self, f"lost_{name}")}  # fmt: skip

    def lose(self, cause: str, count: int) -> None:
        """Count ``count`` chunks lost on their way to this tier, for ``cause`` (LOST_CAUSES)."""
        if cause not in LOST_CAUSES:
            raise ValueError(f"kvtier: unknown loss cause {cause!r} (known: {LOST_CAUSES})")
        name = f"lost_{cause}"
        setattr(self, name, getattr(self, name) + count)


@dataclass
class KVTierStats:
    """Totals since the engine started. ``tiers`` maps a tier name ("cpu") to its counters."""

    lookups: int = 0  # requests looked up
    preemptions: int = 0  # requests the engine preempted (their pending stores were flushed)
    tiers: dict[str, TierStats] = field(default_factory=lambda: {"cpu": TierStats()})

    @property
    def cpu(self) -> TierStats:
        return self.tiers["cpu"]

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def log_line(self) -> str:
        return "kvtier: " + "; ".join(_tier_line(name, tier) for name, tier in self.tiers.items())


def _tier_line(name: str, tier: TierStats) -> str:
    looked = tier.hit_chunks + tier.miss_chunks + tier.declined_chunks
    rate = tier.hit_chunks / looked if looked else 0.0
    bad = f", computed instead {tier.declined_chunks}" if tier.declined_chunks else ""
    bad += f", bad chunks {tier.bad_chunks}" if tier.bad_chunks else ""
    bad += f", failed lookups {tier.failed_lookups}" if tier.failed_lookups else ""
    if lost := tier.lost:
        causes = ", ".join(f"{cause} {count}" for cause, count in lost.items())
        bad += f", lost {sum(lost.values())} ({causes})"
    return (
        f"{name} hit {tier.hit_chunks}/{looked} chunks ({rate:.0%}), "
        f"loaded {tier.loaded_bytes / 2**20:.1f} MiB in {tier.load_seconds:.3f} s, "
        f"stored {tier.stored_chunks} chunks ({tier.stored_bytes / 2**20:.1f} MiB), "
        f"evicted {tier.evicted_chunks}, failed loads {tier.failed_loads}{bad}, "
        f"failed stores {tier.failed_stores}, skipped stores {tier.skipped_stores}"
    )


TIER_COUNTERS = tuple(f.name for f in fields(TierStats))


@dataclass
class JobSeconds:
    """How long each finished job took (its slowest rank), per tier, until ``take``.

    Only the last ``limit`` durations of a (tier, direction) are kept, so nothing grows without
    bound when no one takes them.
    """

    limit: int = MAX_SAMPLES
    loads: dict[str, list[float]] = field(default_factory=dict)
    stores: dict[str, list[float]] = field(default_factory=dict)

    def add(self, tier: str, seconds: float, load: bool) -> None:
        samples = (self.loads if load else self.stores).setdefault(tier, [])
        samples.append(seconds)
        if len(samples) > self.limit:
            del samples[: len(samples) - self.limit]

    def take(self) -> JobSeconds:
        """The durations since the last call; this object starts empty again."""
        taken = JobSeconds(self.limit, self.loads, self.stores)
        self.loads, self.stores = {}, {}
        return taken

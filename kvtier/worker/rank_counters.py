"""``RankCounters``: what one worker rank moved, readable from each worker (proof that every
rank took part: ``kvtier.vllm.access.rank_counters``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RankCounters:
    loads: int = 0
    failed_loads: int = 0
    loaded_bytes: int = 0
    stores: int = 0
    failed_stores: int = 0
    stored_bytes: int = 0
    bad_chunks: int = 0  # tier chunks that failed a check or could not be read: recomputed
    tier_writes: int = 0  # chunks written to the chain's tiers
    tier_write_errors: int = 0  # chunks whose write failed (no room, the tier down, ...)
    # per tier of the chain: host chunks written at shutdown, and those it may still lack (not
    # written: the deadline, no room, the tier down; or not checked before the deadline)
    shutdown_written: dict[str, int] = field(default_factory=dict)
    shutdown_unwritten: dict[str, int] = field(default_factory=dict)

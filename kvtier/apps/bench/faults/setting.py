"""A fault campaign's settings and what one case went through.

Setting(tier, host, reads, ranks)   one engine's configuration under test
Case                                a fault, then passes over the prompts: what they served
CHUNK, HOST, READS, TIERS           the chunk, the host tier sizes, the read modes, the tiers
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtier.apps.bench.faults.tiers import Fault
from kvtier.counters import LOST_CAUSES

CHUNK = 64  # tokens per chunk: two engine blocks of 32
HOST = {"tiny": 4, "roomy": 4096}  # host tier sizes, in chunks
READS = {"sync": 100_000, "async": 1, "default": 256}  # min_async_load_tokens
TIERS = ("disk", "redis", "host")
DRAIN_S = 15.0  # the longest a pass waits for the tiers' writes to land after it
# no fault stalls Redis (one killed refuses connections at once): a timeout is only a round trip
# slowed by a loaded machine, and it would open the circuit breaker and make the healed passes'
# loads misses
REDIS_TIMEOUT_S = 5.0
COUNTED = ("failed_lookups", "failed_loads", "bad_chunks", "failed_stores", "skipped_stores",
           "declined_chunks", *(f"lost_{cause}" for cause in LOST_CAUSES))  # fmt: skip


@dataclass(frozen=True)
class Setting:
    tier: str  # disk | redis | host (no tier below host memory)
    host: str = "roomy"  # tiny | roomy
    reads: str = "default"  # sync | async | default
    ranks: int = 1  # tensor-parallel ranks

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("tier", self.tier, TIERS),
            ("host", self.host, tuple(HOST)),
            ("reads", self.reads, tuple(READS)),
            ("ranks", self.ranks, (1, 2)),
        ):
            if value not in allowed:
                raise ValueError(f"fault campaign: {name} must be one of {allowed}, got {value!r}")

    def __str__(self) -> str:
        return f"{self.tier}/{self.host}/{self.reads}/tp{self.ranks}"


@dataclass
class Case:
    setting: Setting
    fault: Fault | None  # None: passes over a tier damaged before
    damaged: int  # records the fault damaged (or lost)
    # each pass's share of chunks served, or found and computed instead (``declined_chunks``)
    passes: list[float] = field(default_factory=list)
    wrong: int = 0  # outputs that differ from the engine without kvtier
    outputs: int = 0  # outputs compared
    seconds: float = 0.0
    # what the engine's counters ("tier.counter": misses that failed, chunks lost on their way
    # to a tier, ...) rose by over the case: why a pass was served less, when one is
    counters: dict[str, int] = field(default_factory=dict)

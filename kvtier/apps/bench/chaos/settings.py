"""What one ``kvtier bench chaos`` run does: the fleet, the load, the faults' timing.

    ChaosSettings(...)            frozen; ``ValueError`` naming the setting that is out of range
    ChaosSettings.quick(...)      the short form: every fault kind once, short gaps and holds
    .duration_s, .warmup_s        the load's length; memory growth is measured after warm-up

Defaults are the full run's (issue 39's acceptance: 30 minutes, two engines on a 2-core machine).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

WARMUP_S = 300.0  # memory growth counts after the first 5 minutes (or a short run's first quarter)


@dataclass(frozen=True)
class ChaosSettings:
    engines: int = 2  # kv_both engines behind the fleet proxy
    minutes: float = 30.0  # of load
    seed: int = 0  # the faults' times, kinds and targets; the workload's choices
    rate: float = 1.0  # requests sent per second (open loop)
    in_flight: int = 4  # at most this many requests unanswered; a send waits for a slot
    model: str = "tiny"  # a local model's name or directory
    pd: bool = True  # a prefill→decode pair behind a second proxy, a share of the load
    max_tokens: int = 16  # per answer, greedy, EOS ignored
    timeout_s: float = 60.0  # per request, from its first send to its last byte
    stream_share: float = 0.5  # of the requests, streamed
    pd_share: float = 0.25  # of the requests, sent to the prefill→decode proxy (with ``pd``)
    gap_s: tuple[float, float] = (60.0, 120.0)  # the quiet gap before each fault (uniform)
    engine_stop_s: tuple[float, float] = (5.0, 20.0)  # an engine SIGSTOPped this long
    redis_stop_s: tuple[float, float] = (2.0, 5.0)  # Redis SIGSTOPped this long
    after_s: float = 60.0  # after a fault's end: its "after" phase, its share's recovery bound
    every_kind_once: bool = False  # the short form: each kind once, in a seeded order
    sample_s: float = 5.0  # between memory samples

    def __post_init__(self) -> None:
        for name in ("engines", "in_flight", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"kvtier bench chaos: {name} must be >= 1, got "
                                 f"{getattr(self, name)}")  # fmt: skip
        for name in ("minutes", "rate", "timeout_s", "after_s", "sample_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"kvtier bench chaos: {name} must be > 0, got "
                                 f"{getattr(self, name)}")  # fmt: skip
        for name in ("stream_share", "pd_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"kvtier bench chaos: {name} must be in [0, 1], got "
                                 f"{getattr(self, name)}")  # fmt: skip
        for name in ("gap_s", "engine_stop_s", "redis_stop_s"):
            low, high = getattr(self, name)
            if not 0.0 <= low <= high:
                raise ValueError(f"kvtier bench chaos: {name} must be (low, high) with "
                                 f"0 <= low <= high, got {(low, high)}")  # fmt: skip

    @classmethod
    def quick(cls, **overrides: Any) -> ChaosSettings:
        """The short form (``--quick``, the engine test's): each fault kind once."""
        short = cls(minutes=2.0, rate=2.0, max_tokens=8, timeout_s=60.0, gap_s=(4.0, 8.0),
                    engine_stop_s=(5.0, 6.0), redis_stop_s=(2.0, 3.0), after_s=20.0,
                    every_kind_once=True, sample_s=2.0)  # fmt: skip
        known = {f.name for f in fields(cls)}
        return replace(short, **{k: v for k, v in overrides.items() if k in known})

    @property
    def duration_s(self) -> float:
        return self.minutes * 60.0

    @property
    def warmup_s(self) -> float:
        return min(WARMUP_S, self.duration_s / 4)

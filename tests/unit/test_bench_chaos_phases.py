"""``kvtier bench chaos``'s phases, on synthetic requests: steady, during a fault, after it; TTFT
per phase; kvtier's served share and how long after a fault it came back."""

from __future__ import annotations

from typing import Any

from kvtier.apps.bench.chaos.client import Record
from kvtier.apps.bench.chaos.faults import FaultEvent
from kvtier.apps.bench.chaos.phases import (
    percentile,
    phase,
    recovery,
    served_share,
    tier_tokens,
    ttft_by_phase,
)

KILL = FaultEvent("engine-kill", "engine-0", "http://127.0.0.1:1", start_s=100.0, end_s=130.0)
STALL = FaultEvent("redis-stop", "redis", "", start_s=200.0, end_s=203.0)


def _record(start: float, ttft: float = 0.1, status: str = "ok", **more: Any) -> Record:
    return Record(0, "chat", "fleet", False, 100, start, start + ttft, ttft, status, **more)


def _served(start: float, tiers: int, prompt: int = 100) -> Record:
    provenance = {"prompt_tokens": prompt, "engine_cached_tokens": 0, "cpu": tiers, "redis": 0,
                  "failed_tokens": 0, "computed": prompt - tiers, "load_ms": 1.0}  # fmt: skip
    return _record(start, provenance=provenance)


def test_a_request_is_during_a_fault_after_it_within_the_window_else_steady() -> None:
    events = [KILL, STALL]
    assert phase(50.0, events, 60.0) == ("steady", None)
    assert phase(100.0, events, 60.0) == ("during", "engine-kill")
    assert phase(130.0, events, 60.0) == ("during", "engine-kill")
    assert phase(131.0, events, 60.0) == ("after", "engine-kill")
    assert phase(190.0, events, 60.0) == ("after", "engine-kill")
    assert phase(191.0, events, 60.0) == ("steady", None)
    assert phase(201.0, events, 60.0) == ("during", "redis-stop")
    assert phase(204.0, events, 60.0) == ("after", "redis-stop")  # the latest fault's


def test_the_after_phase_is_the_latest_faults_when_windows_overlap() -> None:
    assert phase(210.0, [KILL, STALL], 100.0) == ("after", "redis-stop")


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0 and percentile(values, 0.99) == 99.0
    assert percentile([3.0], 0.99) == 3.0 and percentile([], 0.5) is None


def test_ttft_per_phase_counts_only_answers_by_their_start() -> None:
    records = [_record(10.0, 0.1), _record(20.0, 0.3), _record(110.0, 2.0), _record(150.0, 0.5),
               _record(115.0, 9.0, status="broken"), _record(201.0, 1.0)]  # fmt: skip
    found = ttft_by_phase(records, [KILL, STALL], 60.0)
    assert found["steady"] == {"count": 2, "p50_s": 0.1, "p99_s": 0.3}
    assert found["during"] == {"count": 2, "p50_s": 1.0, "p99_s": 2.0}
    assert found["during_by_kind"]["engine-kill"] == {"count": 1, "p50_s": 2.0, "p99_s": 2.0}
    assert found["during_by_kind"]["redis-stop"]["count"] == 1
    assert found["after_by_kind"] == {"engine-kill": {"count": 1, "p50_s": 0.5, "p99_s": 0.5}}


def test_the_served_share_counts_every_tier_and_nothing_else() -> None:
    provenance = {"prompt_tokens": 100, "engine_cached_tokens": 20, "cpu": 30, "redis": 10,
                  "peer": 5, "failed_tokens": 3, "computed": 35, "load_ms": 2.5,
                  "declined": {"cpu": 3}}  # fmt: skip
    assert tier_tokens(provenance) == 45
    records = [_served(1.0, 50), _served(2.0, 0), _record(3.0), _served(4.0, 10, prompt=0)]
    assert served_share(records) == 0.25  # 50 of 200: answers without provenance left out
    assert served_share([_record(1.0)]) is None


def test_a_faults_share_comes_back_within_the_first_window_that_reaches_steady() -> None:
    # steady 0.5; after the kill's end (130 s) the share is 0 for 20 s, then 0.5 again
    records = [_served(70.0 + t, 50) for t in range(0, 30, 2)]
    records += [_served(130.0 + t, 0) for t in range(0, 20, 2)]
    records += [_served(150.0 + t, 50) for t in range(0, 40, 2)]
    [found] = recovery(records, [KILL], steady=0.5, after_s=60.0)
    assert found["share_before"] == 0.5
    assert found["share_after"] == round(20 * 50 / (30 * 100), 4)
    # windows of 15 s sliding by 7.5 s: [15, 30) still holds two misses (a share of 0.36);
    # [22.5, 37.5) is the first all at 0.5
    assert found["recovered_s"] == 37.5


def test_a_share_that_never_comes_back_within_the_window_says_none() -> None:
    records = [_served(130.0 + t, 0) for t in range(0, 60, 2)]
    assert recovery(records, [KILL], steady=0.5, after_s=60.0)[0]["recovered_s"] is None
    assert recovery(records, [KILL], steady=None, after_s=60.0)[0]["recovered_s"] == 0.0

"""Which engine of a side takes the next request: least in flight, ties in turn, down skipped."""

from __future__ import annotations

import httpx

from kvtier.apps.proxy.balancer import Engine, Pool


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _pool(clock: Clock, *names: str) -> Pool:
    return Pool("decode", [Engine(name, httpx.AsyncClient()) for name in names], 2.0, clock)


def _urls(pool: Pool, count: int) -> list[str]:
    """The engines of ``count`` requests acquired one after the other, all still in flight."""
    return [engine.url for engine in (pool.acquire() for _ in range(count)) if engine is not None]


def test_ties_go_round_robin() -> None:
    pool = _pool(Clock(), "a", "b", "c")
    assert _urls(pool, 7) == ["a", "b", "c", "a", "b", "c", "a"]
    assert [engine.in_flight for engine in pool.engines] == [3, 2, 2]


def test_the_engine_with_fewest_in_flight_wins() -> None:
    pool = _pool(Clock(), "a", "b", "c")
    assert _urls(pool, 3) == ["a", "b", "c"]
    pool.release(pool.engines[1])
    assert _urls(pool, 2) == ["b", "c"]  # b had 0; then all have 1: c, the next in turn


def test_tried_engines_are_skipped() -> None:
    pool = _pool(Clock(), "a", "b")
    assert [e.url for e in [pool.acquire({"a"})] if e is not None] == ["b"]
    assert pool.acquire({"a", "b"}) is None


def test_a_down_engine_is_skipped_until_its_backoff_ends() -> None:
    clock = Clock()
    pool = _pool(clock, "a", "b")
    pool.mark_down(pool.engines[0], "connection refused")
    assert _urls(pool, 2) == ["b", "b"]
    assert pool.down_reasons() == {"a": "connection refused"} and pool.any_up()
    clock.now += 2.0
    assert _urls(pool, 1) == ["a"] and pool.down_reasons() == {}


def test_none_is_up_when_every_engine_is_down() -> None:
    pool = _pool(Clock(), "a", "b")
    for engine in pool.engines:
        pool.mark_down(engine, "connect timed out")
    assert pool.acquire() is None and not pool.any_up()
    assert pool.down_reasons() == {"a": "connect timed out", "b": "connect timed out"}


def test_an_engine_whose_health_failed_is_skipped_until_a_probe_passes() -> None:
    clock = Clock()
    pool = _pool(clock, "a", "b")
    a = pool.engines[0]
    assert pool.set_health(a, "HTTP 503") and not pool.set_health(a, "connection refused")
    clock.now += 1000.0  # no backoff to end: only a probe brings it back
    assert _urls(pool, 2) == ["b", "b"] and not pool.is_up(a)
    assert pool.down_reasons() == {"a": "connection refused"}
    assert pool.set_health(a, "") and not pool.set_health(a, "")
    assert _urls(pool, 1) == ["a"] and pool.is_up(a) and pool.down_reasons() == {}
    assert pool.named("b") is pool.engines[1]

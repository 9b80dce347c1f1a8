"""TierWrites to a real Redis (a server of the test's own): the Redis index as the connector
builds it (the Redis spec's ``scheduler`` builder: its store, circuit breaker and lookup
thread), a host tier of 8 chunks, one worker rank played by the test (it SETs the records a
write job names), and a clock the test moves for ``RETRY_S`` and ``VERIFY_S``. Redis flushed,
evicting, killed and restarted under it: nothing the host tier holds stays out of Redis for
good."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis

from kvtier.counters import TierStats
from kvtier.keys import ChunkKey, LayoutFingerprint, make_key
from kvtier.scheduler import tier_writes
from kvtier.scheduler.job_table import JobTable
from kvtier.scheduler.tier_writes import TierWrites
from kvtier.step_plan import JobOutcome, TierWriteJob
from kvtier.tiers.base.spec import SchedulerContext
from kvtier.tiers.host.index import ChunkManager
from kvtier.tiers.redis import SPEC as REDIS
from kvtier.tiers.redis.config import RedisConfig
from kvtier.tiers.redis.index import RedisIndex
from kvtier.tiers.redis.keys import redis_key

FP = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 4).digest()
WAIT_S = 5.0  # bound on every wait for the lookup thread or a restarted server


def key(i: int) -> ChunkKey:
    return make_key(FP, i, 0)


class Rig:
    def __init__(self, server: Any, max_in_flight: int = 64) -> None:
        self.server = server
        self.prefix = f"tw{time.monotonic_ns()}"
        config = RedisConfig(server.url, timeout_s=0.5, prefix=self.prefix,
                             max_queued_chunks=max_in_flight)  # fmt: skip
        assert REDIS.scheduler is not None
        index = REDIS.scheduler(SchedulerContext(config, 1, FP, 1024))
        assert isinstance(index, RedisIndex)
        self.index = index
        self.host = ChunkManager(8)
        self.jobs = JobTable(1)
        self.stats = TierStats()
        self.now = 0.0
        self.writes = TierWrites(self.index, self.host, self.jobs, self.stats, lambda: self.now)
        self.in_flight: list[TierWriteJob] = []

    def client(self) -> redis.Redis:
        return self.server.client()  # type: ignore[no-any-return]

    def name(self, k: ChunkKey) -> bytes:
        return redis_key(self.prefix, k, 0)

    def store(self, keys: Sequence[ChunkKey]) -> None:
        plan = self.host.place(keys)
        assert plan is not None
        self.writes.evicted(list(zip(plan.evicted, plan.evicted_slots)))  # type: ignore[arg-type]
        self.host.complete_store(dict.fromkeys(plan.keys, 0))
        self.writes.stored(plan.keys)  # type: ignore[arg-type]

    def step(self) -> list[TierWriteJob]:
        """One engine step: the writes it plans (also kept in ``in_flight``)."""
        self.writes.flush(idle=False)
        plan = self.writes.take_plan()
        self.in_flight += plan
        return plan

    def finish(self, up: bool = True) -> None:
        """The worker ran every write in flight: SET them (``up``), or found Redis down."""
        jobs, self.in_flight = self.in_flight, []
        for job in jobs:
            if up:
                for k in job.dst.keys:
                    self.client().set(self.name(k), b"record")
            failed = [] if up else list(range(len(job.dst.keys)))
            outcome = JobOutcome(1, int(not up), 10 * len(job.dst.keys) * up, 0.001, failed)
            done = self.jobs.report(job.job_id, outcome)
            assert done is not None
            self.writes.complete(done)

    def held(self, keys: Sequence[ChunkKey]) -> list[bool]:
        return [bool(self.client().exists(self.name(k))) for k in keys]

    def until(self, done: Callable[[], bool], what: str, tick: float = 0.0) -> None:
        """Step (moving the clock ``tick`` each time) until ``done()``, at most WAIT_S."""
        deadline = time.monotonic() + WAIT_S
        while not done():
            assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
            self.now += tick
            self.step()
            time.sleep(0.002)  # the lookup thread answers meanwhile

    def written(self, keys: Sequence[ChunkKey], max_in_flight: int) -> None:
        """Step and finish writes until every one of ``keys`` is in Redis, never more than
        ``max_in_flight`` chunks written at once."""

        def all_there() -> bool:
            assert sum(len(job.dst.keys) for job in self.in_flight) <= max_in_flight
            self.finish()
            return all(self.held(keys))

        self.until(all_there, "chunks written again")


def test_chunks_a_flushed_redis_lost_are_written_again_paced(fresh_redis: Any) -> None:
    rig = Rig(fresh_redis, max_in_flight=2)
    keys = [key(i) for i in range(6)]
    rig.store(keys)
    rig.written(keys, max_in_flight=2)
    assert rig.step() == []  # all clean

    rig.client().flushall()
    rig.now += tier_writes.VERIFY_S  # the next sample finds them gone

    rig.written(keys, max_in_flight=2)
    assert rig.stats.lost == {} and rig.stats.stored_chunks == 12


def test_one_chunk_found_gone_sweeps_every_clean_chunk(
    fresh_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis evicted two records (maxmemory): the sample finds the first; the sweep it starts
    finds the other at once, not a rotation of samples later."""
    monkeypatch.setattr(tier_writes, "VERIFY_SAMPLE", 2)
    rig = Rig(fresh_redis)
    keys = [key(i) for i in range(8)]
    rig.store(keys)
    rig.written(keys, max_in_flight=64)
    rig.client().delete(rig.name(keys[0]), rig.name(keys[6]))

    rig.now += tier_writes.VERIFY_S  # samples keys[0:2] (the least recently verified)
    rig.written(keys, max_in_flight=64)  # the clock stays: no second sample

    assert rig.stats.stored_chunks == 10  # the two lost ones only


def test_writes_wait_for_a_dead_redis_and_go_when_it_is_back(fresh_redis: Any) -> None:
    """Killed: the chunks the host tier holds stay dirty, backing off, whatever the attempts;
    one evicted meanwhile is lost, counted; restarted (empty): every chunk held goes to Redis."""
    rig = Rig(fresh_redis)
    rig.store([key(1), key(2)])
    fresh_redis.kill()
    for _ in range(tier_writes.MAX_ATTEMPTS + 1):
        (job,) = rig.step()
        rig.finish(up=False)  # the worker found Redis down
        rig.now += tier_writes.MAX_RETRY_S
    assert rig.stats.lost == {} and rig.writes.num_dirty == 2  # kept, to retry

    rig.store([key(3), key(4), key(5), key(6), key(7), key(8), key(9)])  # evicts key(1), dirty
    rig.step()
    rig.finish(up=False)  # its staged copy, and the others, found Redis down

    assert sum(rig.stats.lost.values()) == 1  # key(1), as tier_down or write_error: whether
    assert set(rig.stats.lost) <= {"tier_down", "write_error"}  # the scheduler saw it down
    fresh_redis.restart()
    rig.now += tier_writes.MAX_RETRY_S
    rig.written([key(i) for i in range(2, 10)], max_in_flight=64)
    assert sum(rig.stats.lost.values()) == 1

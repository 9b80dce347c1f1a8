"""The scheduler half with the tier chain disk → Redis, against a real Redis: 4-token blocks,
byte-string block hashes; the test writes every rank's key of a chunk as the workers would (the
scheduler only asks which keys exist)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import redis

from kvtier.addresses import TierChunks
from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKey, ChunkKeyMaker, LayoutFingerprint
from kvtier.scheduler.connector import GroupSpec, ScheduledRequest, SchedulerConnector
from kvtier.step_plan import JobOutcome, WorkerReport
from kvtier.tiers.disk.config import DiskConfig
from kvtier.tiers.disk.index import DiskIndex
from kvtier.tiers.disk.names import chunk_path
from kvtier.tiers.redis.index import RedisIndex
from kvtier.tiers.redis.keys import redis_key

FINGERPRINT = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 4)
FILE = 100
HASHES = [f"h{i}".encode() for i in range(8)]  # eight full blocks: 32 tokens
WAIT_S = 5.0


class Rig:
    """A connector whose chain is [disk, redis] (or [redis]), and the Redis it asks."""

    def __init__(
        self,
        url: str,
        root: Path | None,
        ranks: int = 1,
        wait_s: float = 0.0,
        groups: Sequence[GroupSpec] = (GroupSpec(4),),
        answered: Callable[[Sequence[ChunkKey]], object] = lambda keys: None,
        min_async_load_tokens: int = 1,
    ) -> None:
        """``answered(keys)`` runs on the lookup thread before Redis is asked about ``keys``
        (a test holds the answer back by blocking there)."""
        self.client = redis.Redis.from_url(url)
        self.prefix = f"t{time.monotonic_ns()}"
        self.ranks = ranks

        def exists(keys: Sequence[ChunkKey]) -> list[bool]:
            answered(keys)
            names = [redis_key(self.prefix, k, r) for k in keys for r in range(ranks)]
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.exists(name)
            found = pipe.execute()
            return [all(found[i * ranks : (i + 1) * ranks]) for i in range(len(keys))]

        self.index = RedisIndex(exists, timeout_s=1.0, max_in_flight=64, lookup_wait_s=wait_s)
        disk_config = DiskConfig(str(root), 64 * FILE * ranks) if root is not None else None
        config = KVTierConfig(
            cpu_bytes_to_use=1,
            min_async_load_tokens=min_async_load_tokens,
            sections={"disk": disk_config},
        )
        self.root = root
        disk = None
        if root is not None:
            disk = DiskIndex(root, 64 * FILE * ranks, ranks, FINGERPRINT.digest(), FILE * ranks)
        self.connector = SchedulerConnector(
            config, list(groups), 8, ranks, ChunkKeyMaker(FINGERPRINT, 1),
            lower=[*([disk] if disk is not None else []), self.index],
        )  # fmt: skip

    def keys(self, hashes: Sequence[bytes], group: int = 0) -> list[ChunkKey]:
        return self.connector.keys.keys(hashes, group)

    def in_redis(self, keys: Iterable[ChunkKey], ranks: Iterable[int] | None = None) -> None:
        for key in keys:
            for rank in range(self.ranks) if ranks is None else ranks:
                self.client.set(redis_key(self.prefix, key, rank), b"record")

    def on_disk(self, keys: Iterable[ChunkKey]) -> None:
        assert self.root is not None
        for key in keys:
            for rank in range(self.ranks):
                path = chunk_path(self.root, key, rank)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(bytes(FILE))

    def lookup(self, req: str, hashes: Sequence[bytes], tokens: int) -> int | None:
        """Ask until the answer is not "pending" (bounded)."""
        deadline = time.monotonic() + WAIT_S
        while (answer := self.connector.lookup(req, hashes, 0, tokens)) is None:
            assert time.monotonic() < deadline, "a Redis lookup stayed pending"
            time.sleep(0.001)
        return answer


def test_a_hit_is_one_run_across_disk_and_redis(tmp_path: Path, store_server: Any) -> None:
    rig = Rig(store_server.url, tmp_path / "disk")
    keys = rig.keys(HASHES)
    rig.on_disk(keys[:2])
    rig.in_redis(keys[:6])  # the disk's two, then four more
    assert rig.lookup("a", HASHES, 33) == 24
    rig.connector.on_alloc("a", [list(range(10, 19))], 24)
    plan = rig.connector.build_plan([])
    disk, remote = plan.loads
    assert isinstance(disk.src, TierChunks) and disk.src.tier == "disk"
    assert disk.src.keys == tuple(keys[:2]) and disk.dst.block_ids.tolist() == [10, 11]
    assert (
        isinstance(remote.src, TierChunks)
        and remote.src.tier == "redis"
        and remote.src.keys == tuple(keys[2:6])
    )
    assert remote.dst.block_ids.tolist() == [12, 13, 14, 15]
    assert not disk.sync and not remote.sync  # a Redis part: the request waits for it
    assert rig.connector.requests["a"].loaded_tokens == {"disk": 8, "redis": 16}
    stats = rig.connector.stats.tiers
    assert (stats["disk"].hit_chunks, stats["redis"].hit_chunks) == (2, 4)
    assert stats["redis"].miss_chunks == 2
    done = {disk.job_id: JobOutcome(1), remote.job_id: JobOutcome(1)}
    rig.connector.on_report(WorkerReport(done))
    assert stats["redis"].loaded_chunks == 4
    rig.connector.check_integrity()


def test_a_chunk_is_found_only_when_every_rank_wrote_it(store_server: Any) -> None:
    rig = Rig(store_server.url, None, ranks=2)
    keys = rig.keys(HASHES)
    rig.in_redis(keys[:4])
    rig.in_redis(keys[4:6], ranks=[0])  # rank 1's share is missing
    assert rig.lookup("a", HASHES, 33) == 16


def test_a_lookup_is_pending_until_redis_answered(store_server: Any) -> None:
    rig = Rig(store_server.url, None)
    rig.in_redis(rig.keys(HASHES))
    assert rig.connector.lookup("a", HASHES, 0, 33) is None  # asked; no step waited
    assert rig.lookup("a", HASHES, 33) == 32


def test_a_window_still_looked_up_is_waited_for_not_a_miss(store_server: Any) -> None:
    """A hybrid model: the full-attention group's chunks are known, the sliding window's lookup
    is still in flight (a loaded machine's slow round trip). The request asks again later; it
    once took no hit at all (every chunk a miss) instead."""
    window = GroupSpec(4, sliding_window=8)
    gate = threading.Event()
    held: list[ChunkKey] = []

    def answered(keys: Sequence[ChunkKey]) -> None:
        if set(keys) & set(held):
            assert gate.wait(WAIT_S), "the test never opened the gate"

    rig = Rig(store_server.url, None, groups=[GroupSpec(4), window], answered=answered)
    held += rig.keys(HASHES, 1)
    rig.in_redis(rig.keys(HASHES, 0))
    rig.in_redis(held)
    deadline = time.monotonic() + WAIT_S
    while set(rig.index.known()) != set(rig.keys(HASHES, 0)):  # the full group's answer
        assert rig.connector.lookup("a", HASHES, 0, 33) is None  # the window's: held back
        assert time.monotonic() < deadline, "Redis never answered about the full group"
    assert rig.connector.lookup("a", HASHES, 0, 33) is None
    gate.set()
    assert rig.lookup("a", HASHES, 33) == 32
    rig.connector.on_alloc("a", [list(range(10, 19)), list(range(20, 29))], 32)
    (load,) = rig.connector.build_plan([]).loads
    assert isinstance(load.src, TierChunks) and set(load.src.keys) >= set(rig.keys(HASHES, 0))
    assert rig.connector.stats.tiers["redis"].hit_chunks == 8


def test_a_short_redis_hit_is_not_worth_a_step(store_server: Any) -> None:
    rig = Rig(store_server.url, None, wait_s=1.0, min_async_load_tokens=64)
    rig.in_redis(rig.keys(HASHES[:2]))
    assert rig.lookup("a", HASHES, 33) == 0  # 8 tokens from Redis: computed instead


def test_a_failed_load_forgets_the_chunks_and_they_are_written_again(store_server: Any) -> None:
    rig = Rig(store_server.url, None)
    keys = rig.keys(HASHES)
    rig.in_redis(keys[:4])
    assert rig.lookup("a", HASHES, 33) == 16
    rig.connector.on_alloc("a", [list(range(10, 19))], 16)
    (load,) = rig.connector.build_plan([]).loads
    rig.connector.on_report(WorkerReport({load.job_id: JobOutcome(1, 1, bad=[1, 2])}))
    assert set(rig.index.known()) == {keys[0], keys[3]}
    assert rig.connector.stats.tiers["redis"].failed_loads == 1
    # the engine's retry computes the bad chunks: not loaded again (a loop while a worker's
    # Redis is down), though Redis still answers that they exist
    assert rig.connector.lookup("b", HASHES, 0, 33) == 4


def test_stores_reach_redis_write_through(store_server: Any) -> None:
    rig = Rig(store_server.url, None)
    connector = rig.connector
    assert rig.lookup("a", HASHES[:4], 17) == 0
    connector.on_alloc("a", [[10, 11, 12, 13, 14]], 0)
    plan = connector.build_plan([ScheduledRequest("a", [[10, 11, 12, 13, 14]], 17)])
    (store,) = plan.stores
    connector.on_report(WorkerReport({store.job_id: JobOutcome(1)}))
    (write,) = connector.build_plan([]).tier_writes  # the next step writes them to Redis
    assert isinstance(write.dst, TierChunks) and write.dst.keys == tuple(rig.keys(HASHES[:4]))
    assert not write.dst.staged
    assert connector.build_plan([]).tier_writes == []  # in flight: not again
    connector.on_report(WorkerReport({write.job_id: JobOutcome(1, bytes=400)}))
    assert rig.index.known() == rig.keys(HASHES[:4])
    assert connector.stats.tiers["redis"].stored_chunks == 4
    connector.check_integrity()


def test_a_dead_redis_is_a_miss_within_the_timeout(fresh_store_server: Any) -> None:
    rig = Rig(fresh_store_server.url, None)
    rig.in_redis(rig.keys(HASHES))
    fresh_store_server.kill()
    started = time.monotonic()
    assert rig.lookup("a", HASHES, 33) == 0
    assert time.monotonic() - started < 1.0 + 1.0
    assert rig.index.failed_lookups == 1
    rig.connector.on_alloc("a", [list(range(10, 19))], 0)
    redis_stats = rig.connector.stats.tiers["redis"]
    assert (redis_stats.failed_lookups, redis_stats.miss_chunks) == (1, 8)  # in /metrics too
    assert "redis hit 0/8 chunks" in rig.connector.stats.log_line()
    assert "failed lookups 1" in rig.connector.stats.log_line()

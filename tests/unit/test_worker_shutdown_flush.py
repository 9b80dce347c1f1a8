"""A worker rank's shutdown flush: the host chunks its disk and Redis tiers lack are written,
newest first, within the time given; what is left unwritten is counted. A real redis-server of
the test's own; one layer of 16 engine blocks (pages of 1 KiB), factor 1, a host tier of 8
chunks. The chunks reach the host tier as the engine's stores put them there."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tier_setup import disk_tier, redis_tier

from kvtier.addresses import EngineBlocks, HostChunks, TierChunks
from kvtier.keys import ChunkKey, LayoutFingerprint, make_key
from kvtier.step_plan import LoadJob, StepPlan, StoreJob
from kvtier.tiers.base.chunk_format import ChunkError
from kvtier.tiers.disk.files import DiskTier
from kvtier.tiers.redis.config import RedisConfig
from kvtier.tiers.redis.tier import RedisTier
from kvtier.worker.connector import WorkerConnector

NUM_BLOCKS, NUM_CHUNKS, PAGE = 16, 8, 1024
FINGERPRINT = LayoutFingerprint(
    model="tiny", dtype="float32", layout="", tp_rank=0, tp_size=1, pp_rank=0, chunk_tokens=16
)
KEYS = [make_key(FINGERPRINT.digest(), i, 0) for i in range(8)]


@pytest.fixture
def worker(tmp_path: Path, fresh_redis: Any) -> Iterator[WorkerConnector]:
    worker = WorkerConnector(cpu_bytes_to_use=NUM_CHUNKS * PAGE, block_size_factor=1, world_size=1)
    caches = {"layer.0": torch.randn(NUM_BLOCKS, 2, 8, 16)}  # 1 KiB per block
    redis = redis_tier(RedisConfig(fresh_redis.url, timeout_s=0.5), 0, FINGERPRINT)
    disk = disk_tier(tmp_path / "disk", 0, FINGERPRINT)
    worker.register(caches, [["layer.0"]], NUM_BLOCKS, [disk, redis])
    yield worker
    worker.shutdown(0)


def _store(worker: WorkerConnector, count: int, disk_room: int = 1 << 30) -> list[bytes]:
    """Store engine blocks 0.. into host slots 0.. under KEYS[0..]; their bytes. The stores
    finish on the worker; no step reports them (as when the engine stops right after)."""
    stores = [StoreJob(i + 1, "r", EngineBlocks(np.array([i]), (1,), (i,)),
                       HostChunks(np.array([i])), (KEYS[i],)) for i in range(count)]  # fmt: skip
    worker.begin_step(StepPlan(stores=stores, num_chunks=NUM_CHUNKS, tier_room={"disk": disk_room}))
    worker.start_stores()
    assert worker.layout is not None
    return [worker.layout.views[0][i].numpy().tobytes() for i in range(count)]


def _in_redis(tier: RedisTier, key: ChunkKey) -> bytes | None:
    out = np.zeros(PAGE, dtype=np.uint8)
    try:
        tier.read(key, [out])  # verified
    except ChunkError:
        return None
    return out.tobytes()


def _on_disk(worker: WorkerConnector, key: ChunkKey) -> bytes | None:
    assert _disk(worker) is not None
    out = np.zeros(PAGE, dtype=np.uint8)
    try:
        _disk(worker).read(key, [out])
    except OSError:
        return None
    return out.tobytes()


def test_the_chunks_each_tier_lacks_are_written_at_shutdown(worker: WorkerConnector) -> None:
    data = _store(worker, 4)
    assert _redis(worker) is not None and _disk(worker) is not None
    redis = _redis(worker)
    redis.write(KEYS[0], [np.frombuffer(data[0], np.uint8)])  # written before: not again
    _disk(worker).write(KEYS[1], [np.frombuffer(data[1], np.uint8)])

    worker.shutdown(5.0)

    assert [_in_redis(redis, k) for k in KEYS[:4]] == data
    assert [_on_disk(worker, k) for k in KEYS[:4]] == data
    counters = worker.counters
    assert counters.shutdown_written == {"disk": 3, "redis": 3}
    assert counters.shutdown_unwritten == {"disk": 0, "redis": 0}
    assert counters.shutdown_written["disk"] == 3  # the disk's, as before


def test_no_time_no_flush_and_everything_counted_unwritten(worker: WorkerConnector) -> None:
    _store(worker, 3)

    worker.shutdown(0)

    assert _redis(worker) is not None
    assert [_in_redis(_redis(worker), k) for k in KEYS[:3]] == [None] * 3
    assert worker.counters.shutdown_unwritten == {"disk": 3, "redis": 3}


def test_a_dead_redis_is_left_at_once_and_the_disk_still_gets_everything(
    worker: WorkerConnector, fresh_redis: Any
) -> None:
    data = _store(worker, 4)
    fresh_redis.kill()
    started = time.monotonic()

    worker.shutdown(5.0)

    assert time.monotonic() - started < 2.0  # one refused connection, not the deadline
    assert [_on_disk(worker, k) for k in KEYS[:4]] == data
    assert worker.counters.shutdown_written == {"disk": 4, "redis": 0}
    assert worker.counters.shutdown_unwritten["redis"] == 4


def test_the_disk_gets_the_newest_chunks_its_room_takes(worker: WorkerConnector) -> None:
    assert _disk(worker) is not None
    data = _store(worker, 4, disk_room=2 * _disk(worker).file_bytes(0))

    worker.shutdown(5.0)

    assert [_on_disk(worker, k) for k in KEYS[:4]] == [None, None, data[2], data[3]]
    assert worker.counters.shutdown_unwritten == {"disk": 2, "redis": 0}


def test_no_chunk_is_written_right_after_a_failed_load(worker: WorkerConnector) -> None:
    """A synchronous load that failed spoils its step's stores until the scheduler's ``forget``
    of them arrives: a shutdown within SUSPECT_STEPS writes no host chunk anywhere."""
    engine = EngineBlocks(np.array([9]), (1,), (0,))
    missing = LoadJob(90, "s", TierChunks("disk", (KEYS[7],)), engine, sync=True)
    worker.begin_step(StepPlan(loads=[missing], num_chunks=NUM_CHUNKS))
    worker.start_loads()  # reads before the forward: fails (no such file)
    worker.finished(set())
    worker.report()
    _store(worker, 2)
    worker.report()

    worker.shutdown(5.0)

    assert worker.counters.failed_loads == 1
    assert _redis(worker) is not None
    assert [_in_redis(_redis(worker), k) for k in KEYS[:2]] == [None, None]
    assert [_on_disk(worker, k) for k in KEYS[:2]] == [None, None]
    assert worker.counters.shutdown_written == {}


def _disk(worker: WorkerConnector) -> DiskTier:
    files = worker.tier("disk").flush
    assert isinstance(files, DiskTier)
    return files


def _redis(worker: WorkerConnector) -> RedisTier:
    records = worker.tier("redis").flush
    assert isinstance(records, RedisTier)
    return records

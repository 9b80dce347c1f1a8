"""One rank's Redis records against a real Redis, read the way the load handler reads them
(``prefetch(k[n + 4])`` before ``read(k[n])``): round trips, every kind of bad record (a miss,
deleted, the pipeline still in step), evicted records (misses), a full Redis, and a Redis that
dies and comes back; records of a GET and records read in pieces (``pieces.py``) alike."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

from kvtier.apps.bench.common.redis_server import RedisServer
from kvtier.keys import ChunkKey, make_key
from kvtier.layout import KVLayout, build_layout
from kvtier.tiers.base.chunk_format import ChunkError
from kvtier.tiers.redis.config import RedisConfig
from kvtier.tiers.redis.store import RedisStore, RedisUnavailable
from kvtier.tiers.redis.tier import RecordAbsent, RedisTier

NUM_BLOCKS, FACTOR = 8, 2
FP, OTHER_FP = bytes(range(16)), bytes(range(16, 32))
KEY_FP = bytes(range(100, 116))
AHEAD = 4  # the load handler's read-ahead
PIECED = 3 << 16  # page words of 3 MiB records, read in pieces (``pieces.py``)


def _layout(page_words: int = 256) -> KVLayout:
    caches = {"a": torch.zeros(NUM_BLOCKS, page_words), "b": torch.zeros(NUM_BLOCKS, page_words)}
    return build_layout(caches, [["a", "b"]], NUM_BLOCKS)


def _tier(url: str, rank: int = 0, page_words: int = 256, **config: Any) -> RedisTier:
    config = {"timeout_s": 0.5, "prefix": f"t{time.monotonic_ns()}", **config}
    return RedisTier(RedisStore(RedisConfig(url, **config)), rank, FP, "test layout",
                     _layout(page_words), FACTOR)  # fmt: skip


def _key(n: int) -> ChunkKey:
    return make_key(KEY_FP, n, 0)


def _payload(tier: RedisTier, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, n, dtype=np.uint8) for n in tier.view_bytes(0)]


def _read(tier: RedisTier, n: int) -> bool:
    """Read chunk n; True when it holds ``_payload(tier, n)``."""
    out = [np.zeros(size, dtype=np.uint8) for size in tier.view_bytes(0)]
    tier.read(_key(n), out)
    return all(np.array_equal(a, b) for a, b in zip(out, _payload(tier, n)))


def _load(tier: RedisTier, chunks: list[int]) -> dict[int, str]:
    """Read ``chunks`` as the load handler does: 'ok', or the error's class name."""
    for n in chunks[:AHEAD]:
        tier.prefetch(_key(n))
    outcome = {}
    for i, n in enumerate(chunks):
        if i + AHEAD < len(chunks):
            tier.prefetch(_key(chunks[i + AHEAD]))
        try:
            outcome[n] = "ok" if _read(tier, n) else "wrong bytes"
        except (ChunkError, OSError) as error:
            outcome[n] = type(error).__name__
    return outcome


def _write(tier: RedisTier, chunks: range | list[int]) -> list[int | None]:
    return tier.write_many([_key(n) for n in chunks], [_payload(tier, n) for n in chunks])


def test_records_round_trip_through_the_pipeline(store_server: RedisServer) -> None:
    tier = _tier(store_server.url)
    assert _write(tier, range(10)) == [tier.file_bytes(0)] * 10
    assert tier.file_bytes(0) < sum(tier.view_bytes(0)) + 300  # compact: no 4 KiB header
    assert _load(tier, list(range(10))) == {n: "ok" for n in range(10)}


@pytest.mark.parametrize("page_words", [256, PIECED])
def test_reads_out_of_prefetch_order_and_unprefetched_reads(
    store_server: RedisServer, page_words: int
) -> None:
    tier = _tier(store_server.url, connections=2, timeout_s=5.0, page_words=page_words)
    _write(tier, range(8))
    for n in range(6):
        tier.prefetch(_key(n))
    assert _read(tier, 3) and _read(tier, 0) and _read(tier, 4)  # replies before 3 dropped
    assert _read(tier, 7) and _read(tier, 5) and _read(tier, 1)  # 7 never prefetched


def test_a_large_record_is_received_intact(store_server: RedisServer) -> None:
    tier = _tier(store_server.url, timeout_s=5.0, page_words=1 << 20)  # 2 x 2 x 4 MiB
    assert sum(tier.view_bytes(0)) == 16 << 20
    _write(tier, [1, 2])
    assert _load(tier, [1, 2]) == {1: "ok", 2: "ok"}


@pytest.mark.parametrize("page_words", [256, PIECED])
def test_an_absent_record_is_a_miss_and_nothing_is_deleted(
    store_server: RedisServer, caplog: pytest.LogCaptureFixture, page_words: int
) -> None:
    tier = _tier(store_server.url, timeout_s=5.0, page_words=page_words)
    _write(tier, [1])
    with caplog.at_level(logging.WARNING):
        assert _load(tier, [0, 1]) == {0: "RecordAbsent", 1: "ok"}
    assert not caplog.records
    with pytest.raises(RecordAbsent, match="absent"):
        _read(tier, 99)


@pytest.mark.parametrize("page_words", [256, PIECED])
@pytest.mark.parametrize(
    "damage",
    ["garbage", "empty", "truncated", "longer", "flipped", "other chunk", "other rank",
     "other model"],
)  # fmt: skip
def test_a_bad_record_is_a_miss_is_deleted_and_the_pipeline_stays_in_step(
    store_server: RedisServer, damage: str, page_words: int
) -> None:
    tier = _tier(store_server.url, timeout_s=5.0, page_words=page_words)
    client = store_server.client()
    _write(tier, [0, 1, 2, 3])
    name = tier.name(_key(1))
    record = bytearray(client.get(name) or b"")
    if damage == "garbage":
        record = bytearray(b"not a kvtier record at all" * 1000)
    elif damage == "empty":
        record = bytearray()
    elif damage == "truncated":
        record = record[: len(record) // 2]
    elif damage == "longer":
        record += b"more"
    elif damage == "flipped":
        record[-7] ^= 0x40
    elif damage == "other chunk":
        record = bytearray(client.get(tier.name(_key(2))) or b"")
    else:  # written by rank 1, or for another model, under rank 0's name
        rank, fp = (1, FP) if damage == "other rank" else (0, OTHER_FP)
        other = RedisTier(tier.store, rank, fp, "x", tier.layout, FACTOR)
        other.write(_key(1), _payload(tier, 1))
        record = bytearray(client.get(other.name(_key(1))) or b"")
    client.set(name, bytes(record))
    assert _load(tier, [0, 1, 2, 3]) == {0: "ok", 1: "ChunkError", 2: "ok", 3: "ok"}
    assert client.exists(name) == 0  # deleted: the next store writes it afresh


def test_evicted_records_are_misses(fresh_store_server: RedisServer) -> None:
    client = fresh_store_server.client()
    client.config_set("maxmemory", "2mb")
    client.config_set("maxmemory-policy", "allkeys-lru")
    tier = _tier(fresh_store_server.url)
    written = _write(tier, range(300))  # 300 x 2 KiB records in a 2 MiB Redis
    outcome = _load(tier, list(range(300)))
    assert set(outcome.values()) == {"ok", "RecordAbsent"}
    assert list(outcome.values()).count("RecordAbsent") > 50
    assert None not in written


def test_a_full_redis_refuses_writes_without_an_error(fresh_store_server: RedisServer) -> None:
    fresh_store_server.client().config_set("maxmemory", "2mb")  # noeviction: writes are refused
    tier = _tier(fresh_store_server.url, page_words=8192)  # 64 KiB records
    written = _write(tier, range(60))
    assert written[0] == tier.file_bytes(0) and written[-1] is None
    with pytest.raises(OSError, match="refused"):
        tier.write(_key(99), _payload(tier, 99))
    assert tier.store.available


def test_a_dead_redis_fails_fast_and_is_used_again_after_a_restart(
    fresh_store_server: RedisServer,
) -> None:
    tier = _tier(fresh_store_server.url)
    _write(tier, range(6))
    for n in range(4):
        tier.prefetch(_key(n))
    fresh_store_server.kill()  # with replies in flight, or already received
    started = time.monotonic()
    with pytest.raises(RedisUnavailable):
        _read(tier, 5)
    assert time.monotonic() - started < 0.5 + 0.5
    started = time.monotonic()
    assert _load(tier, [0, 1, 2, 3]) == {n: "RedisUnavailable" for n in range(4)}
    with pytest.raises(RedisUnavailable, match="breaker open"):
        tier.write(_key(5), _payload(tier, 5))
    assert time.monotonic() - started < 0.1  # the breaker is open: nothing tried
    fresh_store_server.restart()  # an empty Redis on the same port
    deadline = time.monotonic() + 5
    while not tier.store.available:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert _load(tier, [1, 2]) == {1: "RecordAbsent", 2: "RecordAbsent"}
    _write(tier, [1, 2])
    assert _load(tier, [1, 2]) == {1: "ok", 2: "ok"}


def test_a_load_thread_and_a_write_thread_share_the_store(store_server: RedisServer) -> None:
    tier = _tier(store_server.url)
    writer = RedisTier(tier.store, 0, FP, "test layout", tier.layout, FACTOR)
    _write(tier, range(50))
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for first in range(100, 300, 20):
                assert None not in _write(writer, range(first, first + 20))
        except BaseException as error:  # noqa: BLE001  (reported below)
            failures.append(error)

    thread = threading.Thread(target=write)
    thread.start()
    outcomes = [_load(tier, list(range(50))) for _ in range(4)]
    thread.join(timeout=30)
    assert not thread.is_alive() and not failures
    assert all(outcome == {n: "ok" for n in range(50)} for outcome in outcomes)
    assert _load(tier, [100, 299]) == {100: "ok", 299: "ok"}


@pytest.mark.parametrize("page_words", [1 << 16, PIECED])  # 1 MiB records, 3 MiB in pieces
def test_records_over_tls(redis_tls: RedisServer, page_words: int) -> None:
    tier = _tier(redis_tls.url, timeout_s=5.0, page_words=page_words, tls_ca=redis_tls.ca_file)
    _write(tier, range(3))
    assert _load(tier, [0, 1, 2]) == {0: "ok", 1: "ok", 2: "ok"}


@pytest.mark.parametrize(("page_words", "ahead"), [(256, 16), (1 << 18, 8), (1 << 20, 2)])
def test_read_ahead_holds_about_32_mib_of_records(
    redis_server: RedisServer, page_words: int, ahead: int
) -> None:
    """4 KiB, 4 MiB and 16 MiB records: replies in flight stay near 32 MiB, 2 to 16 records."""
    assert _tier(redis_server.url, page_words=page_words).read_ahead == ahead

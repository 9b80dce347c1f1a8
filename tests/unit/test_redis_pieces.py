"""Large Redis values read in pieces (``tiers/redis/pieces.py``): the GETRANGEs cover the value
whatever its exact length, a record tier never asks Redis for a reply of 8 MiB, which Redis
builds in freshly mapped memory (5-6 x its time per byte), and a Redis whose ACL refuses
GETRANGE still serves every record, read whole."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
import torch

from kvtier.apps.bench.common.redis_server import RedisServer
from kvtier.keys import make_key
from kvtier.layout import KVLayout, build_layout
from kvtier.tiers.redis.config import RedisConfig
from kvtier.tiers.redis.pieces import PIECE_BYTES, read_commands
from kvtier.tiers.redis.store import RedisStore
from kvtier.tiers.redis.tier import RedisTier


def test_a_value_of_a_piece_or_less_is_one_get() -> None:
    assert read_commands(b"k", PIECE_BYTES) == [[b"GET", b"k"]]
    assert read_commands(b"k", None) == [[b"GET", b"k"]]


@pytest.mark.parametrize("size", [PIECE_BYTES + 1, 2 * PIECE_BYTES, 5 * PIECE_BYTES + 3])
@pytest.mark.parametrize("off_by", [-9, 0, 9])  # a record's msgpack header varies by a few bytes
def test_the_pieces_cover_the_value_in_order(
    redis_server: RedisServer, size: int, off_by: int
) -> None:
    client = redis_server.client()
    name = f"pieces-{time.monotonic_ns()}".encode()
    value = np.random.default_rng(size).integers(0, 256, size + off_by, dtype=np.uint8).tobytes()
    client.set(name, value)
    exists, *ranges = read_commands(name, size)
    assert exists == [b"EXISTS", name] and client.execute_command(*exists) == 1
    pieces = [client.execute_command(*command) for command in ranges]
    assert b"".join(pieces) == value
    assert len(pieces) == -(-size // PIECE_BYTES)
    assert max(len(piece) for piece in pieces) <= PIECE_BYTES + max(off_by, 0)
    client.delete(name)


def test_records_of_8_mib_are_read_without_a_reply_of_8_mib(
    fresh_store_server: RedisServer,
) -> None:
    store = RedisStore(RedisConfig(fresh_store_server.url, timeout_s=5.0, prefix="p"))
    tier = RedisTier(store, 0, bytes(16), "test layout", _layout(1 << 19), 2)  # 2 MiB pages
    assert tier.file_bytes(0) > 8 << 20
    keys = [make_key(bytes(16), n, 0) for n in range(3)]
    payloads = [_payload(tier, n) for n in range(3)]
    assert None not in tier.write_many(keys, payloads)
    for key in keys:
        tier.prefetch(key)
    for key, payload in zip(keys, payloads):
        out = [np.zeros(n, dtype=np.uint8) for n in tier.view_bytes(0)]
        tier.read(key, out)
        assert all(np.array_equal(a, b) for a, b in zip(out, payload))
    tier.read(keys[1], [np.zeros(n, dtype=np.uint8) for n in tier.view_bytes(0)])  # unprefetched
    stats = fresh_store_server.client().info("commandstats")
    assert "cmdstat_get" not in stats
    assert stats["cmdstat_getrange"]["calls"] == 4 * -(-tier.file_bytes(0) // PIECE_BYTES)


def test_a_redis_that_refuses_getrange_has_records_read_whole(
    store_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """An ACL without GETRANGE: every record is still read (whole), with one warning."""
    client = store_server.client()
    user = f"nogetrange{time.monotonic_ns()}"
    client.execute_command("ACL", "SETUSER", user, "on", ">secret", "~*", "+@all", "-getrange")
    try:
        url = store_server.url.replace("://", f"://{user}:secret@", 1)
        store = RedisStore(RedisConfig(url, timeout_s=5.0, prefix=f"acl{time.monotonic_ns()}"))
        tier = RedisTier(store, 0, bytes(16), "test layout", _layout(3 << 16), 2)  # 3 MiB
        keys = [make_key(bytes(16), n, 0) for n in range(4)]
        payloads = [_payload(tier, n) for n in range(4)]
        assert None not in tier.write_many(keys, payloads)
        with caplog.at_level(logging.WARNING):
            for key in keys:
                tier.prefetch(key)  # sent in pieces: every one refused
            for key, payload in zip(keys, payloads):
                out = [np.zeros(n, dtype=np.uint8) for n in tier.view_bytes(0)]
                tier.read(key, out)
                assert all(np.array_equal(a, b) for a, b in zip(out, payload))
        assert not store.pieces
        messages = [record.getMessage() for record in caplog.records]
        assert len(messages) == 1 and "allow GETRANGE" in messages[0]  # one warning
    finally:
        client.execute_command("ACL", "DELUSER", user)


def _layout(page_words: int) -> KVLayout:
    caches = {"a": torch.zeros(4, page_words), "b": torch.zeros(4, page_words)}
    return build_layout(caches, [["a", "b"]], 4)


def _payload(tier: RedisTier, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, n, dtype=np.uint8) for n in tier.view_bytes(0)]

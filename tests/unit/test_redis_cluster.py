"""A Redis Cluster of 3 masters: key slots as Redis computes them, chunks spread over the nodes
and read back, and a slot that moves under a store's feet (``ASK``, then ``MOVED``), also while
a large value is read in pieces."""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np
import pytest
import redis
import torch
from redis.cluster import key_slot as redis_py_key_slot

from kvtier.apps.bench.common.redis_server import RedisClusterServers, RedisServer
from kvtier.keys import ChunkKey, make_key
from kvtier.layout import build_layout
from kvtier.tiers.redis.cluster import SlotMap, key_slot
from kvtier.tiers.redis.config import RedisConfig
from kvtier.tiers.redis.errors import AskError, MovedError
from kvtier.tiers.redis.keys import redis_key
from kvtier.tiers.redis.pieces import Reader, read_commands
from kvtier.tiers.redis.store import RedisStore
from kvtier.tiers.redis.tier import RedisTier
from kvtier.tiers.redis.url import parse_url

FP = bytes(range(16))


def _store(cluster: RedisClusterServers) -> RedisStore:
    url, *seeds = cluster.urls
    config = RedisConfig(url, timeout_s=1.0, cluster=True, seeds=tuple(seeds),
                         prefix=f"c{time.monotonic_ns()}")  # fmt: skip
    return RedisStore(config)


def _key(n: int) -> ChunkKey:
    return make_key(FP, n, n % 3)


@pytest.mark.parametrize(
    "name",
    [b"", b"plain", b"{tag}a", b"a{tag}b", b"{}x", b"x{}", b"{{x}}", b"{x", b"x}{y}", b"a{b}{c}"],
)
def test_key_slot_honours_hash_tags_as_redis_does(name: bytes) -> None:
    assert key_slot(name) == redis_py_key_slot(name)


def test_key_slot_matches_redis_py_on_many_keys() -> None:
    rng = random.Random(7)
    names = [rng.randbytes(rng.randrange(0, 80)) for _ in range(2000)]
    names += [redis_key("kvtier", _key(n), rank) for n in range(200) for rank in (0, 3)]
    assert [key_slot(n) for n in names] == [redis_py_key_slot(n) for n in names]


def test_every_rank_of_a_chunk_is_on_one_node() -> None:
    assert len({key_slot(redis_key("kv", _key(5), rank)) for rank in range(8)}) == 1


def test_a_moved_reply_outranks_a_seed_that_lags_behind_a_resharding() -> None:
    seed = parse_url("redis://:secret@127.0.0.1:7000")
    lagging = [[0, 99, [b"127.0.0.1", 7000]], [100, 16383, [b"127.0.0.1", 7001]]]
    slots = SlotMap()
    slots.update(lagging, seed, [MovedError("MOVED 42 127.0.0.1:7002"),
                                 AskError("ASK 7 127.0.0.1:7002")])  # fmt: skip
    nodes = [slots.node(n) for n in (42, 7, 41, 43, 100)]
    assert [(n.port, n.password) if n else None for n in nodes] == [
        (7002, "secret"), (7000, "secret"), (7000, "secret"), (7000, "secret"), (7001, "secret")
    ]  # fmt: skip


def test_chunks_spread_over_the_nodes_and_read_back(redis_cluster: RedisClusterServers) -> None:
    caches = {"a": torch.zeros(8, 64), "b": torch.zeros(8, 64)}
    layout = build_layout(caches, [["a", "b"], ["a", "b"], ["a", "b"]], 8)
    store = _store(redis_cluster)
    store.check()
    tier = RedisTier(store, 0, b"fp" * 8, "test layout", layout, 2)
    keys = [_key(n) for n in range(60)]
    rng = np.random.default_rng(0)
    payloads = [[rng.integers(0, 256, n, dtype=np.uint8) for n in tier.view_bytes(0)]
                for _ in keys]  # fmt: skip
    assert None not in tier.write_many(keys, payloads)
    per_node = [_count(server, store.config.prefix) for server in redis_cluster.servers]
    assert sum(per_node) == 60 and min(per_node) > 5
    assert store.exists([tier.name(key) for key in keys]) == [True] * 60
    for n in range(4):
        tier.prefetch(keys[n])
    for n, key in enumerate(keys):
        if n + 4 < len(keys):
            tier.prefetch(keys[n + 4])
        out = [np.zeros(size, dtype=np.uint8) for size in tier.view_bytes(0)]
        tier.read(key, out)
        assert all(np.array_equal(a, b) for a, b in zip(out, payloads[n]))


def test_a_slot_that_moves_is_followed(redis_cluster: RedisClusterServers) -> None:
    store = _store(redis_cluster)
    name, other = (redis_key(store.config.prefix, _key(n), 0) for n in (1, 2))
    assert store.set_many([(name, b"v1"), (other, b"v2")]) == [True, True]  # the map is cached
    source = _server_of(redis_cluster, name)
    target = next(s for s in redis_cluster.servers if s is not source)
    slot = key_slot(name)
    _start_moving(slot, source, target, name)  # name is on target: source answers ASK
    with pytest.raises(redis.exceptions.AskError):
        source.client().get(name)
    assert store.exists([name]) == [True]
    assert _get(store, name) == b"v1"
    _finish_moving(redis_cluster, slot, source, target)  # source answers MOVED
    with pytest.raises(redis.exceptions.MovedError):
        source.client().get(name)
    assert store.exists([name, other]) == [True, True]
    assert store.set_many([(name, b"v3")]) == [True]
    assert _get(store, name) == b"v3"
    assert store.slots.node(slot) is not None and store.slots.node(slot).port == target.port


def test_a_value_read_in_pieces_follows_a_moving_slot(redis_cluster: RedisClusterServers) -> None:
    store = _store(redis_cluster)
    name = redis_key(store.config.prefix, _key(7), 0)
    value = np.random.default_rng(7).integers(0, 256, 5 << 20, dtype=np.uint8).tobytes()
    pieces = len(read_commands(name, len(value))) - 1  # after EXISTS
    assert pieces > 1
    assert store.set_many([(name, value)]) == [True]  # the map is cached
    source = _server_of(redis_cluster, name)
    target = next(s for s in redis_cluster.servers if s is not source)
    slot = key_slot(name)
    _start_moving(slot, source, target, name)  # every piece answered ASK: read whole there
    assert _get(store, name, len(value)) == value
    _finish_moving(redis_cluster, slot, source, target)  # MOVED: the pieces asked of target
    asked = _getrange_calls(target)
    assert _get(store, name, len(value)) == value
    assert _getrange_calls(target) == asked + pieces
    assert store.slots.node(slot) is not None and store.slots.node(slot).port == target.port


def _getrange_calls(server: RedisServer) -> int:
    stats = server.client().info("commandstats").get("cmdstat_getrange", {"calls": 0})
    return int(stats["calls"])


def _count(server: RedisServer, prefix: str) -> int:
    return sum(1 for _ in server.client().scan_iter(match=f"{prefix}:*"))


def _get(store: RedisStore, name: bytes, size: int | None = None) -> bytes | None:
    def whole(value: Reader) -> bytes:
        data = value.read_bytes(value.length if value.length is not None else size or 0)
        assert value.ended()
        return data

    return store.read_get(store.send_get(name, size=size), whole)


def _server_of(cluster: RedisClusterServers, name: bytes) -> RedisServer:
    slot = key_slot(name)
    return next(s for s in cluster.servers
                if _command(s.client(), "CLUSTER", "COUNTKEYSINSLOT", slot))  # fmt: skip


def _command(client: redis.Redis, *args: Any) -> Any:
    return client.execute_command(*args)


def _start_moving(slot: int, source: RedisServer, target: RedisServer, name: bytes) -> None:
    src, dst = source.client(), target.client()
    src_id, dst_id = _command(src, "CLUSTER", "MYID"), _command(dst, "CLUSTER", "MYID")
    _command(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    _command(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    _command(src, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", name)


def _finish_moving(
    cluster: RedisClusterServers, slot: int, source: RedisServer, target: RedisServer
) -> None:
    """Every key the source still holds in ``slot`` (other tests' on the shared cluster) is
    migrated first, as a real resharding does: a node keeping keys refuses the slot's move."""
    src = source.client()
    while keys := _command(src, "CLUSTER", "GETKEYSINSLOT", slot, 100):
        _command(src, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "REPLACE", "KEYS", *keys)
    target_id = _command(target.client(), "CLUSTER", "MYID")
    for server in [target, *(s for s in cluster.servers if s is not target)]:
        _command(server.client(), "CLUSTER", "SETSLOT", slot, "NODE", target_id)
    _settled(cluster, slot, target_id)


def _settled(cluster: RedisClusterServers, slot: int, owner: str, wait_s: float = 10.0) -> None:
    """Wait until every node says ``owner`` serves ``slot``, as ``redis-cli --cluster`` waits
    for the nodes to agree after a resharding."""
    deadline = time.monotonic() + wait_s
    while not all(_serves(s, slot) == owner for s in cluster.servers):
        assert time.monotonic() < deadline, f"the nodes did not agree on slot {slot} in {wait_s} s"
        time.sleep(0.02)


def _serves(server: RedisServer, slot: int) -> Any:
    """The ID (as ``CLUSTER MYID`` answers it) of the master ``server`` says serves ``slot``."""
    for first, last, master, *_ in _command(server.client(), "CLUSTER", "SLOTS"):
        if first <= slot <= last:
            return master[2]
    return None

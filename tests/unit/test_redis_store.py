"""RedisStore against real servers: start-up checks that name the setting and the cause, each
within a bounded time; pipelined commands; a full Redis; threads; the circuit breaker."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from kvtier.apps.bench.common.redis_server import RedisClusterServers, RedisServer
from kvtier.apps.ports import free_port
from kvtier.tiers.redis.config import RedisConfig
from kvtier.tiers.redis.store import RedisStore, RedisUnavailable

TIMEOUT_S = 0.5
BOUND_S = 3 * TIMEOUT_S + 0.5  # connect, PING, INFO: each bounded by the timeout


def _store(url: str, **config: Any) -> RedisStore:
    return RedisStore(RedisConfig(url, timeout_s=TIMEOUT_S, **config))


def _check_fails(store: RedisStore, match: str) -> str:
    started = time.monotonic()
    with pytest.raises(ValueError, match=match) as raised:
        store.check()
    assert time.monotonic() - started < BOUND_S
    return str(raised.value)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


@pytest.fixture
def secured(fresh_store_server: RedisServer) -> RedisServer:
    fresh_store_server.client().config_set("requirepass", "right-pw")
    return fresh_store_server


def test_a_server_that_answers_passes(store_server: RedisServer) -> None:
    _store(store_server.url).check()


def test_the_password_may_come_from_the_environment(
    secured: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_KVTIER_PW", "right-pw")
    _store(secured.url, password_env="TEST_KVTIER_PW").check()


def test_a_wrong_password_is_refused_by_name(secured: RedisServer) -> None:
    url = secured.url.replace("redis://", "redis://:wrong-pw@")
    message = _check_fails(_store(url, password_env="TEST_KVTIER_PW"), r"refused the user or pass")
    assert message.startswith("kvtier: 'redis.url'") and "TEST_KVTIER_PW" in message
    assert "wrong-pw" not in message and "right-pw" not in message


def test_a_missing_password_says_where_one_comes_from(secured: RedisServer) -> None:
    message = _check_fails(_store(secured.url), r"'redis\.url'.*requires a password")
    assert "KVTIER_REDIS_PASSWORD" in message


def test_a_unix_socket_with_a_password(tmp_path: Path) -> None:
    path = tmp_path / "redis.sock"
    with RedisServer(unixsocket=str(path), requirepass="pw"):
        store = _store(f"unix://:pw@{path}?db=2")
        store.check()
        assert store.set_many([(b"unix:1", b"v")]) == [True]
        client = redis.Redis(unix_socket_path=str(path), password="pw", db=2)
        assert client.get(b"unix:1") == b"v"


def test_nothing_listening_names_the_address() -> None:
    port = free_port()
    _check_fails(_store(f"redis://127.0.0.1:{port}/0"), rf"nothing listens at .*127.0.0.1:{port}")


def test_a_server_that_never_answers_is_a_timeout(silent_port: int) -> None:
    _check_fails(_store(f"redis://127.0.0.1:{silent_port}/0"), r"no answer .* within")


def test_tls_to_a_plain_port(store_server: RedisServer) -> None:
    url = store_server.url.replace("redis://", "rediss://")
    _check_fails(_store(url), r"'redis\.url'.*TLS handshake .* plain port")


def test_plain_to_a_tls_port(redis_tls: RedisServer) -> None:
    url = redis_tls.url.replace("rediss://", "redis://")
    _check_fails(_store(url), r"'redis\.url'.*closed the connection.*rediss://")


def test_tls_with_its_ca_works_and_without_it_is_not_trusted(redis_tls: RedisServer) -> None:
    store = _store(redis_tls.url, tls_ca=redis_tls.ca_file)
    store.check()
    assert store.set_many([(b"tls:1", b"v")]) == [True] and store.exists([b"tls:1"]) == [True]
    _check_fails(_store(redis_tls.url), r"'redis\.url'.*not trusted.*'redis\.tls_ca'")


def test_a_ca_file_that_cannot_be_read(redis_tls: RedisServer, tmp_path: Path) -> None:
    store = _store(redis_tls.url, tls_ca=str(tmp_path / "missing.pem"))  # no I/O yet
    _check_fails(store, r"^kvtier: 'redis\.tls_ca': cannot load")


def test_a_database_that_does_not_exist(store_server: RedisServer) -> None:
    _check_fails(_store(store_server.url.replace("/0", "/999")), r"database 999 does not exist")


def test_cluster_mode_must_match(
    store_server: RedisServer, redis_cluster: RedisClusterServers
) -> None:
    _check_fails(_store(store_server.url, cluster=True), r"'redis\.url'.*not in cluster mode")
    _check_fails(_store(redis_cluster.urls[0]), r"is a Redis Cluster node.*'redis\.cluster'")
    seeds = (redis_cluster.urls[1], f"redis://127.0.0.1:{free_port()}/0")
    _check_fails(_store(redis_cluster.urls[0], cluster=True, seeds=seeds),
                 r"^kvtier: 'redis\.seeds': nothing listens")  # fmt: skip


def test_pipelined_commands(store_server: RedisServer) -> None:
    store = _store(store_server.url, ttl_s=60.0)
    names = [b"cmd:%d" % n for n in range(100)]
    assert store.set_many([(name, (b"head-", b"x" * 20_000)) for name in names]) == [True] * 100
    assert store_server.client().get(b"cmd:7") == b"head-" + b"x" * 20_000
    assert 0 < store_server.client().pttl(b"cmd:7") <= 60_000
    store.delete(names[::2])
    assert store.exists([*names[:4], b"cmd:never"]) == [False, True, False, True, False]


def test_a_full_redis_refuses_a_write_without_an_error(fresh_store_server: RedisServer) -> None:
    fresh_store_server.client().config_set("maxmemory", "2mb")  # policy noeviction: writes refused
    store = _store(fresh_store_server.url)
    stored = store.set_many([(b"full:%d" % n, b"x" * 100_000) for n in range(40)])
    assert stored[0] and not stored[-1]
    assert store.available and store.exists([b"full:0"]) == [True]


def test_threads_use_their_own_connections(store_server: RedisServer) -> None:
    store = _store(store_server.url)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for round_ in range(20):
                names = [b"thread:%d:%d:%d" % (n, round_, i) for i in range(10)]
                assert store.set_many([(name, name * 100) for name in names]) == [True] * 10
                assert store.exists(names) == [True] * 10
        except BaseException as error:  # noqa: BLE001  (reported below)
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors and not any(thread.is_alive() for thread in threads)


def test_the_breaker_fails_fast_and_closes_after_a_restart(fresh_store_server: RedisServer) -> None:
    store = _store(fresh_store_server.url)
    assert store.exists([b"k"]) == [False]
    fresh_store_server.kill()
    started = time.monotonic()
    with pytest.raises(RedisUnavailable):
        store.exists([b"k"])
    assert time.monotonic() - started < TIMEOUT_S + 0.5
    assert not store.available
    for _ in range(100):  # open: not even tried
        started = time.monotonic()
        with pytest.raises(RedisUnavailable, match="breaker open"):
            store.set_many([(b"k", b"v")])
        assert time.monotonic() - started < 0.05
    fresh_store_server.restart()
    deadline = time.monotonic() + 5
    while not store.available:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert store.set_many([(b"k", b"v")]) == [True] and store.exists([b"k"]) == [True]
    assert store.breaker.failures == 0


def test_the_breaker_window_doubles_while_redis_stays_down(fresh_store_server: RedisServer) -> None:
    store = _store(fresh_store_server.url)
    fresh_store_server.kill()
    windows = []
    for _ in range(3):
        with pytest.raises(RedisUnavailable):
            store.exists([b"k"])
        windows.append(store.breaker.open_until - time.monotonic())
        store.breaker.open_until = 0.0  # the window passed (a test need not wait for it)
    assert [round(w * 2) / 2 for w in windows] == [0.5, 1.0, 2.0]


def test_a_redis_that_stops_answering_is_unavailable_within_the_timeout(
    silent_port: int,
) -> None:
    store = _store(f"redis://127.0.0.1:{silent_port}/0")
    started = time.monotonic()
    with pytest.raises(RedisUnavailable):
        store.exists([b"k"])
    assert time.monotonic() - started < TIMEOUT_S + 0.5


def test_a_restarted_redis_costs_one_miss_not_the_breakers_window(fresh_redis: Any) -> None:
    """The first call after a restart finds its connection closed: it is a miss, a fresh
    connection answers, and the next call works at once (the breaker never opened)."""
    store = _store(fresh_redis.url)
    assert store.exists([b"a"]) == [False]  # a connection opened
    fresh_redis.kill()
    fresh_redis.restart()
    with pytest.raises(RedisUnavailable, match="reconnected"):
        store.exists([b"a"])
    assert store.breaker.closed and store.breaker.failures == 0
    assert store.exists([b"a"]) == [False]


def test_a_redis_that_stays_down_opens_the_breaker(fresh_redis: Any) -> None:
    store = _store(fresh_redis.url)
    assert store.exists([b"a"]) == [False]
    fresh_redis.kill()
    with pytest.raises(RedisUnavailable):
        store.exists([b"a"])
    assert not store.breaker.closed  # no answer to the fresh connection: not asked for a while
    with pytest.raises(RedisUnavailable, match="circuit breaker open"):
        store.exists([b"a"])

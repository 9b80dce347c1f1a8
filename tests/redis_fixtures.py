"""Real Redis and Valkey servers for the tests (a pytest plugin: ``pytest_plugins`` in conftest.py).

    redis_server         one redis-server for the session (tests use their own key prefixes)
    valkey_server        one valkey-server for the session
    store_server         each of the two in turn (a test that must hold for Redis and Valkey)
    redis_tls            one TLS-only server for the session (``url`` rediss://, ``ca_file``)
    redis_cluster        a 3-master Redis Cluster for the session
    fresh_redis          a server of the test's own, to kill, restart or fill
    fresh_store_server   the same, redis-server then valkey-server

Without the server's binary on PATH these skip, unless ``KVTIER_TEST_REQUIRE_REDIS=1`` (``make
test`` sets it, after ``scripts/install-test-servers``): then they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from kvtier.apps.bench.common.redis_server import RedisClusterServers, RedisServer, server_binary


def _need(kind: str) -> None:
    if server_binary(kind) is not None:
        return
    message = f"{kind}-server is not on PATH (make test installs it: scripts/install-test-servers)"
    if os.environ.get("KVTIER_TEST_REQUIRE_REDIS") == "1":
        pytest.fail(f"{message}, and KVTIER_TEST_REQUIRE_REDIS=1 requires it")
    pytest.skip(message)


def _server(kind: str, tls: bool = False) -> Iterator[RedisServer]:
    _need(kind)
    with RedisServer(kind=kind, tls=tls) as server:
        yield server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    yield from _server("redis")


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[RedisServer]:
    yield from _server("valkey")


@pytest.fixture(params=["redis", "valkey"])
def store_server(request: pytest.FixtureRequest) -> RedisServer:
    server: RedisServer = request.getfixturevalue(f"{request.param}_server")
    return server


@pytest.fixture(scope="session")
def redis_tls() -> Iterator[RedisServer]:
    yield from _server("redis", tls=True)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    _need("redis")
    with RedisClusterServers(3, kind="redis") as cluster:
        yield cluster


@pytest.fixture
def fresh_redis() -> Iterator[RedisServer]:
    yield from _server("redis")


@pytest.fixture(params=["redis", "valkey"])
def fresh_store_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    yield from _server(request.param)

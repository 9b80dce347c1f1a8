"""Real Redis servers for the tests (a pytest plugin: ``pytest_plugins`` in conftest.py).

    redis_server    one server for the session (tests use their own key prefixes)
    redis_tls       one TLS-only server for the session (``url`` rediss://, ``ca_file``)
    redis_cluster   a 3-master Redis Cluster for the session
    fresh_redis     a server of the test's own, to kill, restart or fill

Without ``redis-server`` on PATH these skip, unless ``KVTIER_TEST_REQUIRE_REDIS=1`` (``make
test`` sets it, after installing Debian's redis-server): then they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from kvtier.bench.redis_server import RedisClusterServers, RedisServer, redis_server_binary


def _need_redis() -> None:
    if redis_server_binary() is not None:
        return
    message = "redis-server is not on PATH (make test installs Debian's redis-server)"
    if os.environ.get("KVTIER_TEST_REQUIRE_REDIS") == "1":
        pytest.fail(f"{message}, and KVTIER_TEST_REQUIRE_REDIS=1 requires it")
    pytest.skip(message)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    _need_redis()
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_tls() -> Iterator[RedisServer]:
    _need_redis()
    with RedisServer(tls=True) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    _need_redis()
    with RedisClusterServers(3) as cluster:
        yield cluster


@pytest.fixture
def fresh_redis() -> Iterator[RedisServer]:
    _need_redis()
    with RedisServer() as server:
        yield server

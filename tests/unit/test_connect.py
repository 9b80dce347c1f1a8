"""A TCP connection by name or address whose name lookup is bounded: a resolver that does not
answer costs a Redis start-up check and a prefill→decode pull their timeout, not glibc's tens of
seconds. The stuck resolver is the only stand-in here (``socket.getaddrinfo`` blocked until the
test ends); the listeners, Redis's check and the transfer client are real."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from peer_setup import IDENTITY, SECRET, Engine

from kvtier.connect import ResolveTimeout, connect
from kvtier.tiers.peer.net import TransferClient, TransferError
from kvtier.tiers.redis.config import RedisConfig
from kvtier.tiers.redis.store import RedisStore

TIMEOUT_S = 0.3
MARGIN_S = 0.5


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.fixture
def stuck_resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every name lookup waits until the test ends; the names asked are listed."""
    release = threading.Event()
    asked: list[str] = []

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
        asked.append(host)
        release.wait(30)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield asked
    release.set()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_an_address_or_a_name_connects_and_keeps_the_timeout(listener: int, host: str) -> None:
    with connect(host, listener, TIMEOUT_S) as sock:
        assert sock.getpeername()[1] == listener
        assert sock.gettimeout() == TIMEOUT_S


def test_nothing_listening_is_refused(listener: int) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        connect("127.0.0.1", port, TIMEOUT_S)


def test_a_resolver_that_does_not_answer_is_given_up_at_the_timeout(
    stuck_resolver: list[str],
) -> None:
    started = time.monotonic()
    with pytest.raises(ResolveTimeout, match="resolving 'redis.example' took longer"):
        connect("redis.example", 6379, TIMEOUT_S)
    assert TIMEOUT_S <= time.monotonic() - started < TIMEOUT_S + MARGIN_S
    assert stuck_resolver == ["redis.example"]


def test_a_numeric_address_never_waits_for_the_resolver(
    listener: int, stuck_resolver: list[str]
) -> None:
    started = time.monotonic()
    connect("127.0.0.1", listener, TIMEOUT_S).close()
    assert time.monotonic() - started < TIMEOUT_S
    assert stuck_resolver == []  # numeric: nothing to look up


def test_redis_at_a_name_that_does_not_resolve_in_time_is_an_error_naming_the_setting(
    stuck_resolver: list[str],
) -> None:
    store = RedisStore(RedisConfig("redis://redis.example:6379/0", timeout_s=TIMEOUT_S))
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"'redis\.url'.*cannot resolve the host.*within"):
        store.check()
    assert time.monotonic() - started < TIMEOUT_S + MARGIN_S
    store.close()


def test_a_pull_from_a_peer_whose_name_does_not_resolve_fails_within_the_timeout(
    stuck_resolver: list[str],
) -> None:
    client = TransferClient(Engine(seed=1).rows, IDENTITY, SECRET, timeout_s=TIMEOUT_S)
    started = time.monotonic()
    with pytest.raises(TransferError, match="prefill.example:7000: cannot connect: resolving"):
        client.pull("prefill.example", 7000, "req", [[1, 2], [3]], [[4, 5], [6]])
    assert time.monotonic() - started < TIMEOUT_S + MARGIN_S
    client.close()

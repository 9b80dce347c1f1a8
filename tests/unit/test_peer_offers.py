"""The prefill side's offers: each ends once, and is reported only when no pull still reads it."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from peer_setup import WAIT_S, Engine, StallingRows, deadline, peers, wait_done

from kvtier.tiers.peer.net import TransferError, server
from kvtier.tiers.peer.net.offers import OfferTable, Refused

BLOCKS = [[1, 2], [3]]


def test_an_offer_ends_once_whichever_comes_first() -> None:
    table = OfferTable()
    table.offer("pulled", BLOCKS, deadline())
    table.offer("withdrawn", BLOCKS, deadline())
    table.offer("late", BLOCKS, time.monotonic() - 1)
    table.release("pulled", True)
    table.withdraw("withdrawn")
    table.release("withdrawn", True)  # too late: already ended
    assert sorted(table.take_done()) == [("late", False), ("pulled", True), ("withdrawn", False)]
    assert table.take_done() == [] and table.expired == 1
    table.check_integrity()


def test_a_claimed_offer_is_reported_after_its_last_reader() -> None:
    table = OfferTable()
    table.offer("req", BLOCKS, deadline())
    first = table.claim("req", [[1], []], wait_s=0)
    second = table.claim("req", [[2], [3]], wait_s=0)
    table.withdraw("req")
    assert table.take_done() == []
    table.unclaim(first)
    assert table.take_done() == []
    table.unclaim(second)
    assert table.take_done() == [("req", False)]
    table.check_integrity()


@pytest.mark.parametrize(
    ("block_ids", "reason"),
    [
        ([[1, 4], [3]], r"blocks not offered for request 'req': group 0 \[4\]"),
        ([[1], [2]], r"group 1 \[2\]"),
        ([[1]], "has 2 groups, asked for 1"),
    ],
)
def test_only_offered_blocks_can_be_claimed(block_ids: list[list[int]], reason: str) -> None:
    table = OfferTable()
    table.offer("req", BLOCKS, deadline())
    with pytest.raises(Refused, match=reason):
        table.claim("req", block_ids, wait_s=0)
    table.check_integrity()


def test_ended_requests_are_refused_at_once_and_may_be_offered_again() -> None:
    table = OfferTable()
    table.offer("req", BLOCKS, deadline())
    table.release("req", True)
    with pytest.raises(Refused, match="'req' released"):
        table.claim("req", BLOCKS, wait_s=WAIT_S)
    table.offer("open", BLOCKS, deadline())
    with pytest.raises(ValueError, match="already offered"):
        table.offer("open", BLOCKS, deadline())
    table.offer("req", BLOCKS, deadline())  # a new offer under the same id
    table.unclaim(table.claim("req", BLOCKS, wait_s=0))
    table.check_integrity()


def test_withdrawn_during_a_pull_is_reported_once_the_pull_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "READ_SLICE_BYTES", 512)  # the second read stalls
    prefill = Engine(seed=1)
    stall, stalled = threading.Event(), threading.Event()
    prefill.rows = StallingRows(prefill.views, stall, stalled)
    with peers(connections=1, prefill=prefill) as (_, srv, _decode, client):
        srv.offer("req", BLOCKS, deadline())
        puller = threading.Thread(
            target=client.pull, args=(*srv.address, "req", BLOCKS, [[4, 5], [6]])
        )
        puller.start()
        assert stalled.wait(WAIT_S)
        srv.withdraw("req")  # the engine gives up on it while its blocks are being sent
        assert srv.take_done() == []  # so it must not free them yet
        stall.set()
        puller.join(WAIT_S)
        assert wait_done(srv, 1) == [("req", False)]


def test_a_silent_peer_does_not_hold_a_server_thread() -> None:
    with peers(io_timeout_s=0.2) as (_, srv, _decode, client):
        with socket.create_connection(srv.address, timeout=WAIT_S) as silent:
            silent.settimeout(WAIT_S)
            started = time.monotonic()
            while silent.recv(4096):  # the challenge, then EOF once the server gives up
                pass
            assert time.monotonic() - started < WAIT_S
        assert srv.counters.errors == 1
        srv.offer("req", BLOCKS, deadline())
        assert client.pull(*srv.address, "req", BLOCKS, [[4, 5], [6]]) > 0
        with pytest.raises(TransferError, match="released"):
            client.pull(*srv.address, "req", BLOCKS, [[4, 5], [6]])

"""``KeyedThreads``: one key's work in order, different keys side by side, real threads."""

from __future__ import annotations

import threading
from functools import partial

import pytest

from kvtier.tiers.base.keyed_threads import KeyedThreads

WAIT_S = 10.0


def test_a_key_that_blocks_does_not_hold_up_another_key() -> None:
    threads = KeyedThreads("test-keyed", 2)
    gate = threading.Event()
    try:
        blocked = threads.submit("hung-peer", lambda: gate.wait(WAIT_S))
        assert threads.submit("other-peer", lambda: "pulled").result(WAIT_S) == "pulled"
        assert not blocked.done()
    finally:
        gate.set()
        threads.shutdown()
    assert blocked.result() is True


def test_work_of_one_key_runs_in_submission_order() -> None:
    threads = KeyedThreads("test-keyed", 4)
    order: list[int] = []
    futures = [threads.submit("peer", partial(order.append, i)) for i in range(50)]
    for future in futures:
        future.result(WAIT_S)
    threads.shutdown()
    assert order == list(range(50))


def test_keys_past_the_thread_count_share_threads_round_robin() -> None:
    threads = KeyedThreads("test-keyed", 2)
    gate = threading.Event()
    try:
        threads.submit("a", lambda: gate.wait(WAIT_S))  # lane 0
        assert threads.submit("b", lambda: 2).result(WAIT_S) == 2  # lane 1
        third = threads.submit("c", lambda: 3)  # lane 0 again: behind "a"
        assert not third.done()
    finally:
        gate.set()
    assert third.result(WAIT_S) == 3
    threads.shutdown()


def test_no_threads_is_refused_and_shut_down_refuses_work() -> None:
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        KeyedThreads("test-keyed", 0)
    threads = KeyedThreads("test-keyed", 1)
    threads.shutdown()
    with pytest.raises(RuntimeError):
        threads.submit("a", lambda: None)

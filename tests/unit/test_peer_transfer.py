"""Pulls between two CPU engines over real loopback sockets: the rows arrive byte-exact.

Scenario shape: the prefill engine offers a finished request's blocks (per group), the decode
engine pulls them into other block ids, the server reports the offer done once released.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import numpy as np
import pytest
import torch
from peer_setup import (
    GROUPS,
    IDENTITY,
    NUM_BLOCKS,
    SECRET,
    Engine,
    deadline,
    pairs,
    peers,
    same_blocks,
    wait_done,
)

from kvtier.tiers.peer.net import PeerIdentity, TransferClient, request_rows
from kvtier.tiers.peer.net import client as client_module
from kvtier.tiers.peer.net.client import _split


@pytest.fixture(autouse=True)
def split_every_pull(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts of any size, so these few-KiB pulls use every connection."""
    monkeypatch.setattr(client_module, "MIN_PART_BYTES", 1)


def test_request_rows_are_per_group_per_view_per_block() -> None:
    assert pairs(request_rows(((0, 1), (2,)), [[5, 3], [7]])) == [
        (0, 5), (0, 3), (1, 5), (1, 3), (2, 7)
    ]  # fmt: skip
    assert pairs(request_rows(((0, 1), (2,)), [[], [7]])) == [(2, 7)]
    assert request_rows(((0, 1), (2,)), [[], []]).shape == (0, 2)
    with pytest.raises(ValueError, match="2 groups"):
        request_rows(((0, 1), (2,)), [[1]])


def test_identity_differences_name_each_field() -> None:
    mine = PeerIdentity((("model", "a"), ("tp_size", "2"), ("dtype", "bf16")))
    theirs = PeerIdentity((("model", "b"), ("tp_size", "4"), ("dtype", "bf16"), ("rank", "0")))
    assert mine.differences(theirs) == ["model 'a' != 'b'", "tp_size '2' != '4'",
                                        "rank (missing) != '0'"]  # fmt: skip
    assert mine.differences(mine) == []
    with pytest.raises(ValueError, match="twice"):
        PeerIdentity((("model", "a"), ("model", "b")))


@pytest.mark.parametrize("connections", [1, 2])
def test_pull_copies_random_rows_exactly(connections: int) -> None:
    rng = random.Random(connections)
    with peers(connections=connections) as (prefill, server, decode, client):
        for round_ in range(3):
            remote = [rng.sample(range(NUM_BLOCKS), 5), rng.sample(range(NUM_BLOCKS), 3)]
            local = [rng.sample(range(NUM_BLOCKS), 5), rng.sample(range(NUM_BLOCKS), 3)]
            decode.rows.commits.clear()
            server.offer(f"req-{round_}", remote, deadline())
            received = client.pull(*server.address, f"req-{round_}", remote, local)
            assert received == 5 * (512 + 512) + 3 * 256
            assert same_blocks(prefill, remote, decode, local)
            committed = sorted(row for part in decode.rows.commits for row in part)
            assert committed == sorted(pairs(request_rows(GROUPS, local)))  # each row once
        assert wait_done(server, 3) == [("req-0", True), ("req-1", True), ("req-2", True)]
        counters = server.counters
        assert counters.pulls == 3 * connections and counters.refused == counters.errors == 0
        assert counters.connections == connections  # the pooled connections were reused


def test_pull_of_part_of_an_offer_and_an_empty_group() -> None:
    with peers() as (prefill, server, decode, client):
        server.offer("req", [[1, 2, 3, 4], [5, 6]], deadline())
        assert client.pull(*server.address, "req", [[2, 4], []], [[10, 11], []]) == 2 * 1024
        assert same_blocks(prefill, [[2, 4], []], decode, [[10, 11], []])
        assert wait_done(server, 1) == [("req", True)]


def test_concurrent_pulls_from_threads() -> None:
    requests = {
        f"req-{i}": ([[i, (i + 1) % NUM_BLOCKS], [i]], [[i, 15 - i], [i]]) for i in range(8)
    }
    with peers(connections=2) as (prefill, server, decode, client):
        for req_id, (remote, _) in requests.items():
            server.offer(req_id, remote, deadline())
        with ThreadPoolExecutor(4) as pool:
            futures = [
                pool.submit(client.pull, *server.address, req_id, remote, local)
                for req_id, (remote, local) in requests.items()
            ]
            assert all(f.result(timeout=10) == 2 * 1024 + 256 for f in futures)
        for remote, local in requests.values():
            assert same_blocks(prefill, remote, decode, local)
        assert wait_done(server, 8) == sorted((req_id, True) for req_id in requests)


def test_every_thread_of_a_pull_waits_for_its_event_before_committing() -> None:
    """On a GPU a step in flight may still use the blocks a pull fills: each thread that
    commits a part waits for the engine's event first (``BlockRows.wait_for``); a pull given
    none waits for nothing."""
    ready = cast(torch.cuda.Event, object())  # no CUDA event here: the rows are handed it
    with peers(connections=2) as (_, server, decode, client):
        server.offer("req", [[1, 2, 3, 4], [5, 6]], deadline())
        client.pull(*server.address, "req", [[1, 2, 3, 4], [5, 6]], [[8, 9, 10, 11], [12, 13]],
                    ready)  # fmt: skip
        calls = list(decode.rows.calls)
        server.offer("plain", [[1], [5]], deadline())
        client.pull(*server.address, "plain", [[1], [5]], [[8], [12]])
        assert [what for what, _, _ in decode.rows.calls[len(calls) :]] == ["commit"] * 2
    threads = {thread for _, thread, _ in calls}
    assert len(threads) == 2  # two parts, on two threads
    for thread in threads:
        mine = [(what, event) for what, name, event in calls if name == thread]
        assert mine[0] == ("wait", ready), mine
        assert [what for what, _ in mine[1:]] == ["commit"] * (len(mine) - 1) and len(mine) > 1


def test_transfer_threads_bind_once_when_they_start() -> None:
    """Two pulls of two parts each: a server thread binds once per connection, not per pull.
    The parts take one or two connections (a part whose helper thread starts late, on a busy
    machine, finds the other part's connection idle already)."""
    with peers(connections=2) as (_, server, decode, client):
        for req_id in ("first", "second"):
            server.offer(req_id, [[1, 2], [3]], deadline())
            client.pull(*server.address, req_id, [[1, 2], [3]], [[4, 5], [6]])
        assert any(name.startswith("kvtier-pull") for name in decode.rows.bound_threads)
        assert threading.current_thread().name not in decode.rows.bound_threads
    connections = server.counters.connections  # the server's threads are joined by now
    assert 1 <= connections <= 2
    bound = server._rows.bound_threads  # type: ignore[attr-defined]
    assert bound == ["kvtier-transfer-conn"] * connections


def test_mismatched_lengths_are_a_value_error_naming_the_group() -> None:
    with peers() as (_, server, _decode, client):
        with pytest.raises(ValueError, match="group 1: 2 remote_block_ids but 1 local"):
            client.pull(*server.address, "req", [[1], [2, 3]], [[1], [2]])
        with pytest.raises(ValueError, match="layout has 2"):
            client.pull(*server.address, "req", [[1]], [[1]])


def test_rows_split_into_balanced_contiguous_parts() -> None:
    rows = np.array([(0, b) for b in range(5)] + [(1, b) for b in range(5)], dtype=np.int64)
    parts = _split(rows, (100, 300), 2)
    assert [(p.start, p.stop, p.nbytes) for p in parts] == [(0, 7, 1100), (7, 10, 900)]
    assert [(p.start, p.stop) for p in _split(rows[:1], (100, 300), 4)] == [(0, 1)]
    assert [p.nbytes for p in _split(rows, (100, 300), 3)] == [800, 600, 600]
    assert _split(rows[:0], (100,), 2) == []
    assert [p.nbytes for p in _split(rows, (100, 300), 4, min_bytes=900)] == [1100, 900]
    assert [p.nbytes for p in _split(rows, (100, 300), 4, min_bytes=5000)] == [2000]


def test_a_small_pull_is_not_split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "MIN_PART_BYTES", 2048)  # this pull is 2304 bytes
    with peers(connections=2) as (prefill, server, decode, client):
        server.offer("req", [[1, 2], [3]], deadline())
        client.pull(*server.address, "req", [[1, 2], [3]], [[4, 5], [6]])
        assert same_blocks(prefill, [[1, 2], [3]], decode, [[4, 5], [6]])
        assert server.counters.pulls == 1 and server.counters.connections == 1


@pytest.mark.parametrize(
    ("setting", "message"),
    [({"connections": 0}, "connections must be >= 1, got 0"),
     ({"concurrent_pulls": 0}, "concurrent_pulls must be >= 1, got 0"),
     ({"timeout_s": 0.0}, "timeout_s must be > 0, got 0.0")],
)  # fmt: skip
def test_a_client_with_a_bad_setting_is_refused_naming_it(
    setting: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        TransferClient(Engine(seed=1).rows, IDENTITY, SECRET, **setting)  # type: ignore[arg-type]

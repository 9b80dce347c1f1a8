"""A pull moves its rows a slice at a time, as staged rows (``CudaBlockRows``) need: the server
announces each slice before it sends the one before (``read_ahead``), the client commits each
slice it received and flushes before the pull returns; with rows that stage every slice, the
rows still arrive byte-exact, each committed once.

``StagedRows`` stages on the CPU as ``CudaBlockRows`` does on a device: a read hands out a copy
(made when it was announced, else then), a write a buffer of the thread's, each one view for
the whole slice, and a commit lands in the engine only when the thread flushes: a client that
forgot to commit or flush leaves other bytes in the blocks."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from peer_setup import GROUPS, NUM_BLOCKS, Engine, SpyRows, deadline, pairs, peers, same_blocks

from kvtier.tiers.peer.net import client as client_module
from kvtier.tiers.peer.net import request_rows, server
from kvtier.tiers.peer.net.base import Rows, slices

SLICE = 1024  # two full rows, or four packed ones


class StagedRows(SpyRows):
    def __init__(self, views: Sequence[torch.Tensor], groups: Sequence[Sequence[int]]) -> None:
        super().__init__(views, groups)
        self.local = threading.local()
        self.lock = threading.Lock()
        self.reads = self.read_ahead_hits = self.flushes = 0

    def read_ahead(self, rows: Rows) -> None:
        self.local.ahead = (rows, self._copies(super().read_rows(rows)))

    def read_rows(self, rows: Rows) -> list[memoryview]:
        ahead, self.local.ahead = getattr(self.local, "ahead", None), None
        announced = ahead[1] if ahead is not None and ahead[0] is rows else None
        with self.lock:
            self.reads += 1
            self.read_ahead_hits += announced is not None
        return [announced if announced is not None else self._copies(super().read_rows(rows))]

    def write_rows(self, rows: Rows) -> list[memoryview]:
        self.local.received = self._copies(super().write_rows(rows))
        return [self.local.received]

    def commit(self, rows: Rows) -> None:
        super().commit(rows)
        pending = getattr(self.local, "pending", [])
        pending.append((rows.copy(), self.local.received))
        self.local.pending = pending

    def flush(self) -> None:
        for rows, received in getattr(self.local, "pending", []):
            offset = 0
            for place in super().write_rows(rows):
                place[:] = received[offset : offset + place.nbytes]
                offset += place.nbytes
            assert offset == received.nbytes
        self.local.pending = []
        with self.lock:
            self.flushes += 1

    @staticmethod
    def _copies(views: list[memoryview]) -> memoryview:
        """The rows' bytes, back to back in one buffer."""
        return memoryview(bytearray(b"".join(views)))


@pytest.fixture(autouse=True)
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "READ_SLICE_BYTES", SLICE)
    monkeypatch.setattr(client_module, "WRITE_SLICE_BYTES", SLICE)
    monkeypatch.setattr(client_module, "MIN_PART_BYTES", 1)  # every connection has a part


@pytest.mark.parametrize("connections", [1, 2])
def test_staged_rows_arrive_exact_a_slice_at_a_time(connections: int) -> None:
    rng = random.Random(7 + connections)
    prefill, decode = Engine(seed=1, rows=StagedRows), Engine(seed=2, rows=StagedRows)
    sending, receiving = prefill.rows, decode.rows
    assert isinstance(sending, StagedRows) and isinstance(receiving, StagedRows)
    with peers(connections=connections, prefill=prefill, decode=decode) as (_, srv, _, client):
        for round_ in range(3):
            remote = [rng.sample(range(NUM_BLOCKS), 6), rng.sample(range(NUM_BLOCKS), 5)]
            local = [rng.sample(range(NUM_BLOCKS), 6), rng.sample(range(NUM_BLOCKS), 5)]
            receiving.commits.clear()
            reads, hits, flushes = sending.reads, sending.read_ahead_hits, receiving.flushes
            srv.offer(f"req-{round_}", remote, deadline())
            received = client.pull(*srv.address, f"req-{round_}", remote, local)
            assert received == 6 * (512 + 512) + 5 * 256
            assert same_blocks(prefill, remote, decode, local)
            committed = [row for piece in receiving.commits for row in piece]
            assert sorted(committed) == sorted(pairs(request_rows(GROUPS, local)))  # each once
            assert len(receiving.commits) > connections  # in slices, not whole parts
            assert receiving.flushes - flushes == connections  # each part flushed once
            # every read but each part's first was announced by the read before
            assert sending.reads - reads - connections == sending.read_ahead_hits - hits > 0


def test_slices_keep_the_order_and_a_large_row_alone() -> None:
    rows = np.array([(0, 1), (0, 2), (2, 3), (1, 4), (2, 5), (2, 6)], dtype=np.int64)
    sizes = (512, 2048, 256)

    def cut(limit: int, rows: Rows = rows) -> list[list[tuple[int, int]]]:
        return [pairs(piece) for piece in slices(rows, sizes, limit)]

    listed = pairs(rows)
    assert cut(1024) == [listed[:2], listed[2:3], listed[3:4], listed[4:]]
    assert cut(3584) == [listed[:5], listed[5:]]
    assert cut(1024, rows[:0]) == []

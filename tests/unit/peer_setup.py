"""Shared by the test_peer_* files: two small CPU engines, a server and a client between them.

Each engine has 16 blocks in three views: group 0 uses views 0 and 1 (pages of 512 bytes), group 1
uses view 2 (256-byte pages in rows 384 bytes apart: the engine packs other data between blocks).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from kvtier.tiers.peer.net import CpuBlockRows, PeerIdentity, TransferClient, TransferServer
from kvtier.tiers.peer.net.base import Rows

SECRET = b"kvtier-test-secret-0123456789abcdef"
IDENTITY = PeerIdentity(
    (
        ("model", "tiny"),
        ("dtype", "float32"),
        ("layout", "cpu-v1"),
        ("tp_size", "1"),
        ("tp_rank", "0"),
        ("block_tokens", "16"),
    )
)
NUM_BLOCKS = 16
GROUPS = ((0, 1), (2,))
WAIT_S = 5.0  # bound on every wait in a test


class Engine:
    """Three views of random words; ``rows`` records which threads bound and what was committed."""

    def __init__(self, seed: int, rows: type[SpyRows] | None = None) -> None:
        generator = torch.Generator().manual_seed(seed)
        full = [torch.randint(-(2**62), 2**62, (NUM_BLOCKS, 64), generator=generator) for _ in "kv"]
        packed = torch.randint(-(2**62), 2**62, (NUM_BLOCKS, 48), generator=generator)
        self.views = [*full, packed[:, :32]]  # view 2: rows of 32 words, 48 apart
        self.rows = (rows or SpyRows)(self.views, GROUPS)

    def blocks(self, group: int, ids: Sequence[int]) -> list[torch.Tensor]:
        return [self.views[v][b].clone() for v in GROUPS[group] for b in ids]


class SpyRows(CpuBlockRows):
    def __init__(self, views: Sequence[torch.Tensor], groups: Sequence[Sequence[int]]) -> None:
        super().__init__(views, groups)
        self.commits: list[list[tuple[int, int]]] = []
        self.bound_threads: list[str] = []
        self.calls: list[tuple[str, str, object]] = []  # (commit or wait, thread, event waited)

    def commit(self, rows: Rows) -> None:
        super().commit(rows)
        self.commits.append(pairs(rows))
        self.calls.append(("commit", threading.current_thread().name, None))

    def wait_for(self, ready: torch.cuda.Event) -> None:
        self.calls.append(("wait", threading.current_thread().name, ready))

    def bind_thread(self) -> None:
        self.bound_threads.append(threading.current_thread().name)


class StallingRows(SpyRows):
    """Serves the first read, then waits for ``stall`` (the test closes the server meanwhile)."""

    def __init__(self, views: Sequence[torch.Tensor], stall: threading.Event,
                 stalled: threading.Event) -> None:  # fmt: skip
        super().__init__(views, GROUPS)
        self.stall, self.stalled, self.reads = stall, stalled, 0

    def read_rows(self, rows: Rows) -> list[memoryview]:
        self.reads += 1
        if self.reads == 2:
            self.stalled.set()
            self.stall.wait(WAIT_S)
        return super().read_rows(rows)


def pairs(rows: Rows) -> list[tuple[int, int]]:
    """``rows`` as ``(view, block)`` pairs."""
    return [(view, block) for view, block in rows.tolist()]


def same_blocks(
    src: Engine, src_ids: Sequence[Sequence[int]], dst: Engine, dst_ids: Sequence[Sequence[int]]
) -> bool:
    return all(
        torch.equal(a, b)
        for g in range(len(GROUPS))
        for a, b in zip(src.blocks(g, src_ids[g]), dst.blocks(g, dst_ids[g]))
    )


@contextmanager
def peers(
    *,
    connections: int = 2,
    client_secret: bytes = SECRET,
    client_identity: PeerIdentity = IDENTITY,
    offer_wait_s: float = 0.3,
    timeout_s: float = WAIT_S,
    prefill: Engine | None = None,
    decode: Engine | None = None,
    **server_options: Any,
) -> Iterator[tuple[Engine, TransferServer, Engine, TransferClient]]:
    """A prefill engine with its server and a decode engine with its client, closed after."""
    prefill = prefill or Engine(seed=1)
    decode = decode or Engine(seed=2)
    server = TransferServer(
        prefill.rows, IDENTITY, SECRET, offer_wait_s=offer_wait_s, **server_options
    )
    client = TransferClient(
        decode.rows, client_identity, client_secret, timeout_s=timeout_s, connections=connections
    )
    try:
        yield prefill, server, decode, client
    finally:
        client.close()
        server.close()
    server.check_integrity()


def deadline(seconds: float = 30.0) -> float:
    return time.monotonic() + seconds


def wait_done(server: TransferServer, count: int) -> list[tuple[str, bool]]:
    """``take_done`` until it reported ``count`` offers (a RELEASE is not acknowledged)."""
    done: list[tuple[str, bool]] = []
    give_up = time.monotonic() + WAIT_S
    while len(done) < count and time.monotonic() < give_up:
        done += server.take_done()
        if len(done) < count:
            time.sleep(0.005)
    return sorted(done)

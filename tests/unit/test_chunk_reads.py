"""A load's chunks read several at once (``chunk_reads.py``): reads side by side, every bad one
named, the prefetch order a tier counts on, no read left writing after an error, how many
readers a disk tier takes."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from chunk_files import FP, chunk_keys, run_job, store_chunks
from disk_io_setup import (
    TRIMMED,
    disk_layout,
    engine_bytes,
    flip_payload_byte,
    remove_file,
)

from kvtier.addresses import TierChunks
from kvtier.keys import ChunkKey, key_group
from kvtier.tiers.base.chunk_io import TierLoadHandler
from kvtier.tiers.base.chunk_reads import ChunkRead, ChunkReader
from kvtier.tiers.disk.files import DiskTier, default_readers


class BarrierTier(DiskTier):
    """Each read waits until ``barrier.parties`` reads are in progress at once."""

    barrier: threading.Barrier

    def read(self, key: bytes, out: Sequence[np.ndarray]) -> None:
        self.barrier.wait()
        super().read(key, out)


def test_readers_read_chunks_beside_each_other_and_name_every_bad_one(tmp_path: Path) -> None:
    factor, engine, groups, _ = TRIMMED
    tier = BarrierTier(tmp_path, 0, FP, "test layout", disk_layout(), factor)
    tier.barrier = threading.Barrier(2, timeout=10.0)  # one reader alone: BrokenBarrierError
    keys = chunk_keys(groups)
    store_chunks(tier, keys)
    flip_payload_byte(tier, keys, 1)
    remove_file(tier, keys, 3)
    before = engine_bytes(tier.layout)
    handler = TierLoadHandler(tier.layout, tier, "disk", readers=2)
    result = run_job(handler, 1, TierChunks("disk", keys), engine)
    handler.shutdown()
    # chunks 0 and 1 read together, then 2 and 3: a batch with a bad chunk moves none of it
    assert (result.success, result.bad, result.bytes) == (False, (1, 3), 0)
    assert handler.bad_chunks == 2
    assert [tier.path(key).exists() for key in keys] == [True, False, True, False]
    assert engine_bytes(tier.layout) == before
    with pytest.raises(ValueError, match="readers must be >= 1, got 0"):
        TierLoadHandler(tier.layout, tier, "disk", readers=0)


class RecordingTier(DiskTier):
    """Records its prefetches and reads, by the key's position in ``keys``."""

    keys: tuple[ChunkKey, ...]
    read_ahead = 2

    def prefetch(self, key: bytes) -> None:
        self.events.append(f"prefetch {self.keys.index(ChunkKey(key))}")
        super().prefetch(key)

    def read(self, key: bytes, out: Sequence[np.ndarray]) -> None:
        self.events.append(f"read {self.keys.index(ChunkKey(key))}")
        super().read(key, out)


def test_one_reader_prefetches_each_chunk_as_far_ahead_as_the_tier_asks(tmp_path: Path) -> None:
    # a tier whose replies come in its prefetches' order (Redis) counts on it
    factor, engine, groups, _ = TRIMMED
    tier = RecordingTier(tmp_path, 0, FP, "test layout", disk_layout(), factor)
    tier.keys, tier.events = chunk_keys(groups), []
    store_chunks(tier, tier.keys)
    handler = TierLoadHandler(tier.layout, tier, "disk")
    assert run_job(handler, 1, TierChunks("disk", tier.keys), engine).success
    handler.shutdown()
    assert tier.events == ["prefetch 0", "prefetch 1", "prefetch 2", "read 0", "prefetch 3",
                           "read 1", "read 2", "read 3"]  # fmt: skip
    # a batch of several (a GPU's staging half): each chunk's turn still comes right before it
    into = [np.empty(sum(tier.view_bytes(key_group(key))), np.uint8) for key in tier.keys]
    for readers, order in [(1, ["turn 0", "read 0", "turn 1", "read 1", "turn 2", "read 2"]),
                           (3, ["turn 0", "turn 1", "turn 2"])]:  # fmt: skip
        tier.events = []
        reader = ChunkReader(tier, "disk", readers)
        good = reader.read(tier.keys[:3], into[:3], lambda i: tier.events.append(f"turn {i}"))
        reader.shutdown()
        assert good == [True] * 3
        assert tier.events[: len(order)] == order and len(tier.events) == 6


class SecondBatchTier(RecordingTier):
    """Says when chunks 2 and 3 (a second batch of two) have been read."""

    second: threading.Event

    def read(self, key: bytes, out: Sequence[np.ndarray]) -> None:
        super().read(key, out)
        if {"read 2", "read 3"} <= set(self.events):
            self.second.set()


def test_several_readers_read_the_next_batch_while_one_is_moved(tmp_path: Path) -> None:
    """Readers beside each other never wait for a move: a batch's reads are handed to them
    before the batch before it is waited for and moved (into the other staging half), so they
    end while that move is under way; the blocks are those a load by one reader fills. They ask
    the kernel to read nothing ahead: they keep the disk busy themselves, and a file read ahead
    lands in the page cache in small pages, which later loads from the cache copy slower."""
    factor, engine, groups, _ = TRIMMED
    tier = SecondBatchTier(tmp_path, 0, FP, "test layout", disk_layout(), factor)
    tier.keys, tier.events, tier.second = chunk_keys(groups), [], threading.Event()
    store_chunks(tier, tier.keys)
    one = TierLoadHandler(tier.layout, tier, "disk")
    for view in tier.layout.views:
        view.zero_()
    assert run_job(one, 1, TierChunks("disk", tier.keys), engine).success
    one.shutdown()
    loaded = engine_bytes(tier.layout)
    for view in tier.layout.views:
        view.zero_()
    two = TierLoadHandler(tier.layout, tier, "disk", readers=2)
    move = two._move

    def moving(half: int, staged: list[tuple[int, ChunkRead]]) -> None:
        chunks = [read.chunk for _, read in staged]
        if chunks == [0, 1]:  # the second batch is read meanwhile (else: never, until it is)
            assert tier.second.wait(10.0), "the second batch was not read during the first move"
        tier.events.append(f"move {chunks}")
        move(half, staged)

    two._move = moving  # type: ignore[method-assign]
    tier.events, tier.second = [], threading.Event()  # (the load by one reader set the first)
    assert run_job(two, 2, TierChunks("disk", tier.keys), engine).success
    two.shutdown()
    assert not [event for event in tier.events if event.startswith("prefetch")]
    assert [event for event in tier.events if event.startswith("move")] == [
        "move [0, 1]",
        "move [2, 3]",
    ]
    assert engine_bytes(tier.layout) == loaded


class FailingTier(DiskTier):
    """Chunk 0's read fails as no tier should (a bug); chunk 1's then fills its buffer."""

    keys: tuple[ChunkKey, ...]

    def read(self, key: bytes, out: Sequence[np.ndarray]) -> None:
        if key == self.keys[0]:
            self.failed.set()
            raise RuntimeError("a bug in a tier")
        assert self.failed.wait(10.0)
        out[0][:] = 7  # still writing while the reader's caller would already hold the error
        self.filled.set()


def test_a_reader_that_raises_returns_only_once_every_read_is_done(tmp_path: Path) -> None:
    """A staging buffer is reused by the next job: no read may still write into it then."""
    tier = FailingTier(tmp_path, 0, FP, "test layout", disk_layout(), 1)
    tier.keys, tier.failed, tier.filled = chunk_keys((0, 0)), threading.Event(), threading.Event()
    reader = ChunkReader(tier, "disk", readers=2)
    buffers = [np.zeros(32 << 20, np.uint8) for _ in range(2)]
    with pytest.raises(RuntimeError, match="a bug in a tier"):
        reader.read(tier.keys, buffers)
    assert tier.filled.is_set()
    reader.shutdown()


@pytest.mark.parametrize(("cpus", "readers"), [(1, 1), (2, 1), (7, 1), (8, 2), (16, 4), (96, 4)])
def test_a_gpu_engines_disk_tier_reads_a_file_at_once_per_four_cpus(
    monkeypatch: pytest.MonkeyPatch, cpus: int, readers: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    assert default_readers("cuda") == readers
    assert default_readers("cpu") == 1  # a CPU engine's cores compute its forward

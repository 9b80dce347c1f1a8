"""Disk -> engine loads and host -> disk writes on CPU tensors, byte-exact, several groups.

Layout: groups 0 and 2 alias the same two layer buffers (pages of 512 B), group 1 has its own
layer (pages of 128 B). A load names its chunks by key, flattened group by group; each case writes
out where every engine block's bytes come from: (group, engine block) -> (chunk position in the
job, sub-block of that chunk).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch
from disk_faults import full_disk_for

from kvtier.addresses import EngineBlocks, HostChunks, TierChunks, TransferSpec
from kvtier.keys import ChunkKey, key_group, make_key
from kvtier.layout import KVLayout, build_layout
from kvtier.pages import PageMover
from kvtier.tiers.base.chunk_format import HEADER_BYTES, Buffer
from kvtier.tiers.base.chunk_io import TierLoadHandler, TierWriteHandler, staged_grids
from kvtier.tiers.base.chunk_reads import ChunkRead, ChunkReader
from kvtier.tiers.base.handler import TransferResult
from kvtier.tiers.base.records import RecordLayout
from kvtier.tiers.disk.files import DiskTier, default_readers
from kvtier.tiers.host.buffers import HostTier

NUM_BLOCKS, NUM_CHUNKS = 24, 6
FP = bytes(range(16))  # the layout fingerprint digest in the file headers
KEY_FP = bytes(range(100, 116))  # the fingerprint part of the chunk keys


class Case(NamedTuple):
    factor: int
    engine: EngineBlocks
    chunk_groups: tuple[int, ...]  # the group of each chunk of the job, in key order
    map: dict[tuple[int, int], tuple[int, int]]  # (group, block) -> (chunk position, sub-block)


CASES = {
    "factor 1": Case(
        factor=1,
        engine=EngineBlocks(
            np.array([0, 1, 9, 10]), group_sizes=(2, 0, 2), block_indices=(0, 3, 5)
        ),
        chunk_groups=(0, 0, 2, 2),
        map={(0, 0): (0, 0), (0, 1): (1, 0), (2, 9): (2, 0), (2, 10): (3, 0)},
    ),
    "factor 3, group 2 trimmed at both ends": Case(
        factor=3,
        engine=EngineBlocks(
            np.array([0, 1, 2, 3, 4, 5, 9, 10, 11, 12]),
            group_sizes=(6, 0, 4),
            block_indices=(0, 7, 4),
        ),
        chunk_groups=(0, 0, 2, 2),
        map={
            (0, 0): (0, 0),
            (0, 1): (0, 1),
            (0, 2): (0, 2),
            (0, 3): (1, 0),
            (0, 4): (1, 1),
            (0, 5): (1, 2),
            (2, 9): (2, 1),
            (2, 10): (2, 2),
            (2, 11): (3, 0),
            (2, 12): (3, 1),
        },
    ),
    "factor 3, every group mid-chunk": Case(
        factor=3,
        engine=EngineBlocks(
            np.array([14, 15, 20, 7, 3]), group_sizes=(0, 2, 3), block_indices=(5, 4, 8)
        ),
        chunk_groups=(1, 2, 2),
        map={(1, 14): (0, 1), (1, 15): (0, 2), (2, 20): (1, 2), (2, 7): (2, 0), (2, 3): (2, 1)},
    ),
}
TRIMMED = CASES["factor 3, group 2 trimmed at both ends"]


def _layout() -> KVLayout:
    torch.manual_seed(0)
    backing = torch.randn(2 * NUM_BLOCKS * 2 * 8 * 8)  # two layers shared by groups 0 and 2
    shared = [backing.view(2, NUM_BLOCKS, 2, 8, 8)[i] for i in range(2)]
    caches = {"full.0": shared[0], "full.1": shared[1], "own.0": torch.randn(NUM_BLOCKS, 4, 8)}
    caches |= {"swa.0": shared[0], "swa.1": shared[1]}
    return build_layout(caches, [["full.0", "full.1"], ["own.0"], ["swa.0", "swa.1"]], NUM_BLOCKS)


def _tier(root: Path, factor: int) -> DiskTier:
    return DiskTier(root, 0, FP, "test layout", _layout(), factor)


def _keys(groups: Sequence[int]) -> tuple[ChunkKey, ...]:
    return tuple(make_key(KEY_FP, position, group) for position, group in enumerate(groups))


def _store_chunks(tier: DiskTier, keys: Sequence[ChunkKey]) -> list[list[np.ndarray]]:
    """Write a file of random bytes for every key; returns each chunk's views as (factor, page)."""
    rng = np.random.default_rng(1)
    chunks = []
    for key in keys:
        views = [rng.integers(0, 256, n, dtype=np.uint8) for n in tier.view_bytes(key_group(key))]
        tier.write(key, views)
        chunks.append([view.reshape(tier.factor, -1) for view in views])
    return chunks


def _engine_bytes(layout: KVLayout) -> list[list[bytes]]:
    return [[row.numpy().tobytes() for row in view] for view in layout.views]


def _run(
    handler: TierLoadHandler | TierWriteHandler, job_id: int, src: TransferSpec, dst: TransferSpec
) -> TransferResult:
    assert handler.transfer_async(job_id, src, dst)
    handler.wait([job_id])
    (result,) = handler.get_finished()
    assert result.job_id == job_id
    return result


def _page_bytes(layout: KVLayout, groups: Sequence[int]) -> int:
    return sum(layout.page_bytes[view] for group in groups for view in layout.groups[group])


# ---- TierLoadHandler ---------------------------------------------------------------------------


@pytest.mark.parametrize("readers", [1, 3])
@pytest.mark.parametrize("case", CASES)
def test_load_puts_every_block_and_nothing_else(tmp_path: Path, case: str, readers: int) -> None:
    factor, engine, groups, where = CASES[case]
    tier = _tier(tmp_path, factor)
    layout = tier.layout
    keys = _keys(groups)
    chunks = _store_chunks(tier, keys)
    before = _engine_bytes(layout)
    handler = TierLoadHandler(layout, tier, "disk", readers)
    result = _run(handler, 1, TierChunks("disk", keys), engine)
    handler.shutdown()

    assert result.success and result.bad == ()
    after = _engine_bytes(layout)
    loaded: set[tuple[int, int]] = set()
    for (group, block), (position, sub) in where.items():
        for i, view in enumerate(layout.groups[group]):
            assert after[view][block] == chunks[position][i][sub].tobytes()
            loaded.add((view, block))
    for view in range(len(layout.views)):
        for block in range(NUM_BLOCKS):
            if (view, block) not in loaded:
                assert after[view][block] == before[view][block]
    assert handler.bad_chunks == 0
    assert all(tier.path(key).exists() for key in keys)  # a load leaves the files in place


@pytest.mark.parametrize(
    "case",
    [
        "factor 1",
        "factor 3, group 2 trimmed at both ends",
        "factor 3, every group mid-chunk",
    ],
)
def test_load_reports_the_bytes_it_put_in_the_engine(tmp_path: Path, case: str) -> None:
    # as the engine <-> host handlers do: TierStats.loaded_bytes means the same for every tier
    factor, engine, groups, where = CASES[case]
    tier = _tier(tmp_path, factor)
    keys = _keys(groups)
    _store_chunks(tier, keys)
    handler = TierLoadHandler(tier.layout, tier, "disk")
    result = _run(handler, 1, TierChunks("disk", keys), engine)
    handler.shutdown()
    assert result.bytes == _page_bytes(tier.layout, [group for group, _ in where])


def _flip_payload_byte(tier: DiskTier, keys: Sequence[ChunkKey], position: int) -> None:
    path = tier.path(keys[position])
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 5] ^= 0x01
    path.write_bytes(bytes(data))


def _cut_last_byte(tier: DiskTier, keys: Sequence[ChunkKey], position: int) -> None:
    path = tier.path(keys[position])
    os.truncate(path, path.stat().st_size - 1)


def _put_another_chunks_file(tier: DiskTier, keys: Sequence[ChunkKey], position: int) -> None:
    tier.path(keys[position]).write_bytes(tier.path(keys[0]).read_bytes())


def _remove(tier: DiskTier, keys: Sequence[ChunkKey], position: int) -> None:
    tier.path(keys[position]).unlink()


DAMAGE = {
    "payload byte flipped": _flip_payload_byte,
    "one byte short": _cut_last_byte,
    "another chunk's file": _put_another_chunks_file,
    "file missing": _remove,
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_bad_chunk_fails_the_load_before_its_blocks(tmp_path: Path, damage: str) -> None:
    factor, engine, groups, _ = TRIMMED
    tier = _tier(tmp_path, factor)
    layout = tier.layout
    keys = _keys(groups)
    chunks = _store_chunks(tier, keys)
    DAMAGE[damage](tier, keys, 1)  # the second of four chunks: engine blocks 3, 4, 5
    before = _engine_bytes(layout)
    handler = TierLoadHandler(layout, tier, "disk")
    result = _run(handler, 1, TierChunks("disk", keys), engine)
    handler.shutdown()

    assert not result.success
    assert result.bad == (1,)
    assert result.bytes == _page_bytes(layout, [0, 0, 0])  # chunk 0 only
    assert handler.bad_chunks == 1
    assert not tier.path(keys[1]).exists()
    assert [tier.path(keys[p]).exists() for p in (0, 2, 3)] == [True, True, True]
    after = _engine_bytes(layout)
    for i, view in enumerate(layout.groups[0]):  # views 0 and 1, shared with group 2
        for block, sub in [(0, 0), (1, 1), (2, 2)]:  # chunk 0 was verified and loaded
            assert after[view][block] == chunks[0][i][sub].tobytes()
        for block in [3, 4, 5, 9, 10, 11, 12]:  # the bad chunk's blocks and those after it
            assert after[view][block] == before[view][block]
    assert after[2] == before[2]  # group 1's view


def test_a_failed_load_names_every_bad_chunk_of_its_job(tmp_path: Path) -> None:
    # one pass over a damaged tier drops every bad file, not only the first of each job
    factor, engine, groups, _ = TRIMMED
    tier = _tier(tmp_path, factor)
    layout = tier.layout
    keys = _keys(groups)
    chunks = _store_chunks(tier, keys)
    _flip_payload_byte(tier, keys, 1)
    _remove(tier, keys, 3)  # unreadable counts as bad too
    before = _engine_bytes(layout)
    handler = TierLoadHandler(layout, tier, "disk")
    result = _run(handler, 1, TierChunks("disk", keys), engine)
    handler.shutdown()

    assert not result.success
    assert result.bad == (1, 3)  # positions in the job's key order
    assert handler.bad_chunks == 2
    assert [tier.path(key).exists() for key in keys] == [True, False, True, False]
    assert result.bytes == _page_bytes(layout, [0, 0, 0])  # chunk 0, before the first bad one
    after = _engine_bytes(layout)
    for i, view in enumerate(layout.groups[0]):
        for block, sub in [(0, 0), (1, 1), (2, 2)]:
            assert after[view][block] == chunks[0][i][sub].tobytes()
        for block in [3, 4, 5, 9, 10, 11, 12]:  # chunk 2 was verified, not loaded: recomputed
            assert after[view][block] == before[view][block]


class BarrierTier(DiskTier):
    """Each read waits until ``barrier.parties`` reads are in progress at once."""

    barrier: threading.Barrier

    def read(self, key: bytes, out: Sequence[np.ndarray]) -> None:
        self.barrier.wait()
        super().read(key, out)


def test_readers_read_chunks_beside_each_other_and_name_every_bad_one(tmp_path: Path) -> None:
    factor, engine, groups, _ = TRIMMED
    tier = BarrierTier(tmp_path, 0, FP, "test layout", _layout(), factor)
    tier.barrier = threading.Barrier(2, timeout=10.0)  # one reader alone: BrokenBarrierError
    keys = _keys(groups)
    _store_chunks(tier, keys)
    _flip_payload_byte(tier, keys, 1)
    _remove(tier, keys, 3)
    before = _engine_bytes(tier.layout)
    handler = TierLoadHandler(tier.layout, tier, "disk", readers=2)
    result = _run(handler, 1, TierChunks("disk", keys), engine)
    handler.shutdown()
    # chunks 0 and 1 read together, then 2 and 3: a batch with a bad chunk moves none of it
    assert (result.success, result.bad, result.bytes) == (False, (1, 3), 0)
    assert handler.bad_chunks == 2
    assert [tier.path(key).exists() for key in keys] == [True, False, True, False]
    assert _engine_bytes(tier.layout) == before
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
    tier = RecordingTier(tmp_path, 0, FP, "test layout", _layout(), factor)
    tier.keys, tier.events = _keys(groups), []
    _store_chunks(tier, tier.keys)
    handler = TierLoadHandler(tier.layout, tier, "disk")
    assert _run(handler, 1, TierChunks("disk", tier.keys), engine).success
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
    tier = FailingTier(tmp_path, 0, FP, "test layout", _layout(), 1)
    tier.keys, tier.failed, tier.filled = _keys((0, 0)), threading.Event(), threading.Event()
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


def test_a_load_of_only_bad_chunks_names_them_all_and_loads_nothing(tmp_path: Path) -> None:
    factor, engine, groups, _ = TRIMMED
    tier = _tier(tmp_path, factor)
    keys = _keys(groups)
    _store_chunks(tier, keys)
    for position in range(len(keys)):
        _flip_payload_byte(tier, keys, position)
    before = _engine_bytes(tier.layout)
    handler = TierLoadHandler(tier.layout, tier, "disk")
    result = _run(handler, 1, TierChunks("disk", keys), engine)
    handler.shutdown()

    assert (result.success, result.bad, result.bytes) == (False, (0, 1, 2, 3), 0)
    assert handler.bad_chunks == 4
    assert not any(tier.path(key).exists() for key in keys)
    assert _engine_bytes(tier.layout) == before


def test_a_load_after_a_failed_one_is_whole(tmp_path: Path) -> None:
    factor, engine, groups, where = TRIMMED
    tier = _tier(tmp_path, factor)
    keys = _keys(groups)
    _store_chunks(tier, keys)
    _flip_payload_byte(tier, keys, 3)
    handler = TierLoadHandler(tier.layout, tier, "disk")
    assert not _run(handler, 1, TierChunks("disk", keys), engine).success
    chunks = _store_chunks(tier, keys)  # written again
    assert _run(handler, 2, TierChunks("disk", keys), engine).success
    handler.shutdown()
    after = _engine_bytes(tier.layout)
    for (group, block), (position, sub) in where.items():
        for i, view in enumerate(tier.layout.groups[group]):
            assert after[view][block] == chunks[position][i][sub].tobytes()


def test_a_key_of_another_group_is_refused(tmp_path: Path) -> None:
    factor, engine, _, _ = TRIMMED
    tier = _tier(tmp_path, factor)
    keys = _keys((0, 0, 0, 2))  # position 2 starts group 2's chunks but is keyed for group 0
    _store_chunks(tier, keys)
    before = _engine_bytes(tier.layout)
    handler = TierLoadHandler(tier.layout, tier, "disk")
    assert not handler.transfer_async(1, TierChunks("disk", keys), engine)
    handler.shutdown()
    assert handler.get_finished() == []
    assert _engine_bytes(tier.layout) == before


def test_a_key_count_other_than_the_chunks_spanned_is_refused(tmp_path: Path) -> None:
    factor, engine, groups, _ = TRIMMED
    tier = _tier(tmp_path, factor)
    keys = _keys(groups)
    _store_chunks(tier, keys)
    handler = TierLoadHandler(tier.layout, tier, "disk")
    assert not handler.transfer_async(1, TierChunks("disk", keys[:3]), engine)
    assert not handler.transfer_async(2, TierChunks("disk", (*keys, keys[3])), engine)
    handler.shutdown()
    assert handler.get_finished() == []


OUTSIDE_THE_LAYOUT = {
    "an engine block past the last": (
        EngineBlocks(np.array([0, NUM_BLOCKS]), group_sizes=(0, 2, 0), block_indices=(0, 0, 0)),
        (1, 1),
    ),
    "a fourth group": (
        EngineBlocks(np.array([0]), group_sizes=(0, 0, 0, 1), block_indices=(0, 0, 0, 0)),
        (3,),
    ),
}


@pytest.mark.parametrize("spec", list(OUTSIDE_THE_LAYOUT))
def test_a_load_outside_the_layout_is_refused(tmp_path: Path, spec: str) -> None:
    engine, groups = OUTSIDE_THE_LAYOUT[spec]
    tier = _tier(tmp_path, 1)
    keys = _keys(groups)
    for key in keys:
        if key_group(key) < len(tier.layout.groups):
            _store_chunks(tier, [key])
    handler = TierLoadHandler(tier.layout, tier, "disk")
    try:
        assert not handler.transfer_async(1, TierChunks("disk", keys), engine)
    finally:
        handler.shutdown()


@pytest.mark.parametrize("staged", [False, True], ids=["direct", "staged"])
@pytest.mark.parametrize("case", CASES)
def test_a_gpu_moves_staged_records_as_grids(case: str, staged: bool) -> None:
    """What a load on a GPU hands its ``PageMover`` (``staged_grids``: a grid per group), moved
    here on CPU tensors, by the mover's GPU steps (``staged``) and its CPU ones: each block gets
    its page of its record's slot, slots in another order than the job's chunks."""
    factor, _, groups, where = CASES[case]
    layout = _layout()
    records = RecordLayout.of(layout, factor)
    subs: dict[int, list[tuple[int, int]]] = {}  # chunk position -> [(sub-block, block)]
    for (_, block), (position, sub) in where.items():
        subs.setdefault(position, []).append((sub, block))
    reads = [ChunkRead(position, groups[position], np.array([b for _, b in sorted(pairs)]),
                       min(pairs)[0]) for position, pairs in sorted(subs.items())]  # fmt: skip
    slots = list(range(len(reads)))[::-1]
    stage = torch.randint(0, 256, (len(reads), records.record_bytes), dtype=torch.uint8)
    grids = staged_grids(records, list(zip(slots, reads, strict=True)), records.record_bytes)
    assert len(grids) == len({read.group for read in reads})
    PageMover(layout.views, staged=staged).load(grids, stage.view(-1))
    for slot, read in zip(slots, reads, strict=True):
        for view, offset in zip(layout.groups[read.group], records.offsets(read.group)):
            page = layout.page_bytes[view]
            for sub, block in enumerate(read.block_ids.tolist(), start=read.first):
                want = stage[slot, offset + sub * page : offset + (sub + 1) * page]
                assert torch.equal(layout.views[view][block].view(torch.uint8), want)


# ---- TierWriteHandler --------------------------------------------------------------------------


def _host(layout: KVLayout, factor: int) -> HostTier:
    host = HostTier(layout, NUM_CHUNKS, factor)
    memory = host.memory_np
    memory[:] = np.random.default_rng(factor).integers(0, 256, memory.shape, dtype=np.uint8)
    return host


def _slot_bytes(host: HostTier, tier: DiskTier, key: ChunkKey, slot: int) -> list[bytes]:
    """The chunk's record in ``slot``, view by view."""
    record = host.record(slot, key_group(key)).tobytes()
    edges = np.cumsum([0, *tier.view_bytes(key_group(key))]).tolist()
    return [record[a:b] for a, b in zip(edges[:-1], edges[1:])]


def _file_bytes(tier: DiskTier, key: ChunkKey) -> list[bytes]:
    out = [np.zeros(n, dtype=np.uint8) for n in tier.view_bytes(key_group(key))]
    tier.read(key, out)  # verified: raises if the file is bad
    return [o.tobytes() for o in out]


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and p.name.endswith(".tmp")]


def test_write_puts_each_slot_in_its_keys_file(tmp_path: Path) -> None:
    tier = _tier(tmp_path, 3)
    host = _host(tier.layout, 3)
    keys, slots = _keys((0, 1, 2)), [4, 0, 2]
    handler = TierWriteHandler(host, tier, "disk")
    result = _run(handler, 1, HostChunks(np.array(slots)), TierChunks("disk", keys))
    handler.shutdown()
    assert result.success and result.bad == ()
    assert result.bytes == sum(tier.file_bytes(group) for group in (0, 1, 2))
    for key, slot in zip(keys, slots):
        assert _file_bytes(tier, key) == _slot_bytes(host, tier, key, slot)
    files = sorted(p.name for p in tmp_path.rglob("*.kv"))
    assert files == sorted(tier.path(key).name for key in keys)
    assert _temp_files(tmp_path) == []
    assert handler.write_errors == 0


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """Holds a handler's writes until set; set at teardown too, so no thread waits forever."""
    event = threading.Event()
    yield event
    event.set()


def _hold_writes(monkeypatch: pytest.MonkeyPatch, tier: DiskTier, gate: threading.Event) -> None:
    write = tier.write

    def held(key: ChunkKey, payload: Sequence[Buffer]) -> int:
        gate.wait()
        return write(key, payload)

    monkeypatch.setattr(tier, "write", held)


def _write_then_overwrite_the_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gate: threading.Event, staged: bool
) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """(file bytes, slot bytes at submit, slot bytes after) of a write whose slot is reused."""
    tier = _tier(tmp_path, 3)
    host = _host(tier.layout, 3)
    (key,) = _keys((0,))
    handler = TierWriteHandler(host, tier, "disk")
    _hold_writes(monkeypatch, tier, gate)
    old = _slot_bytes(host, tier, key, 5)
    assert handler.transfer_async(1, HostChunks(np.array([5])), TierChunks("disk", (key,), staged))
    host.memory_np[5] = np.arange(host.record_bytes) % 251  # this step's store reuses slot 5
    new = _slot_bytes(host, tier, key, 5)
    gate.set()
    handler.wait([1])
    handler.shutdown()
    (result,) = handler.get_finished()
    assert result.success
    return _file_bytes(tier, key), old, new


def test_a_staged_write_copies_the_slot_when_submitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gate: threading.Event
) -> None:
    written, old, new = _write_then_overwrite_the_slot(tmp_path, monkeypatch, gate, staged=True)
    assert old != new
    assert written == old


def test_a_write_not_staged_reads_the_slot_when_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gate: threading.Event
) -> None:
    written, old, new = _write_then_overwrite_the_slot(tmp_path, monkeypatch, gate, staged=False)
    assert old != new
    assert written == new


def test_a_full_disk_skips_that_chunk_and_writes_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = _tier(tmp_path, 1)
    host = _host(tier.layout, 1)
    keys, slots = _keys((0, 1, 2)), [1, 2, 3]
    full_disk_for(monkeypatch, tier.path(keys[1]).name)
    handler = TierWriteHandler(host, tier, "disk")
    result = _run(handler, 1, HostChunks(np.array(slots)), TierChunks("disk", keys))
    handler.shutdown()
    assert not result.success
    assert result.bad == (1,)
    assert result.bytes == tier.file_bytes(0) + tier.file_bytes(2)
    assert handler.write_errors == 1
    assert not tier.path(keys[1]).exists()
    assert _file_bytes(tier, keys[0]) == _slot_bytes(host, tier, keys[0], 1)
    assert _file_bytes(tier, keys[2]) == _slot_bytes(host, tier, keys[2], 3)
    assert _temp_files(tmp_path) == []


@pytest.mark.parametrize(
    "slots, groups",
    [([0, 1], (0,)), ([0], (0, 1)), ([NUM_CHUNKS], (0,)), ([2, -1], (0, 1))],
    ids=["more slots than keys", "more keys than slots", "slot past the last", "negative slot"],
)
def test_a_write_with_bad_slots_is_refused(
    tmp_path: Path, slots: list[int], groups: tuple[int, ...]
) -> None:
    tier = _tier(tmp_path, 1)
    handler = TierWriteHandler(_host(tier.layout, 1), tier, "disk")
    assert not handler.transfer_async(
        1, HostChunks(np.array(slots)), TierChunks("disk", _keys(groups))
    )
    handler.shutdown()
    assert handler.get_finished() == []
    assert list(tmp_path.rglob("*.kv")) == []


def test_handlers_take_only_their_own_media(tmp_path: Path) -> None:
    tier = _tier(tmp_path, 1)
    load, write = (
        TierLoadHandler(tier.layout, tier, "disk"),
        TierWriteHandler(_host(tier.layout, 1), tier, "disk"),
    )
    engine = EngineBlocks(np.array([0]), (1, 0, 0), (0, 0, 0))
    with pytest.raises(TypeError, match="TierChunks -> EngineBlocks"):
        load.transfer_async(1, HostChunks(np.array([0])), engine)
    with pytest.raises(TypeError, match="HostChunks -> TierChunks"):
        write.transfer_async(2, engine, TierChunks("disk", _keys((0,))))
    load.shutdown()
    write.shutdown()

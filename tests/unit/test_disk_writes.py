"""Host -> disk writes (``TierWriteHandler``): each slot in its key's file, staged and not,
a full disk, bad slots, media (``disk_io_setup.py``: the layout)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from chunk_files import chunk_keys, run_job
from disk_faults import full_disk_for
from disk_io_setup import (
    NUM_CHUNKS,
    disk_tier,
)

from kvtier.addresses import EngineBlocks, HostChunks, TierChunks
from kvtier.keys import ChunkKey, key_group
from kvtier.layout import KVLayout
from kvtier.tiers.base.chunk_format import Buffer
from kvtier.tiers.base.chunk_io import TierLoadHandler, TierWriteHandler
from kvtier.tiers.disk.files import DiskTier
from kvtier.tiers.host.buffers import HostTier

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
    tier = disk_tier(tmp_path, 3)
    host = _host(tier.layout, 3)
    keys, slots = chunk_keys((0, 1, 2)), [4, 0, 2]
    handler = TierWriteHandler(host, tier, "disk")
    result = run_job(handler, 1, HostChunks(np.array(slots)), TierChunks("disk", keys))
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
    tier = disk_tier(tmp_path, 3)
    host = _host(tier.layout, 3)
    (key,) = chunk_keys((0,))
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
    tier = disk_tier(tmp_path, 1)
    host = _host(tier.layout, 1)
    keys, slots = chunk_keys((0, 1, 2)), [1, 2, 3]
    full_disk_for(monkeypatch, tier.path(keys[1]).name)
    handler = TierWriteHandler(host, tier, "disk")
    result = run_job(handler, 1, HostChunks(np.array(slots)), TierChunks("disk", keys))
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
    tier = disk_tier(tmp_path, 1)
    handler = TierWriteHandler(_host(tier.layout, 1), tier, "disk")
    assert not handler.transfer_async(
        1, HostChunks(np.array(slots)), TierChunks("disk", chunk_keys(groups))
    )
    handler.shutdown()
    assert handler.get_finished() == []
    assert list(tmp_path.rglob("*.kv")) == []


def test_handlers_take_only_their_own_media(tmp_path: Path) -> None:
    tier = disk_tier(tmp_path, 1)
    load, write = (
        TierLoadHandler(tier.layout, tier, "disk"),
        TierWriteHandler(_host(tier.layout, 1), tier, "disk"),
    )
    engine = EngineBlocks(np.array([0]), (1, 0, 0), (0, 0, 0))
    with pytest.raises(TypeError, match="TierChunks -> EngineBlocks"):
        load.transfer_async(1, HostChunks(np.array([0])), engine)
    with pytest.raises(TypeError, match="HostChunks -> TierChunks"):
        write.transfer_async(2, engine, TierChunks("disk", chunk_keys((0,))))
    load.shutdown()
    write.shutdown()

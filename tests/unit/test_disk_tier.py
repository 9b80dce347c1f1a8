"""One rank's chunk files: a group's views round-trip; another rank's or layout's file is refused.

Layout: groups 0 and 2 alias the same two layer buffers (pages of 1 KiB), group 1 has its own
layer (pages of 256 B). A chunk of a group holds ``factor`` pages of each of the group's views.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from kvtier.keys import make_key
from kvtier.layout import KVLayout, build_layout
from kvtier.tiers.base.chunk_format import HEADER_BYTES, ChunkError, read_header
from kvtier.tiers.disk.files import DiskTier

NUM_BLOCKS, FACTOR = 8, 2
FP = bytes(range(16))  # the layout fingerprint digest in every file header
OTHER_FP = bytes(range(16, 32))
KEY_FP = bytes(range(100, 116))  # the fingerprint part of the chunk keys
KEYS = {group: make_key(KEY_FP, 7, group) for group in range(3)}


def _layout() -> KVLayout:
    backing = torch.zeros(2 * NUM_BLOCKS * 256)  # two layers shared by groups 0 and 2
    shared = [backing.view(2, NUM_BLOCKS, 2, 128)[i] for i in range(2)]
    caches = {"full.0": shared[0], "full.1": shared[1], "own.0": torch.zeros(NUM_BLOCKS, 64)}
    caches |= {"swa.0": shared[0], "swa.1": shared[1]}
    return build_layout(caches, [["full.0", "full.1"], ["own.0"], ["swa.0", "swa.1"]], NUM_BLOCKS)


def _tier(root: Path, rank: int = 0, fingerprint: bytes = FP) -> DiskTier:
    return DiskTier(root, rank, fingerprint, "test layout", _layout(), FACTOR)


def _payload(tier: DiskTier, group: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, n, dtype=np.uint8) for n in tier.view_bytes(group)]


def _read(tier: DiskTier, group: int) -> list[np.ndarray]:
    out = [np.zeros(n, dtype=np.uint8) for n in tier.view_bytes(group)]
    tier.read(KEYS[group], out)
    return out


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file())


def test_a_chunk_holds_the_views_of_its_group_only(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    assert tier.layout.groups == ((0, 1), (2,), (0, 1))
    assert tier.view_bytes(0) == [2 * 1024, 2 * 1024]
    assert tier.view_bytes(1) == [2 * 256]
    assert tier.view_bytes(2) == tier.view_bytes(0)
    assert tier.file_bytes(1) == HEADER_BYTES + 512


@pytest.mark.parametrize("group", [0, 1, 2])
def test_write_then_read_round_trips_a_groups_chunk(tmp_path: Path, group: int) -> None:
    tier = _tier(tmp_path)
    payload = _payload(tier, group, seed=group)
    assert tier.write(KEYS[group], payload) == tier.file_bytes(group)
    path = tier.path(KEYS[group])
    assert path.stat().st_size == tier.file_bytes(group)
    assert read_header(path)[0].views == tier.view_bytes(group)
    assert [o.tobytes() for o in _read(tier, group)] == [p.tobytes() for p in payload]
    assert _files(tmp_path) == [path.name]  # no temporary file left behind


def test_groups_sharing_views_keep_their_chunks_apart(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    first, third = _payload(tier, 0, seed=1), _payload(tier, 2, seed=2)
    tier.write(KEYS[0], first)
    tier.write(KEYS[2], third)
    assert tier.path(KEYS[0]) != tier.path(KEYS[2])
    assert [o.tobytes() for o in _read(tier, 0)] == [p.tobytes() for p in first]
    assert [o.tobytes() for o in _read(tier, 2)] == [p.tobytes() for p in third]


def test_a_payload_of_another_groups_views_is_not_written(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    with pytest.raises(ValueError, match="payload of"):
        tier.write(KEYS[1], _payload(tier, 0, seed=0))
    assert _files(tmp_path) == []


def test_rewriting_a_chunk_replaces_its_file(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    tier.write(KEYS[1], _payload(tier, 1, seed=1))
    newer = _payload(tier, 1, seed=2)
    tier.write(KEYS[1], newer)
    assert _read(tier, 1)[0].tobytes() == newer[0].tobytes()
    assert _files(tmp_path) == [tier.path(KEYS[1]).name]


def test_each_rank_reads_only_its_own_file(tmp_path: Path) -> None:
    rank0, rank1 = _tier(tmp_path, rank=0), _tier(tmp_path, rank=1)
    rank1.write(KEYS[1], _payload(rank1, 1, seed=1))
    assert rank0.path(KEYS[1]) != rank1.path(KEYS[1])
    with pytest.raises(FileNotFoundError):
        _read(rank0, 1)
    assert rank1.path(KEYS[1]).exists()  # another rank's file is not rank 0's to remove


def test_a_file_of_rank_1_is_refused_by_rank_0_and_removed(tmp_path: Path) -> None:
    rank0, rank1 = _tier(tmp_path, rank=0), _tier(tmp_path, rank=1)
    rank1.write(KEYS[1], _payload(rank1, 1, seed=1))
    os.rename(rank1.path(KEYS[1]), rank0.path(KEYS[1]))  # under rank 0's name
    out = [np.zeros(n, dtype=np.uint8) for n in rank0.view_bytes(1)]
    with pytest.raises(ChunkError, match="holds rank 1's share, not rank 0's"):
        rank0.read(KEYS[1], out)
    assert not rank0.path(KEYS[1]).exists()
    assert not out[0].any()  # nothing of the refused file is handed out


def test_a_file_of_another_layout_is_refused_and_removed(tmp_path: Path) -> None:
    other = _tier(tmp_path, fingerprint=OTHER_FP)
    other.write(KEYS[0], _payload(other, 0, seed=0))
    mine = _tier(tmp_path)
    assert mine.path(KEYS[0]) == other.path(KEYS[0])  # the same key names the same file
    with pytest.raises(ChunkError, match=f"written for layout {OTHER_FP.hex()}"):
        _read(mine, 0)
    assert not mine.path(KEYS[0]).exists()
    assert _files(tmp_path) == []


def test_a_damaged_file_is_refused_and_removed(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    tier.write(KEYS[1], _payload(tier, 1, seed=1))
    path = tier.path(KEYS[1])
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 3] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(ChunkError, match="payload checksum mismatch"):
        _read(tier, 1)
    assert not path.exists()


def test_a_missing_file_is_an_os_error(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    with pytest.raises(OSError):
        _read(tier, 2)
    assert _files(tmp_path) == []


def test_a_removed_directory_is_made_again_on_write(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    tier.write(KEYS[0], _payload(tier, 0, seed=0))
    directory = tier.path(KEYS[0]).parent
    tier.path(KEYS[0]).unlink()
    directory.rmdir()
    payload = _payload(tier, 0, seed=3)
    assert tier.write(KEYS[0], payload) == tier.file_bytes(0)
    assert [o.tobytes() for o in _read(tier, 0)] == [p.tobytes() for p in payload]

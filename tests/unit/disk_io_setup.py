"""Shared by test_disk_io, test_chunk_reads and test_disk_writes: a small CPU layout of several
groups, the tier's files written from random bytes, the cases of a load, damage to a file.

Layout: groups 0 and 2 alias the same two layer buffers (pages of 512 B), group 1 has its own
layer (pages of 128 B). A load names its chunks by key, flattened group by group; each case writes
out where every engine block's bytes come from: (group, engine block) -> (chunk position in the
job, sub-block of that chunk).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from kvtier.addresses import EngineBlocks, TransferSpec
from kvtier.keys import ChunkKey, key_group, make_key
from kvtier.layout import KVLayout, build_layout
from kvtier.tiers.base.chunk_format import HEADER_BYTES
from kvtier.tiers.base.chunk_io import TierLoadHandler, TierWriteHandler
from kvtier.tiers.base.handler import TransferResult
from kvtier.tiers.disk.files import DiskTier

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


def disk_layout() -> KVLayout:
    torch.manual_seed(0)
    backing = torch.randn(2 * NUM_BLOCKS * 2 * 8 * 8)  # two layers shared by groups 0 and 2
    shared = [backing.view(2, NUM_BLOCKS, 2, 8, 8)[i] for i in range(2)]
    caches = {"full.0": shared[0], "full.1": shared[1], "own.0": torch.randn(NUM_BLOCKS, 4, 8)}
    caches |= {"swa.0": shared[0], "swa.1": shared[1]}
    return build_layout(caches, [["full.0", "full.1"], ["own.0"], ["swa.0", "swa.1"]], NUM_BLOCKS)


def disk_tier(root: Path, factor: int) -> DiskTier:
    return DiskTier(root, 0, FP, "test layout", disk_layout(), factor)


def chunk_keys(groups: Sequence[int]) -> tuple[ChunkKey, ...]:
    return tuple(make_key(KEY_FP, position, group) for position, group in enumerate(groups))


def store_chunks(tier: DiskTier, keys: Sequence[ChunkKey]) -> list[list[np.ndarray]]:
    """Write a file of random bytes for every key; returns each chunk's views as (factor, page)."""
    rng = np.random.default_rng(1)
    chunks = []
    for key in keys:
        views = [rng.integers(0, 256, n, dtype=np.uint8) for n in tier.view_bytes(key_group(key))]
        tier.write(key, views)
        chunks.append([view.reshape(tier.factor, -1) for view in views])
    return chunks


def engine_bytes(layout: KVLayout) -> list[list[bytes]]:
    return [[row.numpy().tobytes() for row in view] for view in layout.views]


def run_job(
    handler: TierLoadHandler | TierWriteHandler, job_id: int, src: TransferSpec, dst: TransferSpec
) -> TransferResult:
    assert handler.transfer_async(job_id, src, dst)
    handler.wait([job_id])
    (result,) = handler.get_finished()
    assert result.job_id == job_id
    return result


def group_page_bytes(layout: KVLayout, groups: Sequence[int]) -> int:
    return sum(layout.page_bytes[view] for group in groups for view in layout.groups[group])


def flip_payload_byte(tier: DiskTier, keys: Sequence[ChunkKey], position: int) -> None:
    path = tier.path(keys[position])
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 5] ^= 0x01
    path.write_bytes(bytes(data))


def cut_last_byte(tier: DiskTier, keys: Sequence[ChunkKey], position: int) -> None:
    path = tier.path(keys[position])
    os.truncate(path, path.stat().st_size - 1)


def put_another_chunks_file(tier: DiskTier, keys: Sequence[ChunkKey], position: int) -> None:
    tier.path(keys[position]).write_bytes(tier.path(keys[0]).read_bytes())


def remove_file(tier: DiskTier, keys: Sequence[ChunkKey], position: int) -> None:
    tier.path(keys[position]).unlink()


DAMAGE = {
    "payload byte flipped": flip_payload_byte,
    "one byte short": cut_last_byte,
    "another chunk's file": put_another_chunks_file,
    "file missing": remove_file,
}

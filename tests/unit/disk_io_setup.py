"""Shared by test_disk_io, test_chunk_reads and test_disk_writes: a small CPU layout of several
groups, its disk tier (its files written by ``chunk_files.py``), the cases of a load, damage to
a file.

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
from chunk_files import FP

from kvtier.addresses import EngineBlocks
from kvtier.keys import ChunkKey
from kvtier.layout import KVLayout, build_layout
from kvtier.tiers.base.chunk_format import HEADER_BYTES
from kvtier.tiers.disk.files import DiskTier

NUM_BLOCKS, NUM_CHUNKS = 24, 6


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


def engine_bytes(layout: KVLayout) -> list[list[bytes]]:
    return [[row.numpy().tobytes() for row in view] for view in layout.views]


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

"""The local-disk tier, as one worker rank reads and writes it: one verified file per chunk.

The rank writes its share of each chunk (the chunk's rows in every view of its group) to
``names.chunk_path(root, key, rank)`` in the format of ``tiers/chunk_format.py``, and reads it back
only after every check passed. A file that fails a check is removed and the read raises
``ChunkError``: the caller counts a miss and the engine recomputes. Which chunks are on disk,
the budget and eviction are the scheduler half's (``index.py``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvtier.keys import ChunkKey, key_group
from kvtier.layout import KVLayout
from kvtier.tiers.base.chunk_format import (
    HEADER_BYTES,
    Buffer,
    ChunkError,
    ChunkHeader,
    payload_checksum,
    read_chunk,
    write_chunk,
)
from kvtier.tiers.base.chunk_tier import view_bytes
from kvtier.tiers.disk.names import chunk_path

logger = logging.getLogger(__name__)

MOST_READERS = 4


def default_readers(engine_device: str) -> int:
    """Chunk files a load reads at once for an engine on ``engine_device`` (a torch device
    type): on a GPU one per four CPUs this process may run on, 1 to ``MOST_READERS``; on the CPU
    one (every core computes the engine's forward). A read from the page cache is a copy by the
    kernel and its checksum a pass of the CPU over the bytes, each on one core: readers beside
    each other scale with idle cores (on two cores, two readers were slower than one)."""
    if engine_device == "cpu":
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MOST_READERS, cpus // 4))


class DiskTier:
    """Rank ``rank``'s chunk files under ``root``; ``fingerprint`` is this rank's layout digest."""

    read_ahead = 4  # chunk files the kernel is asked to read ahead of the one being loaded

    def __init__(
        self,
        root: Path,
        rank: int,
        fingerprint: bytes,
        describe: str,
        layout: KVLayout,
        block_size_factor: int,
    ) -> None:
        self.root = root
        self.rank = rank
        self.fingerprint = fingerprint
        self.describe = describe
        self.layout = layout
        self.factor = block_size_factor
        root.mkdir(parents=True, exist_ok=True)

    def view_bytes(self, group: int) -> list[int]:
        """Payload bytes of a chunk of ``group`` in each of its views, in order."""
        return view_bytes(self.layout, group, self.factor)

    def file_bytes(self, group: int) -> int:
        return HEADER_BYTES + sum(self.view_bytes(group))

    def path(self, key: bytes) -> Path:
        return chunk_path(self.root, key, self.rank)

    def write(self, key: ChunkKey, payload: Sequence[Buffer]) -> int:
        """Write this rank's share of chunk ``key``; returns bytes written. Raises OSError."""
        header = ChunkHeader(
            key=key,
            rank=self.rank,
            fingerprint=self.fingerprint,
            views=self.view_bytes(key_group(key)),
            checksum=payload_checksum(payload),
            created=time.time(),
            describe=self.describe,
        )
        path = self.path(key)
        try:
            return write_chunk(path, header, payload)
        except FileNotFoundError:  # its directory is new (or was removed): make it, once more
            path.parent.mkdir(parents=True, exist_ok=True)
            return write_chunk(path, header, payload)

    def write_many(
        self, keys: Sequence[ChunkKey], payloads: Sequence[Sequence[Buffer]]
    ) -> list[int | None]:
        """Write this rank's share of each chunk: the bytes of each. OSError from the first
        write that fails (a full disk)."""
        return [self.write(key, payload) for key, payload in zip(keys, payloads)]

    def holds_many(self, keys: Sequence[ChunkKey]) -> list[bool]:
        """Whether this rank's file of each key is there (not opened, not verified)."""
        return [os.path.exists(self.path(key)) for key in keys]

    def prefetch(self, key: bytes) -> None:
        """Ask the kernel to start reading ``key``'s file unless its end is in the page cache
        already (best effort: errors are ignored). Asked of a file in the cache, the kernel
        walks every page of it (0.1 ms a file of 8 MiB, on the thread that hands the readers
        their files) and may leave it in small pages, which later reads copy slower."""
        try:
            fd = os.open(self.path(key), os.O_RDONLY)
        except OSError:
            return
        try:
            if not _end_cached(fd):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)

    def read(self, key: bytes, out: Sequence[np.ndarray]) -> None:
        """Read and verify this rank's share of ``key`` into ``out`` (the chunk's record: one
        buffer, or several whose concatenation it is).

        Raises ChunkError after removing a file that failed a check, OSError when there is no
        readable file.
        """
        path = self.path(key)
        try:
            views = self.view_bytes(key_group(ChunkKey(key)))
            read_chunk(path, key, self.rank, self.fingerprint, out, views)
        except ChunkError as error:
            logger.warning("kvtier: removed bad disk chunk %s: %s", path, error)
            path.unlink(missing_ok=True)
            raise


def _end_cached(fd: int) -> bool:
    """Whether the last byte of ``fd``'s file is in the page cache: read without waiting for
    the disk (``RWF_NOWAIT``); False where that cannot be asked (then the file is prefetched)."""
    size = os.fstat(fd).st_size
    if not size or not hasattr(os, "RWF_NOWAIT"):
        return False
    try:
        return os.preadv(fd, [bytearray(1)], size - 1, os.RWF_NOWAIT) == 1
    except OSError:  # BlockingIOError: not cached; EOPNOTSUPP: a filesystem that cannot say
        return False

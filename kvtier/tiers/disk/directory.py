"""A disk tier's directory as the scheduler half sees it: the files of each chunk, one per rank.

    ChunkFiles(root, world_size)
    .scan()                  -> [Found]         every chunk with a file there, least recently
                                                written first; stale temporary files removed
    .complete(key)           -> (bytes, newest) | None   every rank's file there, regular
    .newest_mtime(key)       -> float
    .touch(key)                                 mark the files used now (LRU across restarts)
    .remove(key, ranks)                         remove the files of ranks ``0..ranks-1``

No file is opened here: only names, sizes and times (the worker half reads and verifies).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path
from typing import NamedTuple

from kvtier.keys import ChunkKey
from kvtier.tiers.disk.names import chunk_path, scan

logger = logging.getLogger(__name__)

STALE_TEMP_S = 3600.0  # a temporary file this old was left by a writer that died


class Found(NamedTuple):
    """A chunk with files in the directory: their bytes, ``ranks`` (1 + the highest rank with a
    file) and whether every rank's file is there."""

    key: ChunkKey
    nbytes: int
    ranks: int
    complete: bool


class ChunkFiles:
    def __init__(self, root: Path, world_size: int) -> None:
        self.root = root
        self.world_size = world_size
        root.mkdir(parents=True, exist_ok=True)

    def scan(self) -> list[Found]:
        sizes: dict[ChunkKey, int] = {}
        ranks: dict[ChunkKey, int] = {}  # bit mask of the ranks whose file is there
        mtimes: dict[ChunkKey, float] = {}
        now = time.time()
        for entry, chunk in scan(self.root):
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if chunk is None:
                temp = entry.name.startswith(".") and entry.name.endswith(".tmp")
                if temp and now - info.st_mtime > STALE_TEMP_S:
                    Path(entry.path).unlink(missing_ok=True)
                continue
            key, rank = chunk
            sizes[key] = sizes.get(key, 0) + info.st_size
            ranks[key] = ranks.get(key, 0) | 1 << rank
            mtimes[key] = max(mtimes.get(key, 0.0), info.st_mtime)
        everyone = (1 << self.world_size) - 1
        return [
            Found(key, sizes[key], ranks[key].bit_length(), ranks[key] == everyone)
            for key in sorted(sizes, key=mtimes.__getitem__)  # least recently written first
        ]

    def complete(self, key: ChunkKey) -> tuple[int, float] | None:
        """(bytes, newest time) of ``key``'s files when every rank's is a regular file."""
        nbytes, newest = 0, 0.0
        for rank in range(self.world_size):
            try:
                found = os.stat(chunk_path(self.root, key, rank))
            except OSError:
                return None
            if not stat.S_ISREG(found.st_mode):
                return None
            nbytes += found.st_size
            newest = max(newest, found.st_mtime)
        return nbytes, newest

    def newest_mtime(self, key: ChunkKey) -> float:
        newest = 0.0
        for rank in range(self.world_size):
            try:
                newest = max(newest, os.stat(chunk_path(self.root, key, rank)).st_mtime)
            except OSError:
                pass
        return newest

    def touch(self, key: ChunkKey, now: float) -> None:
        for rank in range(self.world_size):
            try:
                os.utime(chunk_path(self.root, key, rank), (now, now))
            except OSError:
                pass

    def remove(self, key: ChunkKey, ranks: int) -> None:
        for rank in range(ranks):
            try:
                chunk_path(self.root, key, rank).unlink(missing_ok=True)
            except OSError as error:
                logger.warning("kvtier: could not remove a disk chunk: %s", error)

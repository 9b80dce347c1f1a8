"""Where the file of a chunk lives in a disk tier's directory, and reading a name back.

    {root}/{fingerprint hex}/{first byte of the chunk hash, hex}/{chunk hash + group hex}.{rank}.kv

The key's fingerprint (16 bytes) names a directory per model and layout; the next byte spreads
the files of one model over 256 directories, so none grows huge. Each worker rank writes its own
share of a chunk: a chunk is on disk when all ``world_size`` rank files are. Temporary files
(``disk_format.temp_name``) start with a dot and end in ``.tmp``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from kvtier.keys import FINGERPRINT_BYTES, KEY_BYTES, ChunkKey

SUFFIX = ".kv"


class ChunkFile(NamedTuple):
    path: Path
    key: ChunkKey
    rank: int


def chunk_path(root: Path, key: bytes, rank: int) -> Path:
    fingerprint, rest = key[:FINGERPRINT_BYTES].hex(), key[FINGERPRINT_BYTES:].hex()
    return root / fingerprint / rest[:2] / f"{rest}.{rank}{SUFFIX}"


def parse_name(path: Path) -> ChunkFile | None:
    """The key and rank a chunk file's path names; None for any other file."""
    name = path.name
    if not name.endswith(SUFFIX) or name.startswith("."):
        return None
    stem, _, rank = name[: -len(SUFFIX)].rpartition(".")
    try:
        key = bytes.fromhex(path.parent.parent.name + stem)
    except ValueError:
        return None
    if len(key) != KEY_BYTES or not rank.isdigit() or path.parent.name != stem[:2]:
        return None
    return ChunkFile(path, ChunkKey(key), int(rank))


def scan(root: Path) -> Iterator[tuple[os.DirEntry[str], ChunkFile | None]]:
    """Every file two directories below ``root``, with what its name says (None: not a chunk)."""
    for level1 in _dirs(root):
        for level2 in _dirs(Path(level1.path)):
            try:
                entries = list(os.scandir(level2.path))
            except OSError:
                continue
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    yield entry, parse_name(Path(entry.path))


def _dirs(path: Path) -> list[os.DirEntry[str]]:
    try:
        return [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []

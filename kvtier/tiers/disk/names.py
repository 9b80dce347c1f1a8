"""Where the file of a chunk lives in a disk tier's directory, and reading a name back.

    {root}/{fingerprint hex}/{first byte of the chunk hash, hex}/{chunk hash + group hex}.{rank}.kv

The key's fingerprint (16 bytes) names a directory per model and layout; the next byte spreads
the files of one model over 256 directories, so none grows huge. Each worker rank writes its own
share of a chunk: a chunk is on disk when all ``world_size`` rank files are. Temporary files
(``chunk_format.temp_name``) start with a dot and end in ``.tmp``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from kvtier.keys import FINGERPRINT_BYTES, KEY_BYTES, ChunkKey

SUFFIX = ".kv"


ChunkName = tuple[ChunkKey, int]  # (key, rank): a plain tuple, made 100k times at start-up


class ChunkFile(NamedTuple):
    path: Path
    key: ChunkKey
    rank: int


def chunk_path(root: Path, key: bytes, rank: int) -> Path:
    fingerprint, rest = key[:FINGERPRINT_BYTES].hex(), key[FINGERPRINT_BYTES:].hex()
    return root / fingerprint / rest[:2] / f"{rest}.{rank}{SUFFIX}"


def parse_name(path: Path) -> ChunkFile | None:
    """The key and rank a chunk file's path names; None for any other file, including every
    name ``chunk_path`` would not give (upper-case hex, a rank of "01", ...)."""
    parsed = _parse(path.parent.parent.name, path.parent.name, path.name)
    return None if parsed is None else ChunkFile(path, ChunkKey(parsed[0]), parsed[1])


def _parse(fingerprint: str, fan_out: str, name: str) -> ChunkName | None:
    if not name.endswith(SUFFIX) or name.startswith("."):
        return None
    stem, _, rank = name[: -len(SUFFIX)].rpartition(".")
    if not (rank.isascii() and rank.isdigit()) or (rank[0] == "0" and rank != "0"):
        return None
    if fan_out != stem[:2] or len(stem) != 2 * (KEY_BYTES - FINGERPRINT_BYTES):
        return None
    try:
        key = bytes.fromhex(fingerprint + stem)
    except ValueError:
        return None
    if len(key) != KEY_BYTES or key.hex() != fingerprint + stem:  # lower case, no spaces
        return None
    return ChunkKey(key), int(rank)


def scan(root: Path) -> Iterator[tuple[os.DirEntry[str], ChunkName | None]]:
    """Every file two directories below ``root``, with what its name says (None: not a chunk).

    Fast for 100k files: names are parsed as strings, no ``Path`` is made."""
    for level1 in _dirs(str(root)):
        for level2 in _dirs(level1.path):
            try:
                entries = list(os.scandir(level2.path))
            except OSError:
                continue
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    yield entry, _parse(level1.name, level2.name, entry.name)


def _dirs(path: str) -> list[os.DirEntry[str]]:
    try:
        return [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []

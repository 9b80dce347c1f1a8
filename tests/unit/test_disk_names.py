"""Names in a disk tier: {root}/{fingerprint}/{first hash byte}/{hash + group}.{rank}.kv"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kvtier.keys import make_key
from kvtier.tiers.base.chunk_format import temp_name
from kvtier.tiers.disk.names import ChunkFile, chunk_path, parse_name, scan

ROOT = Path("/tier")
FP = bytes(range(16))
KEY = make_key(FP, 7, group=3)
OTHER_KEY = make_key(FP, 8, group=3)
REST = KEY[16:].hex()  # chunk hash + group, 36 hex digits


def test_chunk_path_spreads_by_fingerprint_then_first_hash_byte() -> None:
    assert chunk_path(ROOT, KEY, 1) == ROOT / FP.hex() / REST[:2] / f"{REST}.1.kv"


@pytest.mark.parametrize("rank", [0, 1, 15])
def test_parse_name_reads_back_key_and_rank(rank: int) -> None:
    path = chunk_path(ROOT, KEY, rank)
    assert parse_name(path) == ChunkFile(path, KEY, rank)


def _renamed(name: str) -> Callable[[Path], Path]:
    return lambda path: path.with_name(name)


NOT_CHUNKS: dict[str, Callable[[Path], Path]] = {
    "temporary file": temp_name,
    "other suffix": _renamed(f"{REST}.0.bin"),
    "suffix after .kv": _renamed(f"{REST}.0.kv.bak"),
    "bad hex": _renamed(f"{REST[:5]}z{REST[6:]}.0.kv"),
    "key too short": _renamed(f"{REST[:-2]}.0.kv"),
    "key too long": _renamed(f"{REST}00.0.kv"),
    "no rank": _renamed(f"{REST}.kv"),
    "rank not a number": _renamed(f"{REST}.x.kv"),
    "wrong fan-out directory": lambda path: path.parent.parent / "ff" / path.name,
}


@pytest.mark.parametrize("change", NOT_CHUNKS)
def test_parse_name_rejects(change: str) -> None:
    assert REST[:2] != "ff"
    assert parse_name(NOT_CHUNKS[change](chunk_path(ROOT, KEY, 0))) is None


def _split_fingerprint_dir(path: Path) -> Path:
    """The last fingerprint digit moved from the directory's name into the file's."""
    fingerprint = FP.hex()
    return ROOT / fingerprint[:-1] / (fingerprint[-1] + REST[0]) / f"{fingerprint[-1]}{REST}.0.kv"


NON_CANONICAL: dict[str, Callable[[Path], Path]] = {
    "upper-case hex": lambda path: path.parent.parent / REST[:2].upper() / f"{REST.upper()}.0.kv",
    "space in the hex": _renamed(f"{REST[:4]} {REST[4:]}.0.kv"),
    "leading zero in the rank": _renamed(f"{REST}.00.kv"),
    "a unicode digit as rank": _renamed(f"{REST}.\N{SUPERSCRIPT TWO}.kv"),
    "hex split across directories": _split_fingerprint_dir,
}


@pytest.mark.parametrize("change", NON_CANONICAL)
def test_parse_name_rejects_names_chunk_path_never_makes(change: str) -> None:
    assert parse_name(NON_CANONICAL[change](chunk_path(ROOT, KEY, 0))) is None


def test_scan_yields_files_two_levels_down(tmp_path: Path) -> None:
    chunks = [chunk_path(tmp_path, KEY, 0), chunk_path(tmp_path, KEY, 1)]
    chunks.append(chunk_path(tmp_path, OTHER_KEY, 0))
    others = [temp_name(chunks[0]), chunks[0].with_name("notes.txt")]
    ignored = [tmp_path / "README", tmp_path / FP.hex() / "stray", chunks[0].parent / "sub" / "x"]
    for path in chunks + others + ignored:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")  # scan reads names, never contents
    found = {Path(entry.path): chunk for entry, chunk in scan(tmp_path)}
    named = {path: parse_name(path) for path in chunks}
    expected = {path: (c.key, c.rank) for path, c in named.items() if c} | dict.fromkeys(others)
    assert found == expected
    assert all(chunk is not None for chunk in map(parse_name, chunks))


def test_scan_of_an_empty_or_missing_root_yields_nothing(tmp_path: Path) -> None:
    assert list(scan(tmp_path)) == []
    assert list(scan(tmp_path / "missing")) == []

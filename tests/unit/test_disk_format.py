"""One chunk on disk: a round trip; every damage or mix-up is a ChunkError, never a good read."""

from __future__ import annotations

import errno
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from kvtier.keys import make_key
from kvtier.tiers.base import chunk_format
from kvtier.tiers.base.chunk_format import (
    HEADER_BYTES,
    MAX_DESCRIBE,
    ChunkError,
    ChunkHeader,
    encode_header,
    payload_checksum,
    read_chunk,
    read_header,
    verify_file,
    write_chunk,
)

FP = bytes(range(16))
OTHER_FP = bytes(range(16, 32))
KEY = make_key(FP, 7, group=0)
OTHER_KEY = make_key(FP, 8, group=0)
PAYLOAD = [bytes(range(64)), b"\xab" * 200]  # two views of different sizes
FILE_BYTES = HEADER_BYTES + 264
HEADER_BODY = 20  # offset of the msgpack header, after magic, length and checksum


def write(
    path: Path,
    payload: Sequence[bytes] = PAYLOAD,
    key: bytes = KEY,
    rank: int = 0,
    describe: str = "tiny test layout",
) -> ChunkHeader:
    views = [len(view) for view in payload]
    header = ChunkHeader(key, rank, FP, views, payload_checksum(payload), time.time(), describe)
    assert write_chunk(path, header, payload) == HEADER_BYTES + sum(views)
    return header


def read(
    path: Path,
    key: bytes = KEY,
    rank: int = 0,
    fingerprint: bytes = FP,
    views: Sequence[int] = (64, 200),
) -> list[bytes]:
    out = [np.zeros(n, dtype=np.uint8) for n in views]
    read_chunk(path, key, rank, fingerprint, out)
    return [o.tobytes() for o in out]


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_round_trip_of_two_views(tmp_path: Path) -> None:
    path = tmp_path / "chunk.kv"
    header = write(path)
    out = [np.zeros(64, dtype=np.uint8), np.zeros(200, dtype=np.uint8)]
    assert read_chunk(path, KEY, 0, FP, out) == header
    assert [o.tobytes() for o in out] == PAYLOAD
    assert read_header(path) == (header, FILE_BYTES)
    assert verify_file(path) == header
    assert os.listdir(tmp_path) == ["chunk.kv"]  # no temporary file left behind


DAMAGE: dict[str, tuple[Callable[[Path], object], str]] = {
    "payload byte flipped": (lambda p: flip(p, HEADER_BYTES + 100), "payload checksum mismatch"),
    "header byte flipped": (lambda p: flip(p, HEADER_BODY + 3), "header checksum mismatch"),
    "one byte short": (
        lambda p: os.truncate(p, FILE_BYTES - 1),
        f"{FILE_BYTES - 1} bytes long, expected {FILE_BYTES}",
    ),
    "zero length": (lambda p: p.write_bytes(b""), "header truncated: 0 of 4096 bytes"),
    "not a kvtier file": (lambda p: p.write_bytes(b"hello\n" * 1000), "not a kvtier chunk file"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_file_is_a_chunk_error(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "chunk.kv"
    write(path)
    spoil, reason = DAMAGE[damage]
    spoil(path)
    with pytest.raises(ChunkError, match=re.escape(reason)):
        read(path)
    with pytest.raises(ChunkError, match=re.escape(reason)):
        verify_file(path)


def test_a_file_under_another_chunks_name_is_a_chunk_error(tmp_path: Path) -> None:
    a, b, swap = tmp_path / "a.kv", tmp_path / "b.kv", tmp_path / "swap"
    write(a, key=KEY)
    write(b, [b"\x01" * 64, b"\x02" * 200], key=OTHER_KEY)
    a.rename(swap)
    b.rename(a)
    swap.rename(b)
    with pytest.raises(ChunkError, match=f"holds chunk {OTHER_KEY.hex()}, not {KEY.hex()}"):
        read(a, key=KEY)
    with pytest.raises(ChunkError, match=f"holds chunk {KEY.hex()}, not {OTHER_KEY.hex()}"):
        read(b, key=OTHER_KEY)
    verify_file(a)  # whole and valid: only the reader who knows the name can tell


def test_another_ranks_share_is_a_chunk_error(tmp_path: Path) -> None:
    write(tmp_path / "chunk.kv", rank=1)
    with pytest.raises(ChunkError, match="holds rank 1's share, not rank 0's"):
        read(tmp_path / "chunk.kv", rank=0)


def test_another_layouts_chunk_is_a_chunk_error(tmp_path: Path) -> None:
    write(tmp_path / "chunk.kv")
    with pytest.raises(ChunkError, match=f"written for layout {FP.hex()}"):
        read(tmp_path / "chunk.kv", fingerprint=OTHER_FP)


def test_views_of_other_lengths_are_a_chunk_error(tmp_path: Path) -> None:
    write(tmp_path / "chunk.kv")
    with pytest.raises(ChunkError, match=re.escape("views of [64, 200] bytes, expected [200, 64]")):
        read(tmp_path / "chunk.kv", views=(200, 64))  # same total, other split


def _full_disk_after_one_buffer(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``os.writev`` writes the first buffer (the header), then fails with ENOSPC."""
    real_writev, calls = os.writev, []

    def writev(fd: int, buffers: Sequence[memoryview]) -> int:
        calls.append(len(buffers))
        if len(calls) == 1:
            return real_writev(fd, buffers[:1])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("kvtier.tiers.base.chunk_format.os.writev", writev)
    return calls


def test_a_full_disk_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _full_disk_after_one_buffer(monkeypatch)
    with pytest.raises(OSError) as raised:
        write(tmp_path / "chunk.kv")
    assert raised.value.errno == errno.ENOSPC
    assert len(calls) == 2
    assert os.listdir(tmp_path) == []


def test_a_failed_rewrite_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "chunk.kv"
    write(path)
    _full_disk_after_one_buffer(monkeypatch)
    with pytest.raises(OSError):
        write(path, [b"\x00" * 64, b"\x00" * 200])
    assert read(path) == PAYLOAD
    assert os.listdir(tmp_path) == ["chunk.kv"]


def test_replacing_a_file_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "chunk.kv"
    versions = [[bytes([i]) * 64, bytes([255 - i]) * 200] for i in range(200)]
    write(path, versions[0])
    reads: list[list[bytes]] = []
    errors: list[BaseException] = []
    first_read, done = threading.Event(), threading.Event()

    def reader() -> None:
        while not done.is_set() or not reads:
            try:
                reads.append(read(path))
            except BaseException as error:  # rename replaces the name atomically: no error at all
                errors.append(error)
                return
            first_read.set()

    thread = threading.Thread(target=reader)
    thread.start()
    assert first_read.wait(timeout=10)
    for version in versions:
        write(path, version)
    done.set()
    thread.join(timeout=10)
    assert errors == []
    assert reads and all(payload in versions for payload in reads)
    assert read(path) == versions[-1]
    assert os.listdir(tmp_path) == ["chunk.kv"]


def test_a_very_long_describe_is_truncated_to_fit(tmp_path: Path) -> None:
    header = ChunkHeader(KEY, 0, FP, [64, 200], 0, 0.0, describe="x" * 100_000)
    assert len(encode_header(header)) == HEADER_BYTES
    write(tmp_path / "chunk.kv", describe="x" * 100_000)
    assert read_header(tmp_path / "chunk.kv")[0].describe == "x" * MAX_DESCRIBE


def test_a_long_non_ascii_describe_is_truncated_to_fit(tmp_path: Path) -> None:
    write(tmp_path / "chunk.kv", describe="\N{GRINNING FACE}" * 2000)  # 4 UTF-8 bytes each
    assert len(read_header(tmp_path / "chunk.kv")[0].describe.encode()) < HEADER_BYTES


def test_a_chunk_of_more_than_1024_views_reads_back(tmp_path: Path) -> None:
    payload = [bytes([i % 256]) * 16 for i in range(1100)]
    write(tmp_path / "chunk.kv", payload)  # written 512 views per writev
    assert read(tmp_path / "chunk.kv", views=[16] * 1100) == payload


def test_a_payload_is_read_and_hashed_a_piece_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read call brings at most ``READ_PIECE`` bytes, hashed while they are in the CPU's
    cache, not in a second pass over the whole payload; a byte flipped in any piece, or a view
    split between two, is still a ChunkError."""
    monkeypatch.setattr(chunk_format, "READ_PIECE", 100)
    payload = [bytes(range(256)) * 3, bytes(range(64)), b"\x01", b"\xcd" * 333]
    views = [len(view) for view in payload]
    path = tmp_path / "chunk.kv"
    write(path, payload)
    calls: list[int] = []
    preadv = os.preadv

    def counted(fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        calls.append(sum(len(b) for b in buffers))
        return preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", counted)
    assert read(path, views=views) == payload
    assert max(calls) == 100 and sum(calls) == sum(views) and len(calls) == 12
    for offset in (0, 99, 100, 768, 832, 1165):
        flip(path, HEADER_BYTES + offset)
        with pytest.raises(ChunkError, match="payload checksum mismatch"):
            read(path, views=views)
        flip(path, HEADER_BYTES + offset)  # mended
    assert read(path, views=views) == payload

"""The file of one chunk on disk: a fixed-size, self-describing header, then the chunk's bytes.

    offset  bytes  field
    0       8      magic ``b"KVTIER1\\n"``
    8       4      n: length of the encoded header (u32, little endian)
    12      8      xxh3_64 of the n header bytes (u64, little endian)
    20      n      the header, msgpack (``ChunkHeader``): key, rank, fingerprint, views,
                   checksum, created, describe
    20 + n  ...    zeros up to ``HEADER_BYTES`` (4096)
    4096    P      the payload: the chunk's record (``host/records.py``): its bytes in each
                   view of its group, view after view, each view's pages back to back;
                   ``views`` lists their lengths and P is their sum

A file is exactly ``HEADER_BYTES + P`` bytes long; ``checksum`` is the xxh3_64 of the payload.
Nothing here is pickled: the header is msgpack decoded into a typed ``msgspec.Struct``.

A file is written under a temporary name in its final directory and renamed, so a reader sees a
whole file or none. Nothing is fsynced: a file torn by a crash fails ``read_chunk``'s checks and
is a miss, like any other damage.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import xxhash

MAGIC = b"KVTIER1\n"
HEADER_BYTES = 4096
_PREFIX = struct.Struct("<8sIQ")  # magic, header length, header checksum
MAX_DESCRIBE = 1024  # bytes (UTF-8) of ``describe`` kept, so the header always fits
MAX_BUFFERS = 512  # buffers per readv/writev call (Linux allows 1024)
READ_PIECE = 512 << 10  # bytes a read call brings in, hashed while they are in the CPU's cache

Buffer = Any  # anything exposing the buffer protocol (bytes, memoryview, numpy array)


class ChunkError(ValueError):
    """A chunk file that must not be trusted: damaged, truncated, or another chunk's."""


class ChunkHeader(msgspec.Struct, frozen=True):
    key: bytes  # the chunk key (``kvtier.keys``)
    rank: int  # the worker rank whose share of the chunk this file holds
    fingerprint: bytes  # that rank's layout fingerprint digest
    views: list[int]  # payload bytes of each view, in order
    checksum: int  # xxh3_64 of the payload
    created: float  # unix time of writing
    describe: str = ""  # human-readable layout, for ``kvtier inspect``

    @property
    def payload_bytes(self) -> int:
        return sum(self.views)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ChunkHeader)


def payload_checksum(buffers: Sequence[Buffer]) -> int:
    """xxh3_64 of the concatenation of ``buffers``."""
    hasher = xxhash.xxh3_64()
    for buffer in buffers:
        hasher.update(buffer)
    return hasher.intdigest()


def encode_header(header: ChunkHeader) -> bytes:
    """The first ``HEADER_BYTES`` of a chunk file."""
    described = header.describe.encode()
    if len(described) > MAX_DESCRIBE:
        cut = described[:MAX_DESCRIBE].decode(errors="ignore")
        header = msgspec.structs.replace(header, describe=cut)
    body = _encoder.encode(header)
    prefix = _PREFIX.pack(MAGIC, len(body), xxhash.xxh3_64_intdigest(body))
    if len(prefix) + len(body) > HEADER_BYTES:
        raise ValueError(f"kvtier: a chunk header of {len(body)} bytes does not fit")
    return (prefix + body).ljust(HEADER_BYTES, b"\0")


def decode_header(data: bytes) -> ChunkHeader:
    """Parse the first ``HEADER_BYTES`` of a file; ChunkError if it is not a kvtier chunk header."""
    if len(data) < HEADER_BYTES:
        raise ChunkError(f"header truncated: {len(data)} of {HEADER_BYTES} bytes")
    magic, length, checksum = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise ChunkError(f"not a kvtier chunk file (magic {magic!r})")
    if length > HEADER_BYTES - _PREFIX.size:
        raise ChunkError(f"header length {length} is larger than the header")
    body = data[_PREFIX.size : _PREFIX.size + length]
    if xxhash.xxh3_64_intdigest(body) != checksum:
        raise ChunkError("header checksum mismatch")
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError as error:
        raise ChunkError(f"header does not decode: {error}") from error


_temp_counter = iter(range(1 << 62))
_temp_lock = threading.Lock()


def temp_name(path: Path) -> Path:
    """A name no other writer (process or thread) uses, next to ``path``, hidden, ``.tmp``."""
    with _temp_lock:
        n = next(_temp_counter)
    return path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}-{n}.tmp")


def write_chunk(path: Path, header: ChunkHeader, payload: Sequence[Buffer]) -> int:
    """Write ``header`` and ``payload`` (buffers whose concatenation is the chunk's record, of
    the ``header.views`` lengths) to ``path``.

    Written under a temporary name and renamed, so readers see the whole file or none; an existing
    file is replaced. Returns the bytes written. On an OSError (a full disk, a write error) the
    temporary file is removed and the error raised.
    """
    views = [memoryview(buffer).cast("B") for buffer in payload]
    if sum(len(v) for v in views) != header.payload_bytes:
        raise ValueError(f"kvtier: payload of {sum(len(v) for v in views)} bytes, header says "
                         f"{header.views}")  # fmt: skip
    temp = temp_name(path)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            _write_all(fd, [memoryview(encode_header(header)), *views])
        finally:
            os.close(fd)
        os.rename(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return HEADER_BYTES + header.payload_bytes


def _write_all(fd: int, buffers: list[memoryview]) -> None:
    while buffers:
        written = os.writev(fd, buffers[:MAX_BUFFERS])
        if written == 0:
            raise OSError(errno.EIO, "writev wrote nothing")
        while buffers and written >= len(buffers[0]):
            written -= len(buffers[0])
            buffers.pop(0)
        if buffers and written:
            buffers[0] = buffers[0][written:]


def read_header(path: Path) -> tuple[ChunkHeader, int]:
    """The header of the file at ``path`` and the file's size (no payload check)."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        return decode_header(file.read(HEADER_BYTES)), size


def read_chunk(
    path: Path,
    key: bytes,
    rank: int,
    fingerprint: bytes,
    out: Sequence[np.ndarray],
    views: Sequence[int] | None = None,
) -> ChunkHeader:
    """Read and verify the chunk ``key`` of ``rank`` into ``out`` (byte buffers whose
    concatenation receives the payload: the chunk's record).

    Every check must pass before the caller may use ``out``: the header's key, rank and
    fingerprint equal the expected ones, its view lengths equal ``views`` (None: ``out``'s, one
    buffer per view), ``out`` holds exactly the payload, the file is exactly as long as the
    header says, and the payload's checksum matches. Raises ChunkError on a mismatch and OSError
    when the file cannot be read.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        header = decode_header(os.pread(fd, HEADER_BYTES, 0))
        if header.key != key:
            raise ChunkError(f"holds chunk {header.key.hex()}, not {key.hex()}")
        if header.rank != rank:
            raise ChunkError(f"holds rank {header.rank}'s share, not rank {rank}'s")
        if header.fingerprint != fingerprint:
            raise ChunkError(
                f"written for layout {header.fingerprint.hex()} ({header.describe}), "
                f"not {fingerprint.hex()}"
            )
        expected = [o.nbytes for o in out] if views is None else list(views)
        if list(header.views) != expected:
            raise ChunkError(f"views of {header.views} bytes, expected {expected}")
        if sum(o.nbytes for o in out) != header.payload_bytes:
            raise ValueError(f"kvtier: {sum(o.nbytes for o in out)} bytes to read a payload "
                             f"of {header.payload_bytes} into")  # fmt: skip
        if size != HEADER_BYTES + header.payload_bytes:
            raise ChunkError(f"{size} bytes long, expected {HEADER_BYTES + header.payload_bytes}")
        hasher = xxhash.xxh3_64()
        got = 0
        for piece in _pieces([o.data.cast("B") for o in out], READ_PIECE):
            part = os.preadv(fd, piece, HEADER_BYTES + got)
            got += part
            if part < sum(len(v) for v in piece):
                break
            for view in piece:
                hasher.update(view)
        if got != header.payload_bytes:
            raise ChunkError(f"read {got} of {header.payload_bytes} payload bytes")
    finally:
        os.close(fd)
    if hasher.intdigest() != header.checksum:
        raise ChunkError("payload checksum mismatch")
    return header


def _pieces(into: Sequence[memoryview], most: int) -> Iterator[list[memoryview]]:
    """``into`` (byte views) in order, as lists of views of at most ``most`` bytes together and
    ``MAX_BUFFERS`` views: one read call each, hashed while in the CPU's cache (a second pass
    over the whole payload after reading it came from memory, a cost per byte)."""
    piece: list[memoryview] = []
    room = most
    for view in into:
        at = 0
        while at < len(view):
            take = view[at : at + room]
            piece.append(take)
            at += len(take)
            room -= len(take)
            if not room or len(piece) == MAX_BUFFERS:
                yield piece
                piece, room = [], most
    if piece:
        yield piece


def verify_file(path: Path) -> ChunkHeader:
    """Check a file on its own (``kvtier inspect --verify``): header, length and checksum."""
    header, size = read_header(path)
    if size != HEADER_BYTES + header.payload_bytes:
        raise ChunkError(f"{size} bytes long, expected {HEADER_BYTES + header.payload_bytes}")
    buffers = [np.empty(n, dtype=np.uint8) for n in header.views]
    return read_chunk(path, header.key, header.rank, header.fingerprint, buffers)

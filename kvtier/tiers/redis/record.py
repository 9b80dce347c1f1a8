"""The value under a Redis key: one rank's share of a chunk as a verified record.

    offset  bytes  field
    0       8      magic ``b"KVTIERR1"``
    8       4      n: length of the header (u32, little endian)
    12      8      xxh3_64 of the n header bytes (u64, little endian)
    20      n      the header: msgpack of ``chunk_format.ChunkHeader`` (key, rank, fingerprint,
                   views, checksum, created, describe)
    20 + n  P      the payload: the chunk's bytes in each view of its group, view after view

The same record and checks as a disk chunk file (``chunk_format.read_chunk``) without its 4 KiB of
padding: a chunk may be 16 tokens. Header and bytes are one value, so they cannot drift apart.
A reader takes a record in steps, so that the payload lands straight in its buffers:

    head_length(first 20 bytes)       -> n             ChunkError: not a record
    decode_header(first 20 + n bytes) -> ChunkHeader   ChunkError: damaged header
    check_header(header, ...)                          ChunkError: another chunk's, rank's,
                                                       layout's, or of the wrong length
    check_payload(header, out)                         ChunkError: damaged payload

``verify_record`` does them all on a record held in memory. Nothing is pickled.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import msgspec
import numpy as np
import xxhash

from kvtier.tiers.base.chunk_format import (
    MAX_DESCRIBE,
    Buffer,
    ChunkError,
    ChunkHeader,
    payload_checksum,
)

MAGIC = b"KVTIERR1"
PREFIX = struct.Struct("<8sIQ")  # magic, header length, header checksum
MAX_HEADER = 4096  # bytes of msgpack header a reader accepts

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ChunkHeader)


def encode_prefix(header: ChunkHeader) -> bytes:
    """Everything of a record before its payload (``describe`` cut to ``MAX_DESCRIBE`` bytes)."""
    described = header.describe.encode()
    if len(described) > MAX_DESCRIBE:
        cut = described[:MAX_DESCRIBE].decode(errors="ignore")
        header = msgspec.structs.replace(header, describe=cut)
    body = _encoder.encode(header)
    return PREFIX.pack(MAGIC, len(body), xxhash.xxh3_64_intdigest(body)) + body


def record_bytes(header: ChunkHeader) -> int:
    """The length of ``header``'s record: its prefix and payload."""
    return len(encode_prefix(header)) + header.payload_bytes


def head_length(prefix: Buffer) -> int:
    """Bytes before the payload of a record whose first ``PREFIX.size`` bytes are ``prefix``."""
    magic, length, _ = PREFIX.unpack_from(prefix)
    if magic != MAGIC:
        raise ChunkError(f"not a kvtier record (magic {bytes(magic)!r})")
    if length > MAX_HEADER:
        raise ChunkError(f"header length {length} is larger than {MAX_HEADER}")
    return PREFIX.size + int(length)


def decode_header(head: Buffer) -> ChunkHeader:
    """The header of a record whose bytes before the payload are ``head``."""
    view = memoryview(head).cast("B")
    _, length, checksum = PREFIX.unpack_from(view)
    body = view[PREFIX.size : PREFIX.size + length]
    if len(body) != length or xxhash.xxh3_64_intdigest(body) != checksum:
        raise ChunkError("header checksum mismatch")
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError as error:
        raise ChunkError(f"header does not decode: {error}") from error


def check_header(
    header: ChunkHeader,
    key: bytes,
    rank: int,
    fingerprint: bytes,
    views: Sequence[int],
    length: int,
    head: int,
) -> None:
    """ChunkError unless ``header`` is ``rank``'s share of ``key`` for ``fingerprint`` with view
    lengths ``views``, in a record of ``length`` bytes whose first ``head`` precede the payload."""
    if header.key != key:
        raise ChunkError(f"holds chunk {header.key.hex()}, not {key.hex()}")
    if header.rank != rank:
        raise ChunkError(f"holds rank {header.rank}'s share, not rank {rank}'s")
    if header.fingerprint != fingerprint:
        raise ChunkError(f"written for layout {header.fingerprint.hex()} ({header.describe}), "
                         f"not {fingerprint.hex()}")  # fmt: skip
    if list(header.views) != list(views):
        raise ChunkError(f"views of {header.views} bytes, expected {list(views)}")
    if length != head + header.payload_bytes:
        raise ChunkError(f"{length} bytes long, expected {head + header.payload_bytes}")


def check_payload(header: ChunkHeader, out: Sequence[np.ndarray]) -> None:
    if payload_checksum(out) != header.checksum:
        raise ChunkError("payload checksum mismatch")


def verify_record(
    record: Buffer,
    key: bytes,
    rank: int,
    fingerprint: bytes,
    out: Sequence[np.ndarray],
    views: Sequence[int] | None = None,
) -> ChunkHeader:
    """Check a whole record held in memory and copy its payload into ``out`` (byte buffers
    whose concatenation receives it) against view lengths ``views`` (None: ``out``'s, one
    buffer per view); ChunkError naming the first check that failed."""
    data = memoryview(record).cast("B")
    if len(data) < PREFIX.size:
        raise ChunkError(f"truncated: {len(data)} bytes")
    head = head_length(data)
    if len(data) < head:
        raise ChunkError(f"truncated: {len(data)} bytes, a header to byte {head}")
    header = decode_header(data[:head])
    expected = [o.nbytes for o in out] if views is None else list(views)
    check_header(header, key, rank, fingerprint, expected, len(data), head)
    if sum(o.nbytes for o in out) != header.payload_bytes:
        raise ValueError(f"kvtier: {sum(o.nbytes for o in out)} bytes to copy a payload of "
                         f"{header.payload_bytes} into")  # fmt: skip
    at = head
    for buffer in out:
        buffer.reshape(-1).view(np.uint8)[:] = np.frombuffer(
            data[at : at + buffer.nbytes], np.uint8
        )
        at += buffer.nbytes
    check_payload(header, out)
    return header

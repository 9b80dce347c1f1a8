"""The transfer protocol's frames (the rows themselves move by ``streams.py``).

Every frame starts with a fixed 16-byte header, ``struct`` format ``>4sBBHQ`` (big-endian)::

    magic    4 bytes   b"KVT1"
    kind     u8        a ``Kind`` below
    flags    u8        0, except DATA: CHECKSUM_XXH3_64 (always set)
    reserved u16       0
    length   u64       bytes of the payload that follows

A control frame's payload is one msgspec-msgpack map, decoded into the frame kind's ``Struct``
with unknown fields refused; its length is checked against a bound (``MAX_CONTROL_BYTES``, 1 MiB)
from the header alone, before anything is allocated. Nothing is ever pickled.

    kind         from    payload
    CHALLENGE 1  server  Challenge {version, nonce}
    ANSWER    2  client  Answer {nonce, identity, proof}
    ACCEPT    3  server  Accept {proof}
    REFUSAL   4  server  Refusal {reason}: the handshake or a pull was refused
    PULL      5  client  Pull {req_id, block_ids, start, stop, nbytes}: rows [start, stop) of
                         request_rows(groups, block_ids) of an offered request
    DATA      6  server  raw: the rows' bytes in order, then their xxh3_64 (8 bytes, big-endian)
    RELEASE   7  client  Release {req_id, ok}: the decode side is done with the offer

A DATA frame's length must be exactly the ``nbytes`` the client asked for plus 8: the client
computes ``nbytes`` from its own layout and refuses any other length before receiving. Rows go
out and come in without a copy (``streams.py``: ``send_rows``, ``recv_rows``, re-exported here).
"""

from __future__ import annotations

import enum
import socket
import struct
from typing import Annotated, NamedTuple

import msgspec

from kvtier.tiers.peer.net.streams import (
    SOCKET_BUFFER_BYTES,
    Hasher,
    recv_rows,
    send_rows,
    tune_socket,
)

MAGIC = b"KVT1"
HEADER = struct.Struct(">4sBBHQ")
HEADER_BYTES = HEADER.size  # 16
MAX_CONTROL_BYTES = 1 << 20
CHECKSUM_XXH3_64 = 0x01
DIGEST_BYTES = 8
VERSION = 1


class Kind(enum.IntEnum):
    CHALLENGE = 1
    ANSWER = 2
    ACCEPT = 3
    REFUSAL = 4
    PULL = 5
    DATA = 6
    RELEASE = 7


class FrameError(Exception):
    """Bytes that are not a valid frame (bad magic, kind, flags, length or payload)."""


class PeerClosed(ConnectionError):
    """The peer closed the connection between frames."""


class Header(NamedTuple):
    kind: Kind
    flags: int
    length: int


_U63 = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
_Nonce = Annotated[bytes, msgspec.Meta(min_length=16, max_length=64)]
_Text = Annotated[str, msgspec.Meta(max_length=4096)]


class Challenge(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    nonce: _Nonce


class Answer(msgspec.Struct, forbid_unknown_fields=True):
    nonce: _Nonce
    identity: list[tuple[_Text, _Text]]
    proof: Annotated[bytes, msgspec.Meta(max_length=64)]


class Accept(msgspec.Struct, forbid_unknown_fields=True):
    proof: Annotated[bytes, msgspec.Meta(max_length=64)]


class Refusal(msgspec.Struct, forbid_unknown_fields=True):
    reason: _Text


class Pull(msgspec.Struct, forbid_unknown_fields=True):
    req_id: _Text
    block_ids: list[list[_U63]]
    start: _U63
    stop: _U63
    nbytes: _U63


class Release(msgspec.Struct, forbid_unknown_fields=True):
    req_id: _Text
    ok: bool


Message = Challenge | Answer | Accept | Refusal | Pull | Release
_KINDS: dict[type[msgspec.Struct], Kind] = {
    Challenge: Kind.CHALLENGE,
    Answer: Kind.ANSWER,
    Accept: Kind.ACCEPT,
    Refusal: Kind.REFUSAL,
    Pull: Kind.PULL,
    Release: Kind.RELEASE,
}
_TYPES = {kind: cls for cls, kind in _KINDS.items()}


def encode_header(kind: Kind, length: int, flags: int = 0) -> bytes:
    return HEADER.pack(MAGIC, kind, flags, 0, length)


def decode_header(data: bytes | bytearray, max_control: int = MAX_CONTROL_BYTES) -> Header:
    """Validate a header from its 16 bytes alone; a control length over ``max_control`` fails."""
    if len(data) != HEADER_BYTES:
        raise FrameError(f"header of {len(data)} bytes, expected {HEADER_BYTES}")
    magic, kind, flags, reserved, length = HEADER.unpack(data)
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r}")
    if kind not in Kind._value2member_map_:
        raise FrameError(f"unknown frame kind {kind}")
    if reserved:
        raise FrameError(f"reserved header bytes set ({reserved})")
    if kind == Kind.DATA:
        if flags != CHECKSUM_XXH3_64:
            raise FrameError(f"DATA frame with flags {flags:#x}")
        if length < DIGEST_BYTES:
            raise FrameError(f"DATA frame of {length} bytes has no checksum")
    elif flags:
        raise FrameError(f"{Kind(kind).name} frame with flags {flags:#x}")
    elif length > max_control:
        raise FrameError(f"{Kind(kind).name} frame declares {length} bytes (bound {max_control})")
    return Header(Kind(kind), flags, length)


def encode_control(message: Message) -> bytes:
    payload = msgspec.msgpack.encode(message)
    return encode_header(_KINDS[type(message)], len(payload)) + payload


def decode_control(header: Header, payload: bytes | bytearray) -> Message:
    """The payload of a control frame as its kind's message; ``FrameError`` when malformed."""
    if header.kind not in _TYPES:
        raise FrameError(f"{header.kind.name} is not a control frame")
    try:
        message: Message = msgspec.msgpack.decode(payload, type=_TYPES[header.kind])  # type: ignore[assignment]
    except msgspec.MsgspecError as e:
        raise FrameError(f"malformed {header.kind.name} payload: {e}") from None
    return message


def send_control(sock: socket.socket, message: Message) -> None:
    sock.sendall(encode_control(message))


def recv_header(
    sock: socket.socket, max_control: int = MAX_CONTROL_BYTES, *, idle: bool = False
) -> Header:
    """The next frame's header. ``idle``: wait for its first byte without a timeout (between
    requests on a pooled connection; ``shutdown`` wakes it); ``PeerClosed`` on EOF there."""
    buf = bytearray(HEADER_BYTES)
    got = 0
    if idle:
        timeout = sock.gettimeout()
        sock.settimeout(None)
        try:
            got = sock.recv_into(buf)
        finally:
            sock.settimeout(timeout)
        if got == 0:
            raise PeerClosed("closed between frames")
    recv_exact_into(sock, memoryview(buf)[got:])
    return decode_header(buf, max_control)


def recv_control(sock: socket.socket, header: Header) -> Message:
    """The payload of a control frame whose header was read (its length is already bounded)."""
    if header.kind not in _TYPES:
        raise FrameError(f"{header.kind.name} is not a control frame")
    payload = bytearray(header.length)
    recv_exact_into(sock, memoryview(payload))
    return decode_control(header, payload)


def recv_message(sock: socket.socket, max_control: int = MAX_CONTROL_BYTES) -> Message:
    header = recv_header(sock, max_control)
    return recv_control(sock, header)


def recv_exact_into(sock: socket.socket, buf: memoryview) -> None:
    while buf.nbytes:
        n = sock.recv_into(buf)
        if n == 0:
            raise ConnectionError("connection closed by the peer")
        buf = buf[n:]


__all__ = [
    "SOCKET_BUFFER_BYTES", "Hasher", "recv_rows", "send_rows", "tune_socket",
]  # fmt: skip

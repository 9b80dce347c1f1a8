"""The transfer protocol's frames, and sending and receiving rows without copying them.

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
out with ``sendmsg`` (gather) and come in with ``recvmsg_into`` (scatter) in batches of at most
``IOV_MAX`` buffers, straight from and into the engine's rows; each batch is hashed right after it
moved, while it is still in cache.

Over 300 lines because the frames and the zero-copy send and receive of their rows are one
format, read best in one place.
"""

from __future__ import annotations

import enum
import os
import socket
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import Annotated, NamedTuple, Protocol

import msgspec

MAGIC = b"KVT1"
HEADER = struct.Struct(">4sBBHQ")
HEADER_BYTES = HEADER.size  # 16
MAX_CONTROL_BYTES = 1 << 20
CHECKSUM_XXH3_64 = 0x01
DIGEST_BYTES = 8
VERSION = 1
IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024)
BATCH_BYTES = 1 << 20  # hashed while still in cache
SOCKET_BUFFER_BYTES = 4 << 20
RECV_LOWAT_MIN, RECV_LOWAT_MAX = 64 << 10, 256 << 10  # bytes that wake a receive of rows


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


class Hasher(Protocol):
    def update(self, data: memoryview, /) -> object: ...


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


def tune_socket(sock: socket.socket) -> None:
    """TCP_NODELAY and socket buffers of ``SOCKET_BUFFER_BYTES`` (capped by the kernel)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)


def send_rows(
    sock: socket.socket, head: bytes, views: Sequence[memoryview], hasher: Hasher
) -> None:
    """Send ``head`` then ``views`` (gather, partial sends resumed), hashing the views."""
    cursor = _Cursor([memoryview(head), *views] if head else list(views), hash_from=len(head))
    while not cursor.done():
        for sent in cursor.advance(sock.sendmsg(cursor.batch())):
            hasher.update(sent)


def recv_rows(sock: socket.socket, views: Sequence[memoryview], hasher: Hasher) -> None:
    """Receive exactly the bytes of ``views`` into them (scatter), hashing what arrived.

    While more is due, the socket wakes the receiver only once ``SO_RCVLOWAT`` bytes arrived (a
    quarter of the rows, 64-256 KiB): fewer, larger receives, each a Python round of its own. A
    peer that closes or resets still wakes it at once; the mark is back at 1 byte on return.
    """
    cursor = _Cursor(list(views))
    target = min(RECV_LOWAT_MAX, max(RECV_LOWAT_MIN, cursor.total // 4))
    lowat = 1
    try:
        while not cursor.done():
            want = min(target, cursor.total - cursor.position)
            if want != lowat:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                lowat = want
            n = sock.recvmsg_into(cursor.batch())[0]
            if n == 0:
                raise ConnectionError("connection closed by the peer in the middle of the data")
            for received in cursor.advance(n):
                hasher.update(received)
    finally:
        if lowat != 1:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
            except OSError:
                pass  # closed meanwhile: the error that ended the receive is the one to raise


class _Cursor:
    """A position in the bytes of a list of views: the next batch to move, and what moved.

    ``ends[k]`` is the stream offset just past view ``k``; the view holding byte ``p`` is the
    first ``k`` with ``ends[k] > p`` (a bisection, so a call costs the same for any list).
    """

    def __init__(self, views: list[memoryview], hash_from: int = 0) -> None:
        self.views = views
        self.ends = list(accumulate(v.nbytes for v in views))
        self.total = self.ends[-1] if views else 0
        self.position = 0  # bytes moved
        self.index = 0  # the view holding byte ``position``
        self.hash_from = hash_from  # bytes before it are not handed back for hashing

    def done(self) -> bool:
        return self.position >= self.total

    def batch(self) -> list[memoryview]:
        i = self.index
        stop = bisect_left(self.ends, self.position + BATCH_BYTES, i) + 1
        out = self.views[i : min(stop, i + IOV_MAX)]
        skip = self.position - (self.ends[i] - out[0].nbytes)
        if skip:
            out[0] = out[0][skip:]
        return out

    def advance(self, n: int) -> list[memoryview]:
        low, high = max(self.position, self.hash_from), self.position + n
        moved: list[memoryview] = []
        if low < high:
            first = bisect_right(self.ends, low, self.index)
            last = bisect_right(self.ends, high - 1, first)
            moved = self.views[first : last + 1]
            start = low - (self.ends[first] - moved[0].nbytes)
            stop = high - (self.ends[last] - moved[-1].nbytes)
            if first == last:
                moved[0] = moved[0][start:stop]
            else:
                moved[0] = moved[0][start:] if start else moved[0]
                moved[-1] = moved[-1][:stop]
        self.position = high
        self.index = bisect_right(self.ends, high, self.index)
        return moved

"""Rows sent and received without copying them: ``sendmsg`` (gather) and ``recvmsg_into``
(scatter) in batches of at most ``IOV_MAX`` buffers, straight from and into the engine's rows;
each batch is hashed right after it moved, while it is still in cache.

    tune_socket(sock)                    TCP_NODELAY, large socket buffers
    send_rows(sock, head, views, hasher) ``head`` then ``views``, hashing the views
    recv_rows(sock, views, hasher)       exactly the bytes of ``views`` into them, hashed
"""

from __future__ import annotations

import os
import socket
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate
from operator import attrgetter
from typing import Protocol

IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024)
BATCH_BYTES = 1 << 20  # hashed while still in cache
SOCKET_BUFFER_BYTES = 4 << 20
RECV_LOWAT_MIN, RECV_LOWAT_MAX = 64 << 10, 256 << 10  # bytes that wake a receive of rows


class Hasher(Protocol):
    def update(self, data: memoryview, /) -> object: ...


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
        self.ends = list(accumulate(map(attrgetter("nbytes"), views)))
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

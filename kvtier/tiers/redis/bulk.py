"""A GET in flight (``Ticket``) and its reply's bytes (``Bulk``), read in order straight from
the connection's socket."""

from __future__ import annotations

from kvtier.tiers.redis.conn import Connection


class Bulk:
    """The ``length`` bytes of one bulk reply, read in order; ``finish`` drops what was not
    read and the reply's end, leaving the connection at the next reply."""

    def __init__(self, conn: Connection, length: int) -> None:
        self.conn = conn
        self.length = length
        self.consumed = 0

    @property
    def left(self) -> int:
        return self.length - self.consumed

    def read_into(self, out: memoryview) -> None:
        if len(out) > self.left:
            raise IndexError(f"{len(out)} bytes asked of a reply with {self.left} left")
        self.conn.read_into(out)
        self.consumed += len(out)

    def read_bytes(self, nbytes: int) -> bytes:
        out = bytearray(nbytes)
        self.read_into(memoryview(out))
        return bytes(out)

    def ended(self) -> bool:
        return not self.left

    def finish(self) -> None:
        self.conn.skip(self.left)
        self.consumed = self.length
        self.conn.end_bulk()


class Ticket:
    """A read of the value under ``name`` sent on ``conn``: its ``replies`` not read yet (a
    GET's one, or a large value's pieces, ``pieces.py``, for an expected ``size``)."""

    def __init__(
        self, name: bytes, conn: Connection, lane: int, size: int | None = None, replies: int = 1
    ) -> None:
        self.name, self.conn, self.lane = name, conn, lane
        self.size, self.replies = size, replies
        self.dropped = False  # its replies were skipped: send it again to read it

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

    def finish(self) -> None:
        self.conn.skip(self.left)
        self.consumed = self.length
        self.conn.end_bulk()


class Ticket:
    """A GET sent on ``conn``, its reply not read yet."""

    def __init__(self, name: bytes, conn: Connection, lane: int) -> None:
        self.name, self.conn, self.lane = name, conn, lane
        self.dropped = False  # its reply was skipped: send it again to read it

"""A large value read in pieces: the commands (``read_commands``) and their replies as one
stream of bytes (``open_value``, ``Pieces``).

    read_commands(name, size)    GET, or for a value of more than PIECE_BYTES: EXISTS, then the
                                 GETRANGEs of equal pieces of at most PIECE_BYTES, the last to
                                 the value's end
    open_value(conn, replies)    the value whose replies come next: a ``Bulk`` (a GET's), the
      -> Bulk | Pieces | None    ``Pieces`` (``read_into``, ``ended``, ``finish``), or None: absent
    open_ticket(ticket)          the same for a ``Ticket``, the unread replies before it dropped
    refuses_pieces(error)        whether an error reply refuses GETRANGE itself (an ACL): the
                                 store then reads every value whole (``RedisStore.pieces``)

Why: Redis and Valkey build each reply in memory of their allocator, jemalloc 5.3, which puts
allocations of 8 MiB or more (``oversize_threshold``) in an arena of their own, purged eagerly:
such a reply is mapped afresh each time. Measured on 127.0.0.1 (Redis 7.0.15, Valkey 8.0.1, two
cores, ``INFO commandstats``): the server spent 0.84 ms on a GET of a 6 MiB value, 5.4 ms on one
of 8 MiB (6.5 x the time for a third more bytes), 0.09 ms on a GETRANGE of 1 MiB. An 8B model's
64-token record is 8 MiB: ``kvtier bench gpu --device cpu --measures redis`` loaded it at
0.43-0.46 x a raw TCP stream read whole, 0.95-1.02 x in pieces of at most 2 MiB (4 MiB: 0.86).

A record read in pieces is not one atomic read: a record replaced or evicted in between gives a
mix of two records or a short one, which its checks (header, length, payload checksum) refuse,
like any damaged record. ``EXISTS`` tells an absent record (a miss) from an empty value (a bad
record): a GETRANGE answers both with nothing. A piece refused (``MOVED``: its slot moved during
the read) raises a ``RespError``; ``RedisStore.read_get`` makes it a miss.
"""

from __future__ import annotations

from kvtier.tiers.base.chunk_format import ChunkError
from kvtier.tiers.redis.bulk import Bulk, Ticket
from kvtier.tiers.redis.conn import Connection
from kvtier.tiers.redis.errors import RespError

PIECE_BYTES = 2 << 20  # the most a GETRANGE asks for: a quarter of jemalloc's 8 MiB


def read_commands(name: bytes, size: int | None) -> list[list[bytes]]:
    """The commands that read the value under ``name``, of about ``size`` bytes (None: not
    known): a GET, or EXISTS and the GETRANGEs of equal pieces, the last to the value's end
    (a record may be a few bytes shorter or longer than planned: its header is msgpack)."""
    if size is None or size <= PIECE_BYTES:
        return [[b"GET", name]]
    count = -(-size // PIECE_BYTES)
    step = -(-size // count)
    ends = [b"%d" % (start + step - 1) for start in range(0, step * (count - 1), step)] + [b"-1"]
    return [[b"EXISTS", name]] + [
        [b"GETRANGE", name, b"%d" % (i * step), end] for i, end in enumerate(ends)
    ]


class Pieces:
    """The bytes of the replies to GETRANGEs sent in a row on ``conn``, as one value. The first
    reply's head was read (``length``); ``more`` replies follow it. ``length`` of the whole is
    None: known only once every piece was read. ``finish`` drops what was not read and the
    replies after it, leaving the connection at the next reply."""

    length: int | None = None

    def __init__(self, conn: Connection, length: int | None, more: int) -> None:
        self.conn = conn
        self._left = length or 0  # bytes of the current piece not read yet
        self._open = length is not None  # the current piece's end (``\r\n``) not read yet
        self._more = more  # replies not begun

    def read_into(self, out: memoryview) -> None:
        """The next ``len(out)`` bytes of the value; ChunkError when it ends before."""
        while len(out):
            if not self._left and not self._next():
                raise ChunkError(f"truncated: the value ended {len(out)} bytes early")
            step = min(len(out), self._left)
            self.conn.read_into(out[:step])
            self._left -= step
            out = out[step:]

    def read_bytes(self, nbytes: int) -> bytes:
        out = bytearray(nbytes)
        self.read_into(memoryview(out))
        return bytes(out)

    def ended(self) -> bool:
        """Whether the value has no bytes left (the heads of the replies after are read)."""
        return not self._left and not self._next()

    def finish(self) -> None:
        self._end_piece()
        more, self._more = self._more, 0
        skip_replies(self.conn, more)

    def _next(self) -> bool:
        """Begin the next piece that has bytes: False when none has. An error reply (a slot
        that moved while the pieces were read) is raised, a ``RespError``, the reply read."""
        while self._more:
            self._end_piece()
            self._more -= 1
            length = self.conn.read_bulk_head()
            self._open, self._left = length is not None, length or 0
            if self._left:
                return True
        return False

    def _end_piece(self) -> None:
        if self._open:
            self.conn.skip(self._left)
            self._left = 0
            self.conn.end_bulk()
            self._open = False


Reader = Bulk | Pieces  # a value's bytes as they are read


def open_ticket(ticket: Ticket) -> Reader | None:
    """``open_value`` of ``ticket``'s read, the replies before it that nobody read dropped."""
    conn = ticket.conn
    while conn.waiting[0] is not ticket:
        dropped = conn.waiting.popleft()
        dropped.dropped = True
        skip_replies(conn, dropped.replies)
    conn.waiting.popleft()
    return open_value(conn, ticket.replies)


def refuses_pieces(error: RespError) -> bool:
    """Whether ``error`` refuses the commands of a read in pieces themselves (an ACL without
    GETRANGE, a proxy or a server that renamed it), not this one value."""
    return str(error).startswith(("NOPERM", "ERR unknown command"))


def open_value(conn: Connection, replies: int) -> Reader | None:
    """The value whose ``replies`` (``read_commands``) come next on ``conn``, its first bytes'
    head read; None: no such key. An error reply is raised (a ``RespError``), the replies after
    it dropped: the connection stays in step."""
    if replies == 1:
        length = conn.read_bulk_head()
        return None if length is None else Bulk(conn, length)
    left = replies - 1
    try:
        found = conn.read_reply()  # EXISTS's: an error reply is returned, not raised
        if isinstance(found, RespError):
            raise found
        if found != 1:
            return None
        left -= 1
        pieces = Pieces(conn, conn.read_bulk_head(), left)
        left = 0
        return pieces
    finally:
        if not conn.closed:
            skip_replies(conn, left)


def skip_replies(conn: Connection, count: int) -> None:
    for _ in range(count):
        conn.skip_reply()

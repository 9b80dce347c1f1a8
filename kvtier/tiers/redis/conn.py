"""One RESP2 connection to a Redis/Valkey node, written on a socket for the bulk data path.

    Connection(address, timeout_s, tls)   connect (TCP, TLS or unix socket), AUTH, SELECT
    send(commands)                        pipeline: write several commands, read replies later
    read_reply() -> value | RespError     the next reply (an error reply returned, not raised)
    read_bulk_head() -> length | None     the head of a bulk reply (GET): None when nil
    Bulk(conn, length)                    then its bytes (``bulk.py``): read_into(view), ...
    skip_reply()                          drop a reply no longer wanted
    call(*command) -> value               one command, its reply; an error reply raised

redis-py reads a large value into fresh bytes objects and joins them; here a GET's reply goes
straight into the caller's buffers with ``recv_into`` (the record's header through a small
buffer, its payload into the destination rows), and a SET's payload leaves with ``sendmsg``
from the caller's buffers, unjoined. Every socket call is bounded by ``timeout_s`` (the whole
name lookup, connect, handshake and login too: ``kvtier.connect``). An error reply (``-MOVED``,
``-OOM``, ``-WRONGPASS`` ...) is a typed ``RespError`` and leaves the connection in step; any
other failure closes the connection (``closed``) so that it is never read again from the middle
of a reply.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from kvtier.connect import connect
from kvtier.tiers.redis.errors import ProtocolError, RespError, TlsHandshakeError, error_reply
from kvtier.tiers.redis.url import RedisAddress

Arg = bytes | memoryview
Value = Arg | tuple[Arg, ...]  # a tuple: one bulk string sent from several buffers, unjoined
READ_CHUNK = 1 << 16  # the receive buffer of replies' heads and small replies
MAX_LINE = 1 << 16  # a reply line longer than this is not Redis speaking
MAX_IOV = 512  # buffers per sendmsg
BIG_ARG = 1 << 14  # an argument this long is sent from its own buffer, not copied


class Connection:
    def __init__(self, address: RedisAddress, timeout_s: float, tls: ssl.SSLContext | None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._buf = bytearray(READ_CHUNK)
        self._start = self._end = 0  # unread bytes are _buf[_start:_end]
        self._tls = tls is not None
        self._sock = self._open(address, tls, time.monotonic() + timeout_s)
        self.closed = False
        self.waiting: deque[Any] = deque()  # the owner's marks of replies not read yet, in order
        try:
            self._login(address, time.monotonic() + timeout_s)
        except BaseException:
            self.close()
            raise
        self._sock.settimeout(timeout_s)

    @staticmethod
    def _open(address: RedisAddress, tls: ssl.SSLContext | None, deadline: float) -> socket.socket:
        if address.path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(_left(deadline))
                sock.connect(address.path)
            except BaseException:
                sock.close()
                raise
            return sock
        sock = connect(address.host, address.port, _left(deadline))  # the lookup bounded too
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is None:
                return sock
            sock.settimeout(_left(deadline))
            return tls.wrap_socket(sock, server_hostname=address.host)
        except ssl.SSLCertVerificationError:
            sock.close()
            raise
        except (ssl.SSLError, ConnectionError) as error:
            sock.close()
            raise TlsHandshakeError(f"TLS handshake failed: {error}") from error
        except TimeoutError as error:  # a plain Redis port waits for the end of a "command"
            sock.close()
            raise TlsHandshakeError("connected, but no TLS handshake in time") from error
        except BaseException:
            sock.close()
            raise

    def _login(self, address: RedisAddress, deadline: float) -> None:
        if address.username or address.password:
            self._sock.settimeout(_left(deadline))
            user = [address.username.encode()] if address.username else []
            self.call(b"AUTH", *user, (address.password or "").encode())
        if address.db:
            self._sock.settimeout(_left(deadline))
            self.call(b"SELECT", str(address.db).encode())

    def close(self) -> None:
        self.closed = True
        try:
            self._sock.close()
        except OSError:
            pass

    # ---- sending ---------------------------------------------------------------------------

    def send(self, commands: Sequence[Sequence[Value]]) -> None:
        """Send ``commands`` (each a list of arguments) without waiting for their replies."""
        buffers: list[memoryview] = []
        small = bytearray()
        for command in commands:
            small += b"*%d\r\n" % len(command)
            for arg in command:
                parts = [
                    memoryview(p).cast("B") for p in (arg if isinstance(arg, tuple) else (arg,))
                ]
                small += b"$%d\r\n" % sum(part.nbytes for part in parts)
                for part in parts:
                    if part.nbytes >= BIG_ARG:
                        buffers += [memoryview(bytes(small)), part]
                        small = bytearray()
                    else:
                        small += part
                small += b"\r\n"
        buffers.append(memoryview(bytes(small)))
        self._guard(self._send_all, buffers)

    def _send_all(self, views: list[memoryview]) -> None:
        if self._tls:  # an SSLSocket has no sendmsg
            for view in views:
                self._sock.sendall(view)
            return
        while views:
            sent = self._sock.sendmsg(views[:MAX_IOV])
            while views and sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            if views and sent:
                views[0] = views[0][sent:]

    def call(self, *command: Value) -> Any:
        """One command and its reply; an error reply is raised."""
        self.send([command])
        reply = self.read_reply()
        if isinstance(reply, RespError):
            raise reply
        return reply

    # ---- receiving -------------------------------------------------------------------------

    def read_reply(self) -> Any:
        """One reply: str, int, bytes, None, a list, or a ``RespError`` (returned, not raised)."""
        return self._guard(self._reply)

    def read_bulk_head(self) -> int | None:
        """The length of the bulk-string reply that comes next (None: nil); its bytes follow,
        then ``end_bulk``. An error reply is raised (a ``RespError``; the connection in step)."""
        line = self._guard(self._line)
        if line[:1] == b"$":
            length = int(line[1:]) if line[1:].lstrip(b"-").isdigit() else -2
            if length >= -1:
                return None if length == -1 else length
        elif line[:1] == b"-":
            raise error_reply(line[1:].decode(errors="replace"))
        self.close()
        raise ProtocolError(f"unexpected reply {line[:40]!r} to a GET")

    def read_into(self, out: memoryview) -> None:
        """The next ``len(out)`` bytes of the stream into ``out``: what is buffered, then the
        rest straight from the socket."""
        self._guard(self._read_into, out)

    def read_bytes(self, nbytes: int) -> bytes:
        out = bytearray(nbytes)
        self.read_into(memoryview(out))
        return bytes(out)

    def skip(self, nbytes: int) -> None:
        """Drop the next ``nbytes`` of the stream (the rest of a reply not wanted)."""
        self._guard(self._skip, nbytes)

    def end_bulk(self) -> None:
        """The ``\\r\\n`` that ends a bulk string."""
        if self.read_bytes(2) != b"\r\n":
            self.close()
            raise ProtocolError("a bulk reply longer than it said")

    def skip_reply(self) -> None:
        """Drop the next reply, whatever it is (one a caller no longer wants)."""
        self._guard(self._skip_reply)

    def _guard(self, step: Any, *args: Any) -> Any:
        """``step(*args)``; any failure closes the connection (it may be mid-reply)."""
        if self.closed:
            raise ConnectionError(f"connection to {self.address.describe()} closed")
        try:
            return step(*args)
        except (ValueError, IndexError) as error:  # a reply that does not parse
            self.close()
            raise ProtocolError(f"a reply that is not RESP2: {error}") from error
        except BaseException:
            self.close()
            raise

    def _reply(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return error_reply(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            length = int(rest)
            if length < 0:
                return None
            out = bytearray(length + 2)
            self._read_into(memoryview(out))
            return bytes(out[:length])
        if kind == b"*":
            count = int(rest)
            return None if count < 0 else [self._reply() for _ in range(count)]
        raise ProtocolError(f"unexpected reply {line[:40]!r}")

    def _skip_reply(self) -> None:
        line = self._line()
        if line[:1] == b"$" and int(line[1:]) >= 0:
            self._skip(int(line[1:]) + 2)
        elif line[:1] == b"*":
            for _ in range(max(0, int(line[1:]))):
                self._skip_reply()

    def _fill(self) -> None:
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buf):  # move the unread bytes to the front
            unread = self._end - self._start
            self._buf[:unread] = self._buf[self._start : self._end]
            self._start, self._end = 0, unread
            if unread >= MAX_LINE:
                raise ProtocolError("a reply line longer than 64 KiB")
        got = self._sock.recv_into(memoryview(self._buf)[self._end :])
        if got == 0:
            raise ConnectionResetError(f"{self.address.describe()} closed the connection")
        self._end += got

    def _line(self) -> bytes:
        while True:
            at = self._buf.find(b"\r\n", self._start, self._end)
            if at >= 0:
                line = bytes(self._buf[self._start : at])
                self._start = at + 2
                return line
            self._fill()

    def _read_into(self, out: memoryview) -> None:
        have = min(len(out), self._end - self._start)
        out[:have] = self._buf[self._start : self._start + have]
        self._start += have
        view = out[have:]
        while len(view):
            got = self._sock.recv_into(view)
            if got == 0:
                raise ConnectionResetError(f"{self.address.describe()} closed the connection")
            view = view[got:]

    def _skip(self, nbytes: int) -> None:
        while nbytes:
            if self._start == self._end:
                self._fill()
            step = min(nbytes, self._end - self._start)
            self._start += step
            nbytes -= step


def _left(deadline: float) -> float:
    """Seconds to ``deadline``; a TimeoutError once it passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left

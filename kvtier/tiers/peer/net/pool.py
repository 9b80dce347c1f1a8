"""``ConnectionPool``: one peer's idle authenticated connections, reused across pulls."""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable


class ConnectionPool:
    """Idle connections to ``host:port``; ``checkout`` hands out a live one or opens one.

    A connection is idle only between whole exchanges (the stream is at a frame boundary). One
    the peer closed meanwhile (readable while idle: EOF or stray bytes) is dropped on checkout.
    """

    def __init__(
        self,
        host: str,
        port: int,
        connect: Callable[[str, int], socket.socket],
        max_idle: int,
    ) -> None:
        self.host, self.port = host, port
        self._connect = connect
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[socket.socket] = []
        self._closed = False

    def checkout(self) -> socket.socket:
        """A live idle connection, else a new one (``connect`` raises ``TransferError``)."""
        return self.take_idle() or self._connect(self.host, self.port)

    def take_idle(self) -> socket.socket | None:
        while True:
            with self._lock:
                if not self._idle:
                    return None
                sock = self._idle.pop()
            if _idle_and_open(sock):
                return sock
            sock.close()

    def checkin(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(sock)
                return
        sock.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()


def _idle_and_open(sock: socket.socket) -> bool:
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
    except (OSError, ValueError):
        return False  # closed
    return not poller.poll(0)  # an idle connection has nothing to read: EOF or stray bytes end it

"""The network bound: one raw TCP stream of the same bytes on 127.0.0.1, nothing else.

Loopback(sources, tune)   a connected pair of sockets, each given to ``tune`` (default:
                          tuned as kvtier's transfers tune theirs, ``wire.tune_socket``)
Loopback.of(nbytes)       the same over ``nbytes`` of one repeated byte
.stream()                 ``sendall`` of every source by one thread, ``recv_into`` one
                          preallocated buffer by the caller's: returns once the last byte
                          arrived (an error of the sender is raised here)
.arrived_intact()         whether the buffer holds the sources' bytes, in order
.close()
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence

import numpy as np

from kvtier.tiers.peer.net import wire


def no_delay(sock: socket.socket) -> None:
    """``TCP_NODELAY`` only, as redis-py's connections."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Loopback:
    def __init__(
        self,
        sources: Sequence[memoryview],
        tune: Callable[[socket.socket], None] = wire.tune_socket,
    ) -> None:
        self.sources = list(sources)
        self.buffer = bytearray(sum(s.nbytes for s in self.sources))
        with socket.create_server(("127.0.0.1", 0)) as listener:
            self.sender = socket.create_connection(listener.getsockname())
            self.receiver, _ = listener.accept()
        for sock in (self.sender, self.receiver):
            tune(sock)

    @classmethod
    def of(cls, nbytes: int) -> Loopback:
        return cls([memoryview(np.full(nbytes, 0x5A, dtype=np.uint8).data)])

    def stream(self) -> None:
        errors: list[BaseException] = []
        thread = threading.Thread(target=self._send, args=(errors,), name="kvtier-bench-raw")
        thread.start()
        view = memoryview(self.buffer)
        try:
            while view.nbytes:
                got = self.receiver.recv_into(view)
                if not got:
                    raise ConnectionError("the raw sender closed early")
                view = view[got:]
        finally:
            thread.join()
        if errors:
            raise errors[0]

    def _send(self, errors: list[BaseException]) -> None:
        try:
            for source in self.sources:
                self.sender.sendall(source)
        except OSError as error:
            errors.append(error)

    def arrived_intact(self) -> bool:
        at = 0
        for source in self.sources:
            if self.buffer[at : at + source.nbytes] != source:
                return False
            at += source.nbytes
        return True

    def close(self) -> None:
        self.sender.close()
        self.receiver.close()

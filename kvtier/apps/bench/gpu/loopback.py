"""The network bound: one raw TCP stream of the same bytes on 127.0.0.1, nothing else.

Loopback(nbytes)   a connected pair of sockets tuned as kvtier's transfers tune theirs
.stream()          ``sendall`` of ``nbytes`` by one thread, ``recv_into`` one preallocated
                   buffer by the caller's: returns once the last byte arrived
.close()
"""

from __future__ import annotations

import socket
import threading

import numpy as np

from kvtier.tiers.peer.net import wire


class Loopback:
    def __init__(self, nbytes: int) -> None:
        self.source = memoryview(np.full(nbytes, 0x5A, dtype=np.uint8).data)
        self.buffer = bytearray(nbytes)
        with socket.create_server(("127.0.0.1", 0)) as listener:
            self.sender = socket.create_connection(listener.getsockname())
            self.receiver, _ = listener.accept()
        for sock in (self.sender, self.receiver):
            wire.tune_socket(sock)

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
            self.sender.sendall(self.source)
        except OSError as error:
            errors.append(error)

    def close(self) -> None:
        self.sender.close()
        self.receiver.close()

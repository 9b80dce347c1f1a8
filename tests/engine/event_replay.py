"""An engine's published KV events, read back from its replay socket, for engine tests.

Replay(endpoint)       a client of the engine's ZMQ replay socket
Replay.events()        every batch's events the engine still buffers, oldest first
Replay.wait(done)      the events once ``done(events)`` holds (at most ``WAIT_S``)
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import zmq
from vllm.distributed.kv_events import KVEventBatch

WAIT_S = 30.0  # the publisher thread sends a step's batch after the step


class Replay:
    """Every batch the engine published, asked from its replay socket (no slow-joiner race)."""

    def __init__(self, endpoint: str) -> None:
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)

    def events(self) -> list[Any]:
        self.socket.send_multipart([b"", (0).to_bytes(8, "big")])
        events: list[Any] = []
        while True:
            assert self.socket.poll(10_000), "no answer from the replay socket in 10 s"
            _, _, seq, payload = self.socket.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) < 0:
                return events
            events += self.decoder.decode(payload).events

    def wait(self, done: Any) -> list[Any]:
        """The events, once ``done(events)`` holds (bounded)."""
        deadline = time.monotonic() + WAIT_S
        while not done(events := self.events()):
            assert time.monotonic() < deadline, f"events not as expected in {WAIT_S} s: {events}"
            time.sleep(0.05)
        return events

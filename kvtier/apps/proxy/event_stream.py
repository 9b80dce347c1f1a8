"""One engine's KV events, followed on a thread of its own and placed in the proxy's index.

    EventStream(engine, source, index, lock).start() / .stop()   (sources: ``event_sources.py``)
    EventStream.mode, .reason    exact, degraded (rebuilding), or down (no events)

vLLM publishes each step's events on a ZMQ PUB socket, each batch numbered, and keeps the last
batches for a ROUTER *replay* socket that answers "from number N" with them, then an end marker
(-1). The stream subscribes first, then asks the replay from 0 (nothing published meanwhile is
lost: it waits in the subscription, and batches already seen are skipped by number), so a proxy
started (or restarted) after the engine rebuilds its index from the engine's buffer. A batch
number that skips one is a gap: the engine is *degraded* (routed by load) until the missing
batches are replayed; if the buffer no longer has them, what the engine told is forgotten and
the buffer replayed from its start, so the index never keeps a block the engine removed in a
batch it lost. No answer from the replay socket within ``timeout_s``: the stream says why, is
down, and tries again. vLLM's replay socket (a ZMQ ROUTER) drops what passes its high-water mark
(vLLM 0.32: 1,000 batches; from 0.33 twice what its buffer keeps, 10,000), so a replay counts
only as far as its batches follow one another: placed up to a missing one (or a lost end
marker), then asked again from there.
A stream quiet for ``check_s`` asks the replay socket what followed its last batch, so events
that stopped (a publisher gone while the engine still answers /health) show as down, and batches
the subscription missed are placed. An engine whose blocks hold another number of tokens than
the fleet's index (the first engine told) is refused: an error names both sizes, and the engine
is routed by load, never matched with silent misses. Hash seeds and functions need not agree:
the index is keyed by tokens (``prefix_index.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import NamedTuple

import zmq

from kvtier.apps.proxy.event_sources import Source
from kvtier.apps.proxy.kv_events import Kind, decode_batch
from kvtier.apps.proxy.prefix_index import PrefixIndex

logger = logging.getLogger(__name__)

END = -1  # the replay's end marker
POLL_MS = 200  # how long the thread waits for a batch before it looks at ``stop`` again
RETRY_S = 1.0  # before asking a replay socket that did not answer again
CHECK_S = 10.0  # a stream quiet this long asks the replay socket what it missed (are they alive?)
QUIET_S = 1.0  # a replay that sent nothing for this long lost the rest (or its end marker)


class Mode(Enum):
    EXACT = "exact"  # every batch since the replay placed
    DEGRADED = "degraded"  # a gap: rebuilding from the replay; routed by load meanwhile
    DOWN = "down"  # no events (not started, replay unanswered): routed by load


class Replayed(NamedTuple):
    """What a replay sent: ``batches`` (number, payload) that follow one another from the first,
    and whether it ended (``whole``: the end marker came right after them)."""

    batches: list[tuple[int, bytes]]
    whole: bool


class EventStream:
    def __init__(
        self,
        engine: str,
        source: Source,
        index: PrefixIndex,
        lock: threading.Lock,
        timeout_s: float = 5.0,
        check_s: float = CHECK_S,
        changed: Callable[[], None] | None = None,
    ) -> None:
        self.changed = changed  # called (from the stream's thread) when its mode changes
        self.engine = engine
        self.check_s = check_s
        self.source = source
        self.index = index
        self.lock = lock
        self.timeout_s = timeout_s
        self._mode = Mode.DOWN
        self.reason = "not started"
        self.last = -1  # the last batch placed
        self.gaps = 0  # batch numbers skipped, since start
        self.batches = 0
        self.refused = False  # its events cannot be indexed (another block size): not followed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kvtier-events {engine}",
                                        daemon=True)  # fmt: skip

    @property
    def mode(self) -> Mode:
        return self._mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        if mode is not self._mode:
            self._mode = mode
            if self.changed is not None:
                self.changed()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        sub.connect(self.source.endpoint)
        checked = time.monotonic()
        try:
            while not self._stop.is_set():
                if self.refused:
                    self._stop.wait(RETRY_S)
                    continue
                if self.mode is not Mode.EXACT and not self._rebuild(context):
                    self._stop.wait(RETRY_S)
                    continue
                if sub.poll(POLL_MS):
                    _, seq, payload = sub.recv_multipart()
                    self._receive(int.from_bytes(seq, "big", signed=True), payload)
                elif time.monotonic() - checked >= self.check_s:
                    checked = time.monotonic()
                    self._check(context)
        except Exception:  # never let a bad engine take the thread down silently
            logger.exception("kvtier proxy: %s's event stream failed", self.engine)
            self.mode, self.reason = Mode.DOWN, "the stream failed (see the log)"
        finally:
            sub.close()

    def _receive(self, seq: int, payload: bytes) -> None:
        if seq <= self.last:
            return  # replayed already
        if seq != self.last + 1:  # (the first batch is 0: one published before the
            # subscription took hold, and after the replay was asked, is a gap too)
            self.gaps += 1
            self.mode, self.reason = Mode.DEGRADED, f"batches {self.last + 1}..{seq - 1} lost"
            logger.warning("kvtier proxy: %s: %s; rebuilding from its replay",
                           self.engine, self.reason)  # fmt: skip
            return  # the replay brings this one too
        self._place(seq, payload)

    def _place(self, seq: int, payload: bytes) -> None:
        try:
            events = decode_batch(payload)
        except ValueError as exc:
            logger.warning("kvtier proxy: %s: batch %d unreadable: %s", self.engine, seq, exc)
            events = []
        with self.lock:
            size = self.index.block_size
            other = next((e.block_size for e in events if e.kind is Kind.STORED and size
                          and e.block_size != size and e.group == 0), None)  # fmt: skip
            if other is None:
                self.index.apply(self.engine, events)
        if other is not None:
            self._refuse(
                f"its blocks hold {other} tokens, the fleet's index {size}: its "
                "prefixes cannot be matched; give every engine the same --block-size"
            )
            return
        self.last = seq
        self.batches += 1

    def _check(self, context: zmq.Context[zmq.Socket[bytes]]) -> None:
        """A quiet stream: an idle engine, or events that stopped. Its replay socket is asked
        what followed the last batch placed: no answer, down (routed by load) until it answers
        again; batches the subscription missed are placed, or, past a gap, rebuilt."""
        if self.source.replay is None:
            return
        replayed = self._replay(context, self.last + 1)
        if replayed is None:
            logger.warning("kvtier proxy: %s: %s; routed by load until it answers",
                           self.engine, self.reason)  # fmt: skip
            return
        for seq, payload in replayed.batches:
            if self.refused:
                return
            self._receive(seq, payload)
        if not replayed.whole and self.mode is Mode.EXACT:  # the rest is asked for again
            self.mode, self.reason = Mode.DEGRADED, f"a replay stopped after batch {self.last}"

    def _refuse(self, why: str) -> None:
        """Follow this engine no more (routed by load), and say why, once, as an error."""
        with self.lock:
            self.index.drop(self.engine)
        self.refused = True
        self.mode, self.reason = Mode.DOWN, why
        logger.error("kvtier proxy: %s: %s", self.engine, why)

    def _rebuild(self, context: zmq.Context[zmq.Socket[bytes]]) -> bool:
        """Replay what this stream lacks (all, at first); True once exact again."""
        if self.source.replay is None:
            self.reason = "the engine has no replay socket: its index starts empty"
            self.mode = Mode.EXACT
            return True
        while not self._stop.is_set():
            replayed = self._replay(context, self.last + 1)
            if replayed is None:
                return False
            batches = replayed.batches
            if batches and batches[0][0] > self.last + 1 and self.last >= 0:
                # the buffer lost some: forget what the engine told, take it from its start
                with self.lock:
                    self.index.drop(self.engine)
                self.last = -1
                continue
            for seq, payload in batches:  # each after the last placed (asked from there)
                self._place(seq, payload)
                if self.refused:
                    return False
            if replayed.whole:
                self.mode, self.reason = Mode.EXACT, ""
                return True
            # placed as far as it went (one batch at least): the rest is asked for again
            self.reason = f"a replay stopped after batch {self.last}; asking for the rest"
        return False

    def _replay(self, context: zmq.Context[zmq.Socket[bytes]], start: int) -> Replayed | None:
        """The buffered batches from ``start`` on, as far as they follow one another; None: no
        answer within ``timeout_s``."""
        assert self.source.replay is not None
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.RCVHWM, 0)  # the engine's socket drops what this one cannot take
        dealer.connect(self.source.replay)
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            out: list[tuple[int, bytes]] = []
            wait_ms, quiet_ms = int(self.timeout_s * 1000), int(min(QUIET_S, self.timeout_s) * 1000)
            while dealer.poll(wait_ms):
                frames = dealer.recv_multipart()
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == END:
                    return Replayed(out, whole=True)
                if out and seq != out[-1][0] + 1:
                    return Replayed(out, whole=False)  # some were dropped on the way
                out.append((seq, frames[-1]))
                wait_ms = quiet_ms
            if out:
                return Replayed(out, whole=False)  # the rest, or the end marker, was dropped
            self.mode = Mode.DOWN
            self.reason = f"no answer from {self.source.replay} in {self.timeout_s:g} s"
            return None
        finally:
            dealer.close()

"""One engine's KV events, followed on a thread of its own and placed in the proxy's index.

    sources(url, timeout_s)    -> [Source]  where an engine publishes (vLLM's /kv_event_sources)
    unreachable(url, sources)  -> str       why they cannot be followed from here ("": they can)
    EventStream(engine, source, index, lock).start() / .stop()
    EventStream.mode, .reason               exact, degraded (rebuilding), or down (no events)

vLLM publishes each step's events on a ZMQ PUB socket, each batch numbered, and keeps the last
batches for a ROUTER *replay* socket that answers "from number N" with them, then an end marker
(-1). The stream subscribes first, then asks the replay from 0 (nothing published meanwhile is
lost: it waits in the subscription, and batches already seen are skipped by number), so a proxy
started (or restarted) after the engine rebuilds its index from the engine's buffer. A batch
number that skips one is a gap: the engine is *degraded* (routed by load) until the missing
batches are replayed; if the buffer no longer has them, what the engine told is forgotten and
the buffer replayed from its start, so the index never keeps a block the engine removed in a
batch it lost. No answer from the replay socket within ``timeout_s``: the stream says why, is
down, and tries again. A stream quiet for ``check_s`` asks the replay socket what followed its
last batch, so events that stopped (a publisher gone while the engine still answers /health)
show as down, and batches the subscription missed are placed. An engine whose blocks hold
another number of tokens than the fleet's index (the first engine told) is refused: an error
names both sizes, and the engine is routed by load, never matched with silent misses. Hash seeds
and functions need not agree: the index is keyed by tokens (``prefix_index.py``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable
from enum import Enum
from typing import NamedTuple
from urllib.parse import urlsplit

import zmq

from kvtier.apps.proxy.kv_events import Kind, decode_batch
from kvtier.apps.proxy.prefix_index import PrefixIndex

logger = logging.getLogger(__name__)

END = -1  # the replay's end marker
POLL_MS = 200  # how long the thread waits for a batch before it looks at ``stop`` again
RETRY_S = 1.0  # before asking a replay socket that did not answer again
CHECK_S = 10.0  # a stream quiet this long asks the replay socket what it missed (are they alive?)


class Mode(Enum):
    EXACT = "exact"  # every batch since the replay placed
    DEGRADED = "degraded"  # a gap: rebuilding from the replay; routed by load meanwhile
    DOWN = "down"  # no events (not started, replay unanswered): routed by load


class Source(NamedTuple):
    """Where one data-parallel rank of an engine publishes its events."""

    endpoint: str
    replay: str | None
    topic: str


def sources(url: str, timeout_s: float) -> list[Source]:
    """The event sources ``url``'s engine publishes on (empty: it publishes none). A wildcard
    host (``tcp://*:5557``, ``0.0.0.0``) is the engine's own, as reached at ``url``.

    Raises ``OSError`` when the engine cannot be asked."""
    with urllib.request.urlopen(url + "/kv_event_sources", timeout=timeout_s) as answer:
        found = json.loads(answer.read())
    host = urlsplit(url).hostname or "127.0.0.1"
    out = []
    for rank in sorted(found, key=int):
        config = found[rank] or {}
        if not config.get("enable_kv_cache_events") or config.get("publisher") != "zmq":
            continue
        replay = config.get("replay_endpoint")
        out.append(Source(_reachable(config["endpoint"], host),
                          _reachable(replay, host) if replay else None,
                          config.get("topic") or ""))  # fmt: skip
    return out


def unreachable(url: str, found: list[Source]) -> str:
    """Why the proxy cannot follow these sources of the engine at ``url`` ("" when it can): none,
    or a Unix socket (``kvtier serve``'s default) of an engine on another machine."""
    if not found:
        return "the engine publishes no KV events (--kv-events-config)"
    local = urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")
    if not local and any(source.endpoint.startswith("ipc://") for source in found):
        return (
            "it publishes its KV events on a Unix socket, which only its own machine reaches "
            "(kvtier serve --host 0.0.0.0, or a --kv-events-config on tcp://*)"
        )
    return ""


def _reachable(endpoint: str, host: str) -> str:
    for wildcard in ("://*:", "://0.0.0.0:", "://[::]:"):
        endpoint = endpoint.replace(wildcard, f"://{host}:")
    return endpoint


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
        for seq, payload in replayed:
            self._receive(seq, payload)

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
        replayed = self._replay(context, self.last + 1)
        if replayed is None:
            return False
        if replayed and replayed[0][0] > self.last + 1 and self.last >= 0:
            # the buffer lost some: forget what the engine told, take the buffer from its start
            with self.lock:
                self.index.drop(self.engine)
            self.last = -1
            replayed = self._replay(context, 0)
            if replayed is None:
                return False
        for seq, payload in replayed:
            if seq > self.last:
                self._place(seq, payload)
            if self.refused:
                return False
        self.mode, self.reason = Mode.EXACT, ""
        return True

    def _replay(
        self, context: zmq.Context[zmq.Socket[bytes]], start: int
    ) -> list[tuple[int, bytes]] | None:
        """The buffered batches from ``start`` on; None: no answer within ``timeout_s``."""
        assert self.source.replay is not None
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.source.replay)
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            out: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + self.timeout_s
            while True:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0 or not dealer.poll(left_ms):
                    self.mode = Mode.DOWN
                    self.reason = f"no answer from {self.source.replay} in {self.timeout_s:g} s"
                    return None
                frames = dealer.recv_multipart()
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == END:
                    return out
                out.append((seq, frames[-1]))
        finally:
            dealer.close()

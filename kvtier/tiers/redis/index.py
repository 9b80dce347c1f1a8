"""RedisIndex: the scheduler half's view of the Redis/Valkey tier, an entry of the tier chain.

The scheduler cannot list a store that a fleet of engines shares, so it asks: a lookup of a run
of chunks sends one batched ``EXISTS`` (every rank's key of every chunk, one pipelined round trip
per node) to a lookup thread and answers "pending" (None) until the answer is back; the engine
asks again on a later step. The first ask waits at most ``lookup_wait_s`` (``redis.lookup_wait_s``:
a couple of milliseconds by default, a loopback or LAN round trip) so a new request usually gets
its answer without a step's delay; no step ever waits longer. Answers are remembered: chunks
found (or written by this engine) as *present* (a bounded LRU), the first chunk found missing as
*absent* for ``ABSENT_S``. A chunk evicted from Redis since is found out by its load (a miss:
the engine recomputes and the chunk is forgotten here), never trusted.

A Redis that is down or slow makes a lookup a miss within ``timeout_s`` (the store's circuit
breaker then answers at once, for a while, without touching the network), and forgets every
chunk known present (``forgotten`` counts it): a restarted Redis may have come back empty.
Nothing is pinned: Redis evicts by its own ``maxmemory-policy``; chunks are written as soon as
the host tier stored them (write-through), at most ``max_in_flight`` at a time.

Redis may also lose chunks unseen (restarted empty between two lookups, ``FLUSHALL``, evictions):
``verify`` sends an ``EXISTS`` of chunks written earlier on the lookup thread, behind at most
``MAX_VERIFYING`` such queries, and a chunk found missing is forgotten and handed to
``take_gone``, so that ``tier_writes.py`` writes it again while the host tier holds it. A
verify that fails (Redis down) changes nothing; it counts no failed lookup.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

from kvtier.keys import ChunkKey
from kvtier.tiers.base.index import Found, Traits, Usage
from kvtier.tiers.redis.config import LOOKUP_WAIT_S

logger = logging.getLogger(__name__)

ABSENT_S = 1.0  # how long a chunk found missing is not asked for again
MAX_KNOWN = 1 << 20  # chunks remembered present (least recently used forgotten first)
MAX_QUERY = 512  # chunks per lookup query
MAX_QUEUED = 256  # lookup queries waiting; more are misses
MAX_VERIFYING = 4  # verify queries queued or running at once (lookups queue behind them)

Exists = Callable[[Sequence[ChunkKey]], list[bool]]  # chunk keys -> held by every rank; OSError


class RedisIndex:
    """An entry of the tier chain (``tiers/base/index.py``'s contract): a network store, never
    read before the forward; written through, so the fleet finds a chunk as soon as one engine
    computed it."""

    name = "redis"

    def __init__(
        self,
        exists: Exists,
        timeout_s: float,
        max_in_flight: int,
        available: Callable[[], bool] = lambda: True,
        lookup_wait_s: float = LOOKUP_WAIT_S,  # the longest a first lookup waits for its answer
    ) -> None:
        self.traits = Traits(False, True, max_in_flight)
        self._exists = exists
        self._available = available
        self._timeout_s = timeout_s
        self._lookup_wait_s = lookup_wait_s
        self.failed_lookups = 0  # queries that timed out or found Redis down (misses)
        self.forgotten = 0  # times every chunk known present was forgotten (Redis failed)
        self._lock = threading.Condition()
        # guarded by _lock
        self._present: OrderedDict[ChunkKey, None] = OrderedDict()  # least recently used first
        self._absent: dict[ChunkKey, float] = {}  # key -> when it was found missing
        self._asked: dict[ChunkKey, float] = {}  # a query's first key -> when it was sent
        self._writing: set[ChunkKey] = set()
        self._gone: list[ChunkKey] = []  # verified missing, not taken yet
        self._removed: list[ChunkKey] = []  # no longer known present, for ``take_removed``
        self._verifying = 0  # verify queries queued or running
        # (verify?, keys): a lookup's query, or a verify's
        self._queries: queue.Queue[tuple[bool, list[ChunkKey]]] = queue.Queue(MAX_QUEUED)
        self._thread = threading.Thread(target=self._run, name="kvtier-redis-lookup", daemon=True)
        self._thread.start()

    def usage(self) -> Usage:
        """Redis holds the bytes, under its own maxmemory (no room of ours)."""
        return Usage(0, None, 0, self.failed_lookups, self.forgotten, self._available())

    # ---- lookup and load -------------------------------------------------------------------

    def lookup(self, keys: Sequence[ChunkKey]) -> Found:
        """Leading ``keys`` known to be in Redis; none and ``pending`` while a query about the
        next is in flight."""
        count, waiting = self._answer(keys, ask=True)
        if waiting is not None and self._lookup_wait_s > 0:
            deadline = time.monotonic() + self._lookup_wait_s
            with self._lock:
                while waiting in self._asked and (left := deadline - time.monotonic()) > 0:
                    self._lock.wait(left)
            count = self._answer(keys, ask=False)[0]
        return Found(0, pending=True) if count is None else Found(count)

    def _answer(self, keys: Sequence[ChunkKey], ask: bool) -> tuple[int | None, ChunkKey | None]:
        """The leading keys known present, or (None, the key whose query is in flight); ``ask``:
        send a query about the first key not known."""
        now = time.monotonic()
        with self._lock:
            count = self._count(keys)
            if count == len(keys):
                return count, None
            key = keys[count]
            if key in self._writing or now - self._absent.get(key, -ABSENT_S) < ABSENT_S:
                return count, None
            asked = self._asked.get(key)
            if asked is not None:
                if now - asked < self._timeout_s + self._lookup_wait_s:
                    return None, key
                del self._asked[key]  # lost or very slow: a miss
                return count, None
            if not ask or not self._available():
                return count, None
            try:
                self._queries.put_nowait((False, list(keys[count : count + MAX_QUERY])))
            except queue.Full:
                return count, None
            self._asked[key] = now
            return None, key

    def _count(self, keys: Sequence[ChunkKey]) -> int:
        """Leading ``keys`` known present (guarded by ``_lock``)."""
        for count, key in enumerate(keys):
            if key not in self._present:
                return count
        return len(keys)

    def _run(self) -> None:
        while True:
            verify, keys = self._queries.get()
            if verify:
                self._verify_now(keys)
                continue
            try:
                found = self._exists(keys)
            except OSError as error:
                self._failed(keys[0], error)
                continue
            except Exception:  # never let the lookup thread die: a miss, logged
                logger.exception("kvtier: Redis lookup failed")
                self._failed(keys[0], None)
                continue
            self._answered(keys, found)

    def _answered(self, keys: list[ChunkKey], found: list[bool]) -> None:
        now = time.monotonic()
        with self._lock:
            self._asked.pop(keys[0], None)
            for key, there in zip(keys, found):
                if not there:
                    self._absent[key] = now
                    break
                self._remember(key)
            if len(self._absent) > MAX_QUERY * MAX_QUEUED:
                self._absent = {k: t for k, t in self._absent.items() if now - t < ABSENT_S}
            self._lock.notify_all()

    def _failed(self, first: ChunkKey, error: OSError | None) -> None:
        self.failed_lookups += 1
        if error is not None and self.failed_lookups % 100 == 1:
            logger.warning("kvtier: Redis lookup failed (%d so far; lookups are misses): %s",
                           self.failed_lookups, error)  # fmt: skip
        with self._lock:
            self._asked.pop(first, None)
            self._absent[first] = time.monotonic()
            self._removed += self._present  # Redis may come back empty
            self._present.clear()
            self.forgotten += 1
            self._lock.notify_all()

    def _remember(self, key: ChunkKey) -> None:
        self._present[key] = None
        self._present.move_to_end(key)
        if len(self._present) > MAX_KNOWN:
            self._removed.append(self._present.popitem(last=False)[0])

    def prepare_load(self, keys: Sequence[ChunkKey]) -> None:
        """Nothing to pin: a chunk Redis evicts before it is read is a miss of that load."""

    def complete_load(self, keys: Sequence[ChunkKey], bad: Sequence[ChunkKey] = ()) -> None:
        """Forget the ``bad`` chunks (gone, found bad and deleted, or unreadable: a worker's
        Redis down): absent for ``ABSENT_S``, so the engine's retry computes them instead of
        loading them again; the others were used."""
        now = time.monotonic()
        with self._lock:
            for key in bad:
                if key in self._present:
                    del self._present[key]
                    self._removed.append(key)
                self._absent[key] = now
            bad_keys = set(bad)
            for key in reversed(keys):
                if key in self._present and key not in bad_keys:
                    self._present.move_to_end(key)

    # ---- chunks Redis lost unseen ----------------------------------------------------------

    def verify(self, keys: Sequence[ChunkKey]) -> int:
        """Queue an ``EXISTS`` of ``keys`` (chunks written earlier) on the lookup thread, in
        queries of at most ``MAX_QUERY``; returns how many were queued: none while Redis is down
        or ``MAX_VERIFYING`` queries wait, so that lookups never queue behind many. Never
        blocks."""
        if not keys or not self._available():
            return 0
        queued = 0
        for first in range(0, len(keys), MAX_QUERY):
            with self._lock:
                if self._verifying >= MAX_VERIFYING:
                    break
                self._verifying += 1
            batch = list(keys[first : first + MAX_QUERY])
            try:
                self._queries.put_nowait((True, batch))
            except queue.Full:
                with self._lock:
                    self._verifying -= 1
                break
            queued += len(batch)
        return queued

    def _verify_now(self, keys: list[ChunkKey]) -> None:
        """On the lookup thread: forget the ``keys`` Redis no longer holds, for ``take_gone``."""
        try:
            found: list[bool] | None = self._exists(keys)
        except OSError:
            found = None  # Redis down: nothing learnt (lookups count the failures)
        except Exception:  # never let the lookup thread die
            logger.exception("kvtier: Redis verify failed")
            found = None
        with self._lock:
            self._verifying -= 1
            for key, there in zip(keys, found or ()):
                if key in self._writing:
                    continue  # being written again: its write says what Redis holds
                if there:
                    self._remember(key)
                else:
                    if key in self._present:
                        del self._present[key]
                        self._removed.append(key)
                    self._gone.append(key)

    def take_gone(self) -> list[ChunkKey]:
        """Chunks ``verify`` found missing from Redis since the last call."""
        with self._lock:
            gone, self._gone = self._gone, []
        return gone

    def take_removed(self) -> list[ChunkKey]:
        """Chunks no longer known present since the last call (gone, bad, forgotten)."""
        with self._lock:
            removed, self._removed = self._removed, []
        return removed

    # ---- store -----------------------------------------------------------------------------

    def holds(self, key: ChunkKey) -> bool:
        with self._lock:
            return key in self._present or key in self._writing

    def prepare_store(self, keys: Sequence[ChunkKey]) -> list[ChunkKey]:
        """The ``keys`` not known in Redis nor being written (none while Redis is down)."""
        if not self._available():
            return []
        with self._lock:
            admitted = [
                k for k in dict.fromkeys(keys) if k not in self._present and k not in self._writing
            ]
            self._writing.update(admitted)
            for key in admitted:
                self._absent.pop(key, None)
            return admitted

    def complete_store(self, ok: Mapping[ChunkKey, int], failed: Sequence[ChunkKey]) -> None:
        with self._lock:
            for key in ok:
                if key in self._writing:
                    self._writing.discard(key)
                    self._remember(key)
            self._writing.difference_update(failed)

    def known(self) -> list[ChunkKey]:
        """Chunks known present, least recently used first (for tests and inspection)."""
        with self._lock:
            return list(self._present)

    def check_integrity(self) -> None:
        with self._lock:
            assert len(self._present) <= MAX_KNOWN, "the known chunks grew without bound"
            assert not set(self._present) & self._writing, "a chunk both present and writing"
            assert 0 <= self._verifying <= MAX_VERIFYING, f"{self._verifying} verify queries"

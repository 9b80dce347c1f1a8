r"""ChunkManager: the slots of one in-memory tier, which chunk holds which, and what may be evicted.

A chunk moves through three states:

    (absent) --prepare_store--> in flight --complete_store(ok)--> ready --evicted--> (absent)
                                    \--complete_store(failed)--> (absent, slot freed)

Only ready chunks can be loaded; only ready chunks with no pins (no load in flight) can be evicted.

The host tier's index speaks the contract of every tier (``tiers/base/index.py``), and adds what
only host memory has: slots (``place`` reserves them, ``slots`` reads them), an eviction policy
(``touch``), ``remove``, and what it stored and removed, in order (``take_events``: a chunk
evicted and stored again between two calls is told in that order).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.tiers.base.index import Found, Traits, Usage
from kvtier.tiers.base.results import EventKind, Key, StorePlan, TierEvent
from kvtier.tiers.host.admission import AdmissionCounter
from kvtier.tiers.host.policies import EvictionPolicy, make_policy
from kvtier.tiers.host.slots import FreeSlots

TRACKED_KEYS_PER_SLOT = 4  # keys the admission counter remembers per slot of capacity


@dataclass(slots=True)
class _Chunk:
    slot: int
    ready: bool = False  # False while its store is in flight
    pins: int = 0  # loads in flight reading it; > 0 only when ready

    @property
    def evictable(self) -> bool:
        return self.ready and self.pins == 0


class ChunkManager:
    """Slot manager of one in-memory tier of ``capacity`` chunks (slots ``0 .. capacity-1``).

    ``policy`` names the eviction policy (``"lru"`` or ``"arc"``). With ``store_threshold`` N >= 2,
    a key is stored only once it was passed to ``lookup`` at least N times (filters one-off
    prefixes); N <= 1 admits everything. ``tier`` names the tier; ``chunk_bytes`` is what a slot
    holds (for ``usage``). Holds no tensors: a slot is a row index into memory owned by the
    worker half. Not thread-safe: the scheduler calls it from one thread.
    """

    traits = Traits(reads_before_forward=True, write_through=False, max_in_flight=0)

    def __init__(
        self,
        capacity: int,
        policy: str = "lru",
        store_threshold: int = 1,
        tier: str = "cpu",
        chunk_bytes: int = 0,
    ) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.name = tier
        self.chunk_bytes = chunk_bytes
        self._capacity = capacity
        self._policy = make_policy(policy, capacity)
        self._store_threshold = store_threshold
        # Invariants: free slots and the slots of self._chunks partition range(capacity);
        # self._chunks and the policy hold the same keys.
        self._free = FreeSlots(capacity)
        self._chunks: dict[Key, _Chunk] = {}
        self._num_pins = 0  # == sum of pins
        self._num_evictable = 0  # == number of ready, unpinned chunks
        self._admission: AdmissionCounter | None = (
            AdmissionCounter(TRACKED_KEYS_PER_SLOT * capacity) if store_threshold >= 2 else None
        )
        self._evicted = 0  # chunks evicted to make room, since start
        self._events: list[TierEvent] = []

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_pinned(self) -> int:
        """Total pin count over all chunks (loads prepared and not yet completed)."""
        return self._num_pins

    @property
    def room(self) -> int:
        """Slots a store could take now: free ones plus ready, unpinned chunks it could evict."""
        return len(self._free) + self._num_evictable

    def stored(self) -> dict[Key, int]:
        """The loadable chunks and their slots (a snapshot; for inspection and tests)."""
        return {key: chunk.slot for key, chunk in self._chunks.items() if chunk.ready}

    def usage(self) -> Usage:
        used, room = self._capacity - len(self._free), self.room
        return Usage(used * self.chunk_bytes, room * self.chunk_bytes, self._evicted)

    @property
    def policy(self) -> EvictionPolicy:
        """The eviction policy, for inspection; callers must not mutate it."""
        return self._policy

    def lookup(self, keys: Sequence[Any]) -> Found:
        """Count the leading ``keys`` that are ready; stops at the first absent or in-flight key.

        Also counts one lookup of every key in ``keys``, for the store threshold. ``pending`` is
        True when the run stops at a key whose store is in flight: it is about to be loadable.
        """
        if self._admission is not None:
            self._admission.record(keys)
        ready = 0
        for key in keys:
            chunk = self._chunks.get(key)
            if chunk is None or not chunk.ready:
                return Found(ready, pending=chunk is not None)
            ready += 1
        return Found(ready)

    def prepare_load(self, keys: Sequence[Any]) -> None:
        """Pin ``keys`` (no eviction until ``complete_load``; ``slots`` says where they are).
        ValueError, changing nothing, if a key is absent or not ready."""
        chunks = [self._ready_chunk(key) for key in keys]
        for chunk in chunks:
            if chunk.pins == 0:
                self._num_evictable -= 1
            chunk.pins += 1
        self._num_pins += len(chunks)

    def complete_load(self, keys: Sequence[Any], bad: Sequence[Any] = ()) -> None:
        """Unpin ``keys`` once each, as many times as a key is listed; then remove the ``bad``
        ones (a load found them bad) that no other load pins. ValueError, changing nothing, if
        a key is absent, not ready, or would drop below zero pins."""
        for key, times in Counter(keys).items():
            chunk = self._ready_chunk(key)
            if chunk.pins < times:
                raise ValueError(f"complete_load of {key!r}: {times} unpins, {chunk.pins} pins")
        for key in keys:
            chunk = self._chunks[key]
            chunk.pins -= 1
            if chunk.pins == 0:
                self._num_evictable += 1
        self._num_pins -= len(keys)
        if bad:
            self.remove(bad)

    def holds(self, key: Any) -> bool:
        """Ready or being stored: no need to store it again."""
        return key in self._chunks

    def remove(self, keys: Sequence[Key]) -> list[Key]:
        """Drop ready, unpinned ``keys`` (a copy found bad); returns those removed.

        Absent, in-flight or pinned keys stay. Removed keys are listed in a REMOVED event.
        """
        removed = [key for key in dict.fromkeys(keys) if self._is_evictable(key)]
        for key in removed:
            self._free.release([self._chunks.pop(key).slot])
            self._policy.remove(key)
        self._num_evictable -= len(removed)
        if removed:
            self._events.append(TierEvent(EventKind.REMOVED, removed, self.name))
        return removed

    def touch(self, keys: Sequence[Key]) -> None:
        """Mark ``keys`` (a prefix, head first) recently used by the policy.

        Unknown keys are ignored. ``keys[0]`` ends up the most recently used.
        """
        self._policy.touch(keys, self.is_ready)

    def prepare_store(self, keys: Sequence[Any]) -> list[Any]:
        """The contract's form of ``place``: the keys taken (none when there is no room)."""
        plan = self.place(keys)
        return [] if plan is None else plan.keys

    def place(self, keys: Sequence[Key]) -> StorePlan | None:
        """Reserve slots for the keys not yet stored or in flight that pass the store threshold.

        Evicts, by policy, ready unpinned chunks not among ``keys`` when free slots run short
        (a REMOVED event). The reserved chunks are in flight until ``complete_store``.
        Returns None, changing nothing, when room cannot be made for all of them; an empty plan
        when there is nothing to store.
        """
        incoming = [key for key in dict.fromkeys(keys) if self._admits(key)]
        if not incoming:
            return StorePlan([], [], [], [])
        num_evict = max(0, len(incoming) - len(self._free))
        protected = set(keys)
        if num_evict > self._num_evictable - sum(map(self._is_evictable, protected)):
            return None

        def can_evict(key: Key) -> bool:
            return key not in protected and self._chunks[key].evictable

        evicted = self._policy.admit(incoming, num_evict, can_evict)
        if evicted is None:  # the count above says enough chunks are evictable
            raise AssertionError(f"policy found fewer than {num_evict} victims")
        evicted_slots = [self._chunks.pop(key).slot for key in evicted]
        self._free.release(evicted_slots)
        self._num_evictable -= len(evicted)
        self._evicted += len(evicted)
        if evicted:
            self._events.append(TierEvent(EventKind.REMOVED, evicted, self.name))
        slots = self._free.take(len(incoming))
        for key, slot in zip(incoming, slots, strict=True):
            self._chunks[key] = _Chunk(slot)
        return StorePlan(incoming, slots, evicted, evicted_slots)

    def complete_store(self, ok: Mapping[Any, int], failed: Sequence[Any] = ()) -> None:
        """Finish the stores of ``ok`` (they become ready: loadable, evictable, listed in one
        STORED event) and of ``failed`` (removed, their slots freed, no event).

        Keys not in flight (never prepared, already completed, evicted) are ignored, so a repeated
        call is harmless.
        """
        stored = []
        for key in ok:
            chunk = self._chunks.get(key)
            if chunk is not None and not chunk.ready:
                chunk.ready = True
                self._num_evictable += 1
                stored.append(key)
        if stored:
            self._events.append(TierEvent(EventKind.STORED, stored, self.name))
        for key in failed:
            chunk = self._chunks.get(key)
            if chunk is not None and not chunk.ready:
                del self._chunks[key]
                self._policy.remove(key)
                self._free.release([chunk.slot])

    def verify(self, keys: Sequence[Any]) -> int:
        """Nothing to check: host memory loses nothing unseen."""
        return len(keys)

    def take_gone(self) -> list[Any]:
        return []

    def take_removed(self) -> list[Any]:
        """None here: the host tier tells what it removed in order with what it stored
        (``take_events``)."""
        return []

    def take_events(self) -> list[TierEvent]:
        """The events since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    def check_integrity(self) -> None:
        """Raise AssertionError if any invariant of the manager or its policy is broken."""
        self._free.check([chunk.slot for chunk in self._chunks.values()])
        for key, chunk in self._chunks.items():
            assert chunk.pins >= 0, f"{key!r} has {chunk.pins} pins"
            assert chunk.ready or chunk.pins == 0, f"{key!r} is pinned while its store is in flight"
        pins = sum(chunk.pins for chunk in self._chunks.values())
        assert self._num_pins == pins, f"pin count {self._num_pins} != sum of pins {pins}"
        evictable = sum(chunk.evictable for chunk in self._chunks.values())
        assert self._num_evictable == evictable, (
            f"evictable count {self._num_evictable} != {evictable} ready unpinned chunks"
        )
        if self._admission is not None:
            assert len(self._admission) <= self._admission.max_keys, "admission counter unbounded"
        self._policy.check_integrity(self._chunks.keys())

    def _admits(self, key: Key) -> bool:
        if key in self._chunks:
            return False
        return self._admission is None or self._admission.count(key) >= self._store_threshold

    def _ready_chunk(self, key: Key) -> _Chunk:
        chunk = self._chunks.get(key)
        if chunk is None:
            raise ValueError(f"chunk {key!r} is not in tier {self.name!r}")
        if not chunk.ready:
            raise ValueError(f"chunk {key!r} in tier {self.name!r} is still being stored")
        return chunk

    def slots(self, keys: Sequence[Key]) -> list[int]:
        """The slots of ready ``keys``, in key order (ValueError: a key absent or not ready)."""
        return [self._ready_chunk(key).slot for key in keys]

    def is_ready(self, key: Key) -> bool:
        """Whether ``key`` can be loaded now (unlike ``lookup``, not counted for admission)."""
        chunk = self._chunks.get(key)
        return chunk is not None and chunk.ready

    def _is_evictable(self, key: Key) -> bool:
        chunk = self._chunks.get(key)
        return chunk is not None and chunk.evictable

r"""ChunkManager: the slots of one in-memory tier, which chunk holds which, and what may be evicted.

A chunk moves through three states:

    (absent) --prepare_store--> in flight --complete_store(ok)--> ready --evicted--> (absent)
                                    \--complete_store(failed)--> (absent, slot freed)

Only ready chunks can be loaded; only ready chunks with no pins (no load in flight) can be evicted.

Over 300 lines because the states above and their invariants (``check_integrity``) are one
concept: every method moves a chunk between them.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.tiers.base.results import (
    EventKind,
    Key,
    LoadPlan,
    LookupResult,
    StorePlan,
    TierEvent,
)
from kvtier.tiers.host.policies import EvictionPolicy, make_policy

# The admission counter remembers at most this many keys per slot of capacity.
TRACKED_KEYS_PER_SLOT = 4


@dataclass(slots=True)
class _Chunk:
    slot: int
    ready: bool = False  # False while its store is in flight
    pins: int = 0  # loads in flight reading it; > 0 only when ready

    @property
    def evictable(self) -> bool:
        return self.ready and self.pins == 0


class AdmissionCounter:
    """Counts how often each key was looked up, remembering at most ``max_keys`` keys.

    When full, the key looked up least recently is forgotten (its count restarts from zero).
    """

    def __init__(self, max_keys: int) -> None:
        self._max_keys = max_keys
        # Invariant: len(self._counts) <= max_keys; least recently looked-up key first.
        self._counts: OrderedDict[Key, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._counts)

    @property
    def max_keys(self) -> int:
        return self._max_keys

    def record(self, keys: Sequence[Key]) -> None:
        """Count one lookup of each distinct key in ``keys``."""
        for key in dict.fromkeys(keys):
            self._counts[key] = self._counts.get(key, 0) + 1
            self._counts.move_to_end(key)
        while len(self._counts) > self._max_keys:
            self._counts.popitem(last=False)

    def count(self, key: Key) -> int:
        return self._counts.get(key, 0)


class ChunkManager:
    """Slot manager of one in-memory tier of ``capacity`` chunks (slots ``0 .. capacity-1``).

    ``policy`` names the eviction policy (``"lru"`` or ``"arc"``). With ``store_threshold`` N >= 2,
    a key is stored only once it was passed to ``lookup`` at least N times (filters one-off
    prefixes); N <= 1 admits everything. ``tier`` names the tier in events. Holds no tensors: a
    slot is a row index into buffers owned by the worker half. Not thread-safe: the scheduler calls
    it from one thread.
    """

    def __init__(
        self, capacity: int, policy: str = "lru", store_threshold: int = 1, tier: str = "cpu"
    ) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        self._policy = make_policy(policy, capacity)
        self._store_threshold = store_threshold
        self._tier = tier
        # Invariants: free slots and the slots of self._chunks partition range(capacity);
        # self._chunks and the policy hold the same keys.
        self._free: list[int] = list(range(capacity - 1, -1, -1))  # pop() hands out 0, 1, ...
        self._chunks: dict[Key, _Chunk] = {}
        self._num_pins = 0  # == sum of pins
        self._num_evictable = 0  # == number of ready, unpinned chunks
        self._admission: AdmissionCounter | None = (
            AdmissionCounter(TRACKED_KEYS_PER_SLOT * capacity) if store_threshold >= 2 else None
        )
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

    @property
    def policy(self) -> EvictionPolicy:
        """The eviction policy, for inspection; callers must not mutate it."""
        return self._policy

    def lookup(self, keys: Sequence[Key]) -> LookupResult:
        """Count the leading ``keys`` that are ready; stops at the first absent or in-flight key.

        Also counts one lookup of every key in ``keys``, for the store threshold. ``retry_later``
        is True when the run stops at a key whose store is in flight: it is about to be loadable.
        """
        if self._admission is not None:
            self._admission.record(keys)
        ready = 0
        for key in keys:
            chunk = self._chunks.get(key)
            if chunk is None or not chunk.ready:
                return LookupResult(ready, retry_later=chunk is not None)
            ready += 1
        return LookupResult(ready)

    def prepare_load(self, keys: Sequence[Key]) -> LoadPlan:
        """Pin ``keys`` (no eviction until ``complete_load``) and return their slots, in key order.

        Raises ValueError, changing nothing, if a key is absent or not ready.
        """
        chunks = [self._ready_chunk(key) for key in keys]
        for chunk in chunks:
            if chunk.pins == 0:
                self._num_evictable -= 1
            chunk.pins += 1
        self._num_pins += len(chunks)
        return LoadPlan([chunk.slot for chunk in chunks])

    def complete_load(self, keys: Sequence[Key]) -> None:
        """Unpin ``keys`` once each, as many times as a key is listed.

        Raises ValueError, changing nothing, if a key is absent, not ready, or would drop below
        zero pins.
        """
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

    def remove(self, keys: Sequence[Key]) -> list[Key]:
        """Drop ready, unpinned ``keys`` (a copy found bad); returns those removed.

        Absent, in-flight or pinned keys stay. Removed keys are listed in a REMOVED event.
        """
        removed = [key for key in dict.fromkeys(keys) if self._is_evictable(key)]
        for key in removed:
            self._free.append(self._chunks.pop(key).slot)
            self._policy.remove(key)
        self._num_evictable -= len(removed)
        if removed:
            self._events.append(TierEvent(EventKind.REMOVED, removed, self._tier))
        return removed

    def touch(self, keys: Sequence[Key]) -> None:
        """Mark ``keys`` (a prefix, head first) recently used by the policy.

        Unknown keys are ignored. ``keys[0]`` ends up the most recently used.
        """
        self._policy.touch(keys, self._is_ready)

    def prepare_store(self, keys: Sequence[Key]) -> StorePlan | None:
        """Reserve slots for the keys not yet stored or in flight that pass the store threshold.

        Evicts, by policy, ready unpinned chunks not among ``keys`` when free slots run short, and
        records a REMOVED event for them. The reserved chunks are in flight until
        ``complete_store``. Returns None, changing nothing, when room cannot be made for all of
        them; an empty plan when there is nothing to store.
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
        self._free += evicted_slots
        self._num_evictable -= len(evicted)
        if evicted:
            self._events.append(TierEvent(EventKind.REMOVED, evicted, self._tier))
        # ascending slots, so a request's chunks tend to be adjacent rows (longer copy runs)
        slots = sorted(self._free.pop() for _ in incoming)
        for key, slot in zip(incoming, slots, strict=True):
            self._chunks[key] = _Chunk(slot)
        return StorePlan(incoming, slots, evicted, evicted_slots)

    def complete_store(self, keys: Sequence[Key], success: bool = True) -> None:
        """Finish the stores of ``keys``.

        On success they become ready (loadable, evictable) and one STORED event lists them; on
        failure they are removed and their slots freed, with no event.

        Keys not in flight (never prepared, already completed, evicted) are ignored, so a repeated
        call is harmless.
        """
        stored: list[Key] = []
        for key in keys:
            chunk = self._chunks.get(key)
            if chunk is None or chunk.ready:
                continue
            if success:
                chunk.ready = True
                self._num_evictable += 1
                stored.append(key)
            else:
                del self._chunks[key]
                self._policy.remove(key)
                self._free.append(chunk.slot)
        if stored:
            self._events.append(TierEvent(EventKind.STORED, stored, self._tier))

    def take_events(self) -> list[TierEvent]:
        """Return the events since the last call, oldest first, and forget them."""
        events, self._events = self._events, []
        return events

    def check_integrity(self) -> None:
        """Raise AssertionError if any invariant of the manager or its policy is broken."""
        used = [chunk.slot for chunk in self._chunks.values()]
        assert len(self._free) + len(used) == self._capacity, (
            f"{len(self._free)} free + {len(used)} used != capacity {self._capacity}"
        )
        assert len(set(used)) == len(used), f"a slot is used twice: {sorted(used)}"
        assert len(set(self._free)) == len(self._free), f"a slot is free twice: {self._free}"
        assert not set(used) & set(self._free), (
            f"slots both free and used: {set(used) & set(self._free)}"
        )
        out_of_range = [s for s in used + self._free if not 0 <= s < self._capacity]
        assert not out_of_range, f"slots outside [0, {self._capacity}): {out_of_range}"
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
            raise ValueError(f"chunk {key!r} is not in tier {self._tier!r}")
        if not chunk.ready:
            raise ValueError(f"chunk {key!r} in tier {self._tier!r} is still being stored")
        return chunk

    def slots(self, keys: Sequence[Key]) -> list[int]:
        """The slots of ready ``keys``, in key order; nothing pinned (a copy taken at once).

        Raises ValueError if a key is absent or not ready.
        """
        return [self._ready_chunk(key).slot for key in keys]

    def is_ready(self, key: Key) -> bool:
        """Whether ``key`` can be loaded now (unlike ``lookup``, not counted for admission)."""
        return self._is_ready(key)

    def _is_ready(self, key: Key) -> bool:
        chunk = self._chunks.get(key)
        return chunk is not None and chunk.ready

    def _is_evictable(self, key: Key) -> bool:
        chunk = self._chunks.get(key)
        return chunk is not None and chunk.evictable

"""The scheduler half's storage contract: where chunks live and which may be evicted.

Primitives (two-phase, as vLLM's ``kv_offload``):
    lookup(keys)                -> LookupResult   how many leading chunks can be loaded now
    prepare_load(keys)          -> LoadPlan       pins the chunks; they cannot be evicted until...
    complete_load(keys)                           ...the load finished (unpins)
    prepare_store(keys)         -> StorePlan|None allocates slots, evicting; None = no room
    complete_store(keys, ok)                      makes stored chunks loadable, or rolls them back
    touch(keys)                                   marks chunks recently used
    take_events()               -> list[TierEvent] what was stored / removed since the last call
    check_integrity()                             raises AssertionError on a broken invariant

The manager holds no tensors: a slot is a row index into the tier's buffers, owned by the
worker half. Keys are any hashable (``ChunkKey`` in production, ints in tests).
"""

from __future__ import annotations

from collections.abc import Hashable
from enum import Enum
from typing import NamedTuple

Key = Hashable


class LookupResult(NamedTuple):
    """Answer of ``lookup``: the first ``ready`` keys can be loaded now.

    ``retry_later`` is True when the key after them is not ready yet but may become so (a lookup or
    fetch still in flight in a slower tier): the caller should ask again on a later step.
    """

    ready: int
    retry_later: bool = False


class LoadPlan(NamedTuple):
    """Where the chunks of a ``prepare_load`` live: one slot per key, in key order."""

    slots: list[int]


class StorePlan(NamedTuple):
    """Result of ``prepare_store``.

    ``keys`` are the keys to store now, in the order given (keys already stored, being stored, or
    not admitted are left out); ``slots[i]`` is the slot reserved for ``keys[i]``; ``evicted``
    lists the keys removed to make room and ``evicted_slots`` the slots they held (whose bytes
    are intact until the new chunks are written there).
    """

    keys: list[Key]
    slots: list[int]
    evicted: list[Key]
    evicted_slots: list[int] = []


class EventKind(Enum):
    STORED = "stored"
    REMOVED = "removed"


class TierEvent(NamedTuple):
    """Chunks that became loadable (STORED) or were dropped (REMOVED) in ``tier``."""

    kind: EventKind
    keys: list[Key]
    tier: str

"""The host tier's own results, beside the contract every tier speaks (``index.py``).

    StorePlan    where ``ChunkManager.place`` put each key, and what it evicted for them
    TierEvent    what the host tier stored and removed, in order (``ChunkManager.take_events``)

Keys are any hashable (``ChunkKey`` in production, ints in tests).
"""

from __future__ import annotations

from collections.abc import Hashable
from enum import Enum
from typing import NamedTuple

Key = Hashable


class StorePlan(NamedTuple):
    """Result of ``place``.

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

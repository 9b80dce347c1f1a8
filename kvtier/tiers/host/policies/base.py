"""Eviction policies: which resident chunk leaves a tier when a new one needs its slot.

A policy orders keys; it knows nothing of slots, pins or stores in flight. The manager owns chunk
state and tells the policy, through predicates, which keys are ready and which may be evicted.

Primitives:
    admit(incoming, num_evict, can_evict) -> list[Key] | None  evict num_evict, then add incoming
    remove(key)                                                 drop a key, leaving no trace
    touch(keys, is_ready)                                       mark keys recently used
    check_integrity(resident)                                   AssertionError on broken invariant
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence

from kvtier.tiers.base.results import Key

KeyPredicate = Callable[[Key], bool]


class EvictionPolicy(ABC):
    """Orders the resident keys of a tier of ``capacity`` chunks and picks eviction victims."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = capacity

    @property
    def capacity(self) -> int:
        return self._capacity

    @abstractmethod
    def admit(
        self, incoming: Sequence[Key], num_evict: int, can_evict: KeyPredicate
    ) -> list[Key] | None:
        """Evict exactly ``num_evict`` resident keys accepted by ``can_evict``; add ``incoming``.

        ``incoming`` are distinct keys that are not resident; they become resident (a store is their
        first use). Returns the evicted keys, in eviction order. Atomic: when fewer than
        ``num_evict`` keys can be evicted it returns None and changes nothing.
        """

    @abstractmethod
    def remove(self, key: Key) -> None:
        """Drop resident ``key`` as if it had never been admitted (a failed store).

        Unlike an eviction it leaves no history (no ARC ghost entry). Raises KeyError if absent.
        """

    @abstractmethod
    def touch(self, keys: Sequence[Key], is_ready: KeyPredicate) -> None:
        """Mark resident ``keys`` recently used; keys that are not resident are ignored.

        ``keys`` is a prefix, head first: ``keys[0]`` ends up the most recently used, since a
        prefix's head is needed by every hit on its tail. ``is_ready(key)`` says whether the chunk's
        store completed; a touch of a chunk still being stored is not a reuse.
        """

    @abstractmethod
    def check_integrity(self, resident: Collection[Key]) -> None:
        """Raise AssertionError unless the policy tracks exactly ``resident``, consistently."""

"""Least-recently-used eviction."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

from kvtier.tiers.base.results import Key
from kvtier.tiers.host.policies.base import EvictionPolicy, KeyPredicate


class LruPolicy(EvictionPolicy):
    """Evicts the least recently stored or touched chunk that may be evicted."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        # Invariant: exactly the resident keys, least recently used first.
        self._order: OrderedDict[Key, None] = OrderedDict()

    @property
    def lru_keys(self) -> list[Key]:
        """Resident keys, least recently used first (the next victim first)."""
        return list(self._order)

    def admit(
        self, incoming: Sequence[Key], num_evict: int, can_evict: KeyPredicate
    ) -> list[Key] | None:
        victims: list[Key] = []
        if num_evict > 0:
            for key in self._order:
                if can_evict(key):
                    victims.append(key)
                    if len(victims) == num_evict:
                        break
        if len(victims) < num_evict:
            return None
        for key in victims:
            del self._order[key]
        for key in incoming:
            self._order[key] = None
        return victims

    def remove(self, key: Key) -> None:
        del self._order[key]

    def touch(self, keys: Sequence[Key], is_ready: KeyPredicate) -> None:
        for key in reversed(keys):
            if key in self._order:
                self._order.move_to_end(key)

    def check_integrity(self, resident: Collection[Key]) -> None:
        assert len(self._order) == len(resident), (
            f"LRU tracks {len(self._order)} keys, manager holds {len(resident)}"
        )
        missing = [key for key in resident if key not in self._order]
        assert not missing, f"resident keys missing from the LRU order: {missing!r}"
        assert len(self._order) <= self.capacity, "LRU tracks more keys than capacity"

"""Adaptive Replacement Cache eviction (Megiddo & Modha), as vLLM's CPU offloading tier uses it.

    T1  resident, used once (stored, not reused since)       LRU first
    T2  resident, used at least twice                        LRU first
    B1  ghosts: keys evicted from T1 (no data, no slot)      oldest first, at most capacity
    B2  ghosts: keys evicted from T2                         oldest first, at most capacity
    target_t1_size  how many resident chunks T1 should hold, in [0, capacity]

A store of a B1 ghost means recency was undervalued: the target grows. A store of a B2 ghost means
frequency was undervalued: the target shrinks. A re-stored ghost enters T2 (it is a second use).
Eviction takes T1's LRU chunk while T1 holds at least the target, else T2's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence

from kvtier.tiers.base.results import Key
from kvtier.tiers.host.policies.base import EvictionPolicy, KeyPredicate


class ArcPolicy(EvictionPolicy):
    """ARC: balances recency (T1) against frequency (T2) with ghost lists that steer a target."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        # Invariants: T1 and T2 are disjoint and together hold exactly the resident keys;
        # B1 and B2 are disjoint, hold no resident key, and hold at most capacity keys each.
        self._t1: OrderedDict[Key, None] = OrderedDict()
        self._t2: OrderedDict[Key, None] = OrderedDict()
        self._b1: OrderedDict[Key, None] = OrderedDict()
        self._b2: OrderedDict[Key, None] = OrderedDict()
        self._target_t1_size: float = 0.0  # in [0, capacity]

    @property
    def t1_keys(self) -> list[Key]:
        """Resident keys used once, least recently used first."""
        return list(self._t1)

    @property
    def t2_keys(self) -> list[Key]:
        """Resident keys used at least twice, least recently used first."""
        return list(self._t2)

    @property
    def b1_keys(self) -> list[Key]:
        """Ghosts of keys evicted from T1, oldest first."""
        return list(self._b1)

    @property
    def b2_keys(self) -> list[Key]:
        """Ghosts of keys evicted from T2, oldest first."""
        return list(self._b2)

    @property
    def target_t1_size(self) -> float:
        return self._target_t1_size

    def admit(
        self, incoming: Sequence[Key], num_evict: int, can_evict: KeyPredicate
    ) -> list[Key] | None:
        # Adapt first (eviction must see the new target), but commit only once victims are found.
        target = self._adapted_target(incoming)
        victims = self._select_victims(num_evict, target, can_evict)
        if victims is None:
            return None
        self._target_t1_size = target
        reused = {key for key in incoming if key in self._b1 or key in self._b2}
        for key in reused:
            self._b1.pop(key, None)
            self._b2.pop(key, None)
        for key, from_t1 in victims:
            if from_t1:
                del self._t1[key]
                self._b1[key] = None
            else:
                del self._t2[key]
                self._b2[key] = None
        for key in incoming:
            if key in reused:
                self._t2[key] = None
            else:
                self._t1[key] = None
        for ghosts in (self._b1, self._b2):
            while len(ghosts) > self.capacity:
                ghosts.popitem(last=False)
        return [key for key, _ in victims]

    def _adapted_target(self, incoming: Sequence[Key]) -> float:
        target = self._target_t1_size
        for key in incoming:
            if key in self._b1:
                target = min(target + max(1.0, len(self._b2) / len(self._b1)), self.capacity)
            elif key in self._b2:
                target = max(target - max(1.0, len(self._b1) / len(self._b2)), 0.0)
        return target

    def _select_victims(
        self, num_evict: int, target: float, can_evict: KeyPredicate
    ) -> list[tuple[Key, bool]] | None:
        """Choose ``num_evict`` (key, from_t1) victims without changing anything, or None."""
        t1_candidates: Iterator[Key] = (key for key in self._t1 if can_evict(key))
        t2_candidates: Iterator[Key] = (key for key in self._t2 if can_evict(key))
        t1_size = len(self._t1)  # T1's size once the victims chosen so far are gone
        victims: list[tuple[Key, bool]] = []
        while len(victims) < num_evict:
            key = next(t1_candidates, None) if t1_size >= int(target) else None
            from_t1 = key is not None
            if key is None:
                key = next(t2_candidates, None)
            if key is None:
                key = next(t1_candidates, None)
                from_t1 = True
            if key is None:
                return None
            if from_t1:
                t1_size -= 1
            victims.append((key, from_t1))
        return victims

    def remove(self, key: Key) -> None:
        if key in self._t1:
            del self._t1[key]
        else:
            del self._t2[key]

    def touch(self, keys: Sequence[Key], is_ready: KeyPredicate) -> None:
        for key in reversed(keys):
            if key in self._t1:
                if is_ready(key):
                    del self._t1[key]
                    self._t2[key] = None  # second use: promote
                else:
                    self._t1.move_to_end(key)  # the storing request itself: not a reuse
            elif key in self._t2:
                self._t2.move_to_end(key)

    def check_integrity(self, resident: Collection[Key]) -> None:
        t1, t2, b1, b2 = set(self._t1), set(self._t2), set(self._b1), set(self._b2)
        assert not t1 & t2, f"keys in both T1 and T2: {t1 & t2!r}"
        assert len(t1) + len(t2) == len(resident), (
            f"ARC tracks {len(t1) + len(t2)} resident keys, manager holds {len(resident)}"
        )
        missing = [key for key in resident if key not in t1 and key not in t2]
        assert not missing, f"resident keys missing from T1/T2: {missing!r}"
        assert len(t1) + len(t2) <= self.capacity, "ARC holds more keys than capacity"
        assert not b1 & b2, f"keys in both ghost lists: {b1 & b2!r}"
        assert len(b1) <= self.capacity, f"B1 holds {len(b1)} > capacity {self.capacity}"
        assert len(b2) <= self.capacity, f"B2 holds {len(b2)} > capacity {self.capacity}"
        ghosts_resident = (b1 | b2) & (t1 | t2)
        assert not ghosts_resident, f"ghost keys that are resident: {ghosts_resident!r}"
        assert 0 <= self._target_t1_size <= self.capacity, (
            f"target_t1_size {self._target_t1_size} outside [0, {self.capacity}]"
        )

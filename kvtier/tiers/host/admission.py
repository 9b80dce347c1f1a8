"""``AdmissionCounter``: how often each key was looked up, for the host tier's store threshold."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvtier.tiers.base.results import Key


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

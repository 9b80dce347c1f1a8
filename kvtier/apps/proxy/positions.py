"""A fleet's engines by position: what the index's groups of engines (names) are to the
policies (positions in the fleet's counts).

    Positions(names)        the fleet, in order; ``engines``, its names as a set
    Positions.of(engines)   the positions of some of its engines, ascending (kept)

One object stands for one fleet: the proxy makes a new one when its engines up change, and
what is worked out for a fleet is kept against that object (``of`` here, and each
``Holders``' masks).
"""

from __future__ import annotations

from collections.abc import Sequence


class Positions:
    KEPT = 4096  # groups whose positions are kept; past that, forgotten at once

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.at = {name: i for i, name in enumerate(self.names)}
        self.bit = {name: 1 << i for i, name in enumerate(self.names)}  # its bit in a mask
        self.engines = frozenset(self.names)
        self._kept: dict[frozenset[str], list[int]] = {}

    def __len__(self) -> int:
        return len(self.names)

    def of(self, engines: frozenset[str]) -> list[int]:
        """The positions of ``engines`` (each one of the fleet), ascending: made once for a
        set (the index's groups recur: the engines without a system prompt, decision after
        decision, are one set)."""
        kept = self._kept.get(engines)
        if kept is None:
            if len(self._kept) >= self.KEPT:
                self._kept.clear()
            kept = self._kept[engines] = sorted(map(self.at.__getitem__, engines))
        return kept

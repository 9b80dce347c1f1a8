"""``FreeSlots``: the host tier's free slots, handed out lowest first.

FreeSlots(capacity)     slots ``0 .. capacity-1``, all free
.take(n) -> [slot]      ``n`` of them, ascending (a request's chunks tend to be adjacent
                        records: longer copy runs)
.release(slots)         free again
.check(used)            AssertionError unless the free and ``used`` slots partition the range
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class FreeSlots:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free: list[int] = list(range(capacity - 1, -1, -1))  # pop() hands out 0, 1, ...

    def __len__(self) -> int:
        return len(self._free)

    def take(self, count: int) -> list[int]:
        return sorted(self._free.pop() for _ in range(count))

    def release(self, slots: Iterable[int]) -> None:
        self._free.extend(slots)

    def check(self, used: Sequence[int]) -> None:
        free = self._free
        assert len(free) + len(used) == self.capacity, (
            f"{len(free)} free + {len(used)} used != capacity {self.capacity}"
        )
        assert len(set(used)) == len(used), f"a slot is used twice: {sorted(used)}"
        assert len(set(free)) == len(free), f"a slot is free twice: {free}"
        assert not set(used) & set(free), f"slots both free and used: {set(used) & set(free)}"
        out_of_range = [s for s in [*used, *free] if not 0 <= s < self.capacity]
        assert not out_of_range, f"slots outside [0, {self.capacity}): {out_of_range}"

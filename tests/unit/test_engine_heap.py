"""``freeze_survivors``: garbage collected first, then what survived frozen (skipped by every
later collection until vLLM's engine shutdown unfreezes it)."""

from __future__ import annotations

import gc
import weakref

from kvtier.apps.engine_heap import freeze_survivors


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_dead_cycles_are_collected_and_the_living_frozen() -> None:
    dead_a, dead_b = _Node(), _Node()
    dead_a.other, dead_b.other = dead_b, dead_a  # a cycle: only a collection frees it
    dead = weakref.ref(dead_a)
    del dead_a, dead_b
    kept = _Node()
    try:
        freeze_survivors()
        assert dead() is None  # collected, not frozen alive
        assert gc.get_freeze_count() > 0
        assert not any(o is kept for o in gc.get_objects())  # frozen: no collection scans it
    finally:
        gc.unfreeze()
    assert any(o is kept for o in gc.get_objects())

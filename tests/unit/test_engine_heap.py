"""``freeze_survivors``: garbage collected first, then what survived frozen (skipped by every
later collection until vLLM's engine shutdown unfreezes it). ``freeze_heap``: everything frozen,
garbage included, with no scan; the garbage is freed once the heap is unfrozen and collected.
``frozen_imports``: no automatic collection inside, one whole collection at the end, the survivors
frozen; on an error nothing frozen; the collector left as it was."""

from __future__ import annotations

import gc
import weakref

import pytest

from kvtier.apps.engine_heap import freeze_heap, freeze_survivors, frozen_imports


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


def test_freeze_heap_freezes_garbage_with_the_rest_and_scans_nothing() -> None:
    dead_a, dead_b = _Node(), _Node()
    dead_a.other, dead_b.other = dead_b, dead_a
    dead = weakref.ref(dead_a)
    del dead_a, dead_b
    collections: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(record)
    try:
        freeze_heap()
        assert collections == [] and dead() is not None  # frozen, not scanned: kept for now
        gc.collect()
        assert dead() is not None  # no collection frees what is frozen
    finally:
        gc.callbacks.remove(record)
        gc.unfreeze()  # as vLLM's engine shutdown does
    gc.collect()
    assert dead() is None


def test_frozen_imports_collect_once_at_the_end_and_freeze_what_survived() -> None:
    generations: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    frozen_before = gc.get_freeze_count()
    gc.callbacks.append(record)
    try:
        with frozen_imports():
            assert not gc.isenabled()
            made = [_Node() for _ in range(50_000)]  # past every automatic threshold
            dead_a, dead_b = _Node(), _Node()
            dead_a.other, dead_b.other = dead_b, dead_a
            dead = weakref.ref(dead_a)
            del dead_a, dead_b
            assert generations == []  # no automatic collection inside
        assert gc.isenabled() and generations == [2]  # one, whole, at the end
        assert dead() is None  # garbage made inside: collected, not frozen
        assert gc.get_freeze_count() >= frozen_before + len(made)
        assert not any(o is made[0] for o in gc.get_objects())  # frozen
    finally:
        gc.callbacks.remove(record)
        gc.unfreeze()


def test_frozen_imports_restore_the_collector_and_freeze_nothing_on_an_error() -> None:
    frozen_before = gc.get_freeze_count()
    with pytest.raises(ImportError), frozen_imports():
        raise ImportError("no such module")
    assert gc.isenabled() and gc.get_freeze_count() == frozen_before
    gc.disable()
    try:
        with frozen_imports():
            pass
        assert not gc.isenabled()  # left as it was
    finally:
        gc.enable()
        gc.unfreeze()

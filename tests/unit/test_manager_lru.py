"""LRU order in ChunkManager: stores and touches decide which chunk leaves first (capacity 4)."""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.tiers.base.results import Key, StorePlan
from kvtier.tiers.host.index import ChunkManager
from kvtier.tiers.host.policies import LruPolicy


def store(manager: ChunkManager, keys: Sequence[Key]) -> StorePlan:
    plan = manager.place(keys)
    assert plan is not None
    manager.complete_store(dict.fromkeys(plan.keys, 0))
    return plan


def lru_keys(manager: ChunkManager) -> list[Key]:
    assert isinstance(manager.policy, LruPolicy)
    return manager.policy.lru_keys


def test_later_stores_are_more_recent() -> None:
    manager = ChunkManager(4, "lru")

    store(manager, [1, 2])
    store(manager, [3, 4])

    assert lru_keys(manager) == [1, 2, 3, 4]
    manager.check_integrity()


def test_touch_protects_a_key_from_the_next_eviction() -> None:
    manager = ChunkManager(4, "lru")
    store(manager, [1, 2, 3, 4])

    manager.touch([1])

    assert lru_keys(manager) == [2, 3, 4, 1]
    plan = manager.place([5])
    assert plan is not None
    assert plan.evicted == [2]
    manager.check_integrity()


def test_without_touch_the_oldest_key_is_evicted() -> None:
    manager = ChunkManager(4, "lru")
    store(manager, [1, 2, 3, 4])

    plan = manager.place([5])

    assert plan is not None
    assert plan.evicted == [1]
    manager.check_integrity()


def test_touching_a_prefix_keeps_its_head_longest() -> None:
    manager = ChunkManager(4, "lru")
    store(manager, [1, 2, 3, 4])

    manager.touch([1, 2])  # 1 is the head: it becomes the most recently used

    assert lru_keys(manager) == [3, 4, 2, 1]
    plan = manager.place([5, 6])
    assert plan is not None
    assert plan.evicted == [3, 4]
    manager.complete_store(dict.fromkeys(plan.keys, 0))
    plan = manager.place([7])
    assert plan is not None
    assert plan.evicted == [2]
    manager.check_integrity()


def test_eviction_skips_a_pinned_oldest_key_and_keeps_its_place() -> None:
    manager = ChunkManager(4, "lru")
    store(manager, [1, 2, 3, 4])
    manager.prepare_load([1])

    plan = manager.place([5])
    assert plan is not None
    assert plan.evicted == [2]
    manager.complete_store(dict.fromkeys(plan.keys, 0))
    manager.complete_load([1])

    plan = manager.place([6])  # unpinned, 1 is again the oldest
    assert plan is not None
    assert plan.evicted == [1]
    assert manager.num_pinned == 0
    manager.check_integrity()


def test_failed_store_leaves_the_order() -> None:
    manager = ChunkManager(4, "lru")
    store(manager, [1, 2])
    assert manager.place([3]) is not None

    manager.complete_store({}, [3])

    assert lru_keys(manager) == [1, 2]
    manager.check_integrity()

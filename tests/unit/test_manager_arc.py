"""ARC in ChunkManager: T1/T2 promotion, ghost lists and the adaptive target (capacity 4)."""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.tiers.base.results import Key, StorePlan
from kvtier.tiers.host.index import ChunkManager
from kvtier.tiers.host.policies import ArcPolicy


def store(manager: ChunkManager, keys: Sequence[Key]) -> StorePlan:
    plan = manager.place(keys)
    assert plan is not None
    manager.complete_store(dict.fromkeys(plan.keys, 0))
    return plan


def arc(manager: ChunkManager) -> ArcPolicy:
    assert isinstance(manager.policy, ArcPolicy)
    return manager.policy


def test_new_chunks_enter_t1() -> None:
    manager = ChunkManager(4, "arc")

    store(manager, [1, 2])

    assert (arc(manager).t1_keys, arc(manager).t2_keys) == ([1, 2], [])
    assert arc(manager).target_t1_size == 0
    manager.check_integrity()


def test_chunk_moves_to_t2_on_its_second_touch() -> None:
    manager = ChunkManager(4, "arc")
    assert manager.place([1]) is not None

    manager.touch([1])  # first touch: the storing request itself, the chunk is not ready
    assert (arc(manager).t1_keys, arc(manager).t2_keys) == ([1], [])

    manager.complete_store(dict.fromkeys([1], 0))
    manager.touch([1])  # second touch: a reuse
    assert (arc(manager).t1_keys, arc(manager).t2_keys) == ([], [1])
    manager.check_integrity()


def test_touch_in_t2_moves_to_its_most_recent_end() -> None:
    manager = ChunkManager(4, "arc")
    store(manager, [1, 2, 3])
    manager.touch([1, 2, 3])  # prefix head last processed: most recent
    assert arc(manager).t2_keys == [3, 2, 1]

    manager.touch([3])

    assert arc(manager).t2_keys == [2, 1, 3]
    manager.check_integrity()


def test_eviction_takes_t1_while_it_holds_the_target() -> None:
    manager = ChunkManager(4, "arc")
    store(manager, [1, 2, 3, 4])
    manager.touch([1])  # 1 -> T2; T1 = [2, 3, 4], target 0

    plan = manager.place([5])

    assert plan is not None
    assert plan.evicted == [2]
    assert (arc(manager).b1_keys, arc(manager).b2_keys) == ([2], [])
    manager.check_integrity()


def test_eviction_takes_t2_when_t1_has_nothing_evictable() -> None:
    manager = ChunkManager(4, "arc")
    store(manager, [1, 2, 3, 4])
    manager.touch([1, 2, 3, 4])
    assert arc(manager).t2_keys == [4, 3, 2, 1]

    plan = manager.place([5])

    assert plan is not None
    assert plan.evicted == [4]
    assert (arc(manager).b1_keys, arc(manager).b2_keys) == ([], [4])
    manager.check_integrity()


def test_hit_in_b1_raises_target_and_returns_to_t2() -> None:
    manager = ChunkManager(4, "arc")
    store(manager, [1, 2, 3, 4])
    assert store(manager, [5]).evicted == [1]
    assert arc(manager).b1_keys == [1]

    plan = store(manager, [1])  # 1 was evicted too early: recency is worth more

    assert arc(manager).target_t1_size == 1
    assert plan.evicted == [2]  # T1 (4 chunks) still holds at least the target
    assert arc(manager).t1_keys == [3, 4, 5]
    assert arc(manager).t2_keys == [1]
    assert arc(manager).b1_keys == [2]
    manager.check_integrity()


def test_hit_in_b2_lowers_target() -> None:
    manager = ChunkManager(4, "arc")
    store(manager, [1, 2, 3, 4])
    store(manager, [5])  # evicts 1 to B1
    store(manager, [1])  # B1 hit: target 1, evicts 2 to B1, 1 enters T2
    assert arc(manager).target_t1_size == 1
    manager.prepare_load([3, 4, 5])  # T1 has nothing evictable: the next victim comes from T2
    assert store(manager, [6]).evicted == [1]
    manager.complete_load([3, 4, 5])
    assert (arc(manager).b1_keys, arc(manager).b2_keys) == ([2], [1])

    plan = store(manager, [1])  # 1 was evicted from T2 too early: frequency is worth more

    assert arc(manager).target_t1_size == 0
    assert plan.evicted == [3]
    assert arc(manager).t2_keys == [1]
    assert (arc(manager).b1_keys, arc(manager).b2_keys) == ([2, 3], [])
    manager.check_integrity()


def test_failed_admission_leaves_target_and_ghosts_unchanged() -> None:
    manager = ChunkManager(4, "arc")
    store(manager, [1, 2, 3, 4])
    store(manager, [5])  # evicts 1 to B1
    manager.prepare_load([2, 3, 4, 5])

    assert manager.place([1]) is None  # would be a B1 hit, but there is no room

    assert arc(manager).target_t1_size == 0
    assert arc(manager).b1_keys == [1]
    assert arc(manager).t1_keys == [2, 3, 4, 5]
    manager.complete_load([2, 3, 4, 5])
    manager.check_integrity()


def test_failed_store_of_a_ghost_leaves_no_trace() -> None:
    manager = ChunkManager(4, "arc")
    store(manager, [1, 2, 3, 4])
    store(manager, [5])  # evicts 1 to B1
    assert manager.place([1]) is not None

    manager.complete_store({}, [1])

    policy = arc(manager)
    assert 1 not in policy.t1_keys + policy.t2_keys + policy.b1_keys + policy.b2_keys
    manager.check_integrity()


def test_ghost_lists_are_bounded_by_capacity() -> None:
    manager = ChunkManager(2, "arc")

    for key in range(10):
        store(manager, [key])

    assert arc(manager).t1_keys == [8, 9]
    assert arc(manager).b1_keys == [6, 7]
    manager.check_integrity()

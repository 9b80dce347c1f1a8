"""ChunkManager scenarios that every eviction policy must pass (capacity 4, integer keys)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.tiers.base.index import Found
from kvtier.tiers.base.results import EventKind, Key, StorePlan, TierEvent
from kvtier.tiers.host.index import ChunkManager
from kvtier.tiers.host.policies import make_policy

POLICIES = ["lru", "arc"]


@pytest.fixture(params=POLICIES)
def policy(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def store(manager: ChunkManager, keys: Sequence[Key]) -> StorePlan:
    """prepare_store + successful complete_store."""
    plan = manager.place(keys)
    assert plan is not None
    manager.complete_store(dict.fromkeys(plan.keys, 0))
    return plan


def stored(kind: EventKind, keys: list[Key]) -> TierEvent:
    return TierEvent(kind, keys, "cpu")


def test_store_skips_present_keys_and_evicts_the_oldest(policy: str) -> None:
    manager = ChunkManager(4, policy)
    first = store(manager, [1, 2])
    assert first == StorePlan([1, 2], first.slots, [])
    assert sorted(first.slots) == [0, 1]

    plan = manager.place([2, 3, 4, 5])

    assert plan is not None
    assert plan.keys == [3, 4, 5]
    assert plan.evicted == [1]
    # key 2 keeps its slot; the three new keys get the other three, including 1's old slot.
    slot_of_2 = first.slots[1]
    assert sorted([*plan.slots, slot_of_2]) == [0, 1, 2, 3]
    manager.complete_store(dict.fromkeys(plan.keys, 0))
    assert manager.lookup([2, 3, 4, 5]) == Found(4, False)
    assert manager.lookup([1]) == Found(0, False)
    assert manager.take_events() == [
        stored(EventKind.STORED, [1, 2]),
        stored(EventKind.REMOVED, [1]),
        stored(EventKind.STORED, [3, 4, 5]),
    ]
    manager.check_integrity()


def test_keys_offered_again_are_not_evicted_to_store_their_tail(policy: str) -> None:
    manager = ChunkManager(4, policy)
    store(manager, [1, 2, 3, 4])  # 1 is the oldest, hence the first victim...

    plan = manager.place([1, 5])  # ...unless it is part of this very offer

    assert plan is not None
    assert (plan.keys, plan.evicted) == ([5], [2])
    manager.check_integrity()


def test_pinned_chunk_is_never_evicted(policy: str) -> None:
    manager = ChunkManager(4, policy)
    store(manager, [1, 2, 3, 4])
    manager.prepare_load([1])  # load in flight: 1 is pinned

    plan = manager.place([5])

    assert plan is not None
    assert plan.evicted == [2]
    assert manager.lookup([1]).ready == 1
    manager.complete_load([1])
    assert manager.num_pinned == 0
    manager.check_integrity()


def test_chunk_in_flight_is_never_evicted(policy: str) -> None:
    manager = ChunkManager(4, policy)
    assert manager.place([1]) is not None  # oldest, but its store is in flight
    store(manager, [2, 3, 4])

    plan = manager.place([5])

    assert plan is not None
    assert plan.evicted == [2]
    manager.check_integrity()


def test_no_room_when_everything_is_in_flight(policy: str) -> None:
    manager = ChunkManager(4, policy)
    assert manager.place([1, 2, 3, 4]) is not None

    assert manager.place([5]) is None

    manager.complete_store(dict.fromkeys([1], 0))
    plan = manager.place([5])
    assert plan is not None
    assert plan.evicted == [1]
    manager.check_integrity()


def test_prepare_store_returns_none_and_changes_nothing(policy: str) -> None:
    manager = ChunkManager(4, policy)
    store(manager, [1, 2, 3, 4])
    manager.take_events()
    manager.prepare_load([1, 2, 3])  # only 4 can be evicted; [5, 6] needs two slots

    assert manager.place([5, 6]) is None

    assert manager.num_free == 0
    assert manager.lookup([1, 2, 3, 4]).ready == 4
    assert manager.take_events() == []
    manager.check_integrity()
    plan = manager.place([5])  # one slot can still be made
    assert plan is not None
    assert plan.evicted == [4]
    manager.check_integrity()


def test_failed_store_rolls_back(policy: str) -> None:
    manager = ChunkManager(4, policy)
    store(manager, [1])
    manager.take_events()
    plan = manager.place([2])
    assert plan is not None
    assert manager.num_free == 2

    manager.complete_store({}, [2])

    assert manager.lookup([1, 2]) == Found(1, False)
    assert manager.num_free == 3
    assert manager.take_events() == []
    manager.check_integrity()
    retry = manager.place([2])  # not "already present": it can be stored again
    assert retry is not None
    assert retry.keys == [2]
    assert retry.slots == plan.slots  # the freed slot is handed out again
    manager.check_integrity()


def test_complete_store_ignores_keys_not_in_flight(policy: str) -> None:
    manager = ChunkManager(4, policy)
    store(manager, [1])
    manager.take_events()

    manager.complete_store(dict.fromkeys([1], 0))  # already ready: no second event
    manager.complete_store({}, [1])  # a late failure must not drop a ready chunk
    manager.complete_store(dict.fromkeys([7], 0))  # never prepared

    assert manager.take_events() == []
    assert manager.lookup([1]).ready == 1
    assert manager.num_free == 3
    manager.check_integrity()


def test_events_list_stores_and_removals_in_order_then_clear(policy: str) -> None:
    manager = ChunkManager(4, policy, tier="disk")
    store(manager, [1, 2, 3, 4])
    plan = manager.place([5, 6])
    assert plan is not None
    manager.complete_store(dict.fromkeys([6, 5], 0))

    assert manager.take_events() == [
        TierEvent(EventKind.STORED, [1, 2, 3, 4], "disk"),
        TierEvent(EventKind.REMOVED, [1, 2], "disk"),
        TierEvent(EventKind.STORED, [6, 5], "disk"),
    ]
    assert manager.take_events() == []
    manager.check_integrity()


def test_lookup_stops_at_the_first_key_not_ready(policy: str) -> None:
    manager = ChunkManager(4, policy)
    store(manager, [1, 2])
    assert manager.place([3]) is not None  # in flight

    # stopped by 3, whose store is in flight: ask again once it lands
    assert manager.lookup([1, 2, 3, 4]) == Found(2, True)
    assert manager.lookup([1, 3, 2]) == Found(1, True)
    assert manager.lookup([5, 1]) == Found(0, False)  # 5 is absent: a plain miss
    manager.complete_store(dict.fromkeys([3], 0))
    assert manager.lookup([1, 2, 3, 4]) == Found(3, False)
    manager.check_integrity()


def test_prepare_load_pins_and_slots_name_them_in_key_order(policy: str) -> None:
    manager = ChunkManager(4, policy)
    plan = store(manager, [1, 2, 3])
    slot = dict(zip(plan.keys, plan.slots, strict=True))

    manager.prepare_load([3, 1])
    assert manager.slots([3, 1]) == [slot[3], slot[1]]
    manager.prepare_load([3])
    assert manager.slots([3]) == [slot[3]]
    assert manager.num_pinned == 3

    manager.complete_load([3, 1])
    manager.complete_load([3])
    assert manager.num_pinned == 0
    with pytest.raises(ValueError, match="3"):
        manager.complete_load([3])  # would go below zero
    manager.check_integrity()


def test_prepare_load_rejects_missing_or_unready_keys_without_pinning(policy: str) -> None:
    manager = ChunkManager(4, policy)
    store(manager, [1])
    assert manager.place([2]) is not None  # in flight

    with pytest.raises(ValueError, match="9"):
        manager.prepare_load([1, 9])
    with pytest.raises(ValueError, match="2"):
        manager.prepare_load([1, 2])
    with pytest.raises(ValueError, match="9"):
        manager.complete_load([9])

    assert manager.num_pinned == 0
    manager.check_integrity()


def test_unpinned_chunk_can_be_evicted_again(policy: str) -> None:
    manager = ChunkManager(4, policy)
    store(manager, [1, 2, 3, 4])
    manager.prepare_load([1, 2, 3, 4])
    assert manager.place([5]) is None

    manager.complete_load([1, 2, 3, 4])

    plan = manager.place([5])
    assert plan is not None
    assert plan.evicted == [1]
    manager.check_integrity()


def test_duplicate_keys_are_stored_once(policy: str) -> None:
    manager = ChunkManager(4, policy)

    plan = manager.place([3, 3, 4])

    assert plan is not None
    assert plan.keys == [3, 4]
    assert len(set(plan.slots)) == 2
    assert manager.num_free == 2
    manager.check_integrity()


def test_touch_ignores_unknown_keys(policy: str) -> None:
    manager = ChunkManager(4, policy)
    store(manager, [1])

    manager.touch([8, 9])

    assert manager.lookup([8]).ready == 0
    manager.check_integrity()


@pytest.mark.parametrize("threshold", [0, 1])
def test_store_threshold_below_two_admits_everything(policy: str, threshold: int) -> None:
    manager = ChunkManager(4, policy, store_threshold=threshold)

    plan = manager.place([1, 2])

    assert plan is not None
    assert plan.keys == [1, 2]
    manager.check_integrity()


def test_store_threshold_two_needs_two_lookups(policy: str) -> None:
    manager = ChunkManager(4, policy, store_threshold=2)
    manager.lookup([1, 2])

    assert manager.place([1, 2]) == StorePlan([], [], [])

    manager.lookup([1])
    assert manager.place([1, 2]) == StorePlan([1], [0], [])
    manager.check_integrity()


def test_store_threshold_counter_is_bounded(policy: str) -> None:
    manager = ChunkManager(4, policy, store_threshold=2)
    manager.lookup([0])
    manager.lookup(list(range(100, 1100)))  # far more keys than the counter may remember
    manager.check_integrity()  # asserts the counter's bound

    manager.lookup([0])  # the first lookup of 0 was forgotten

    assert manager.place([0]) == StorePlan([], [], [])
    manager.lookup([0])
    assert manager.place([0]) == StorePlan([0], [0], [])
    manager.check_integrity()


def test_capacity_zero_stores_nothing(policy: str) -> None:
    manager = ChunkManager(0, policy)

    assert manager.place([1]) is None
    assert manager.place([]) == StorePlan([], [], [])
    assert manager.lookup([1]) == Found(0, False)
    assert manager.num_free == 0
    assert manager.take_events() == []
    manager.check_integrity()


def test_unknown_policy_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match=r"'arc', 'lru'"):
        make_policy("fifo", 4)
    with pytest.raises(ValueError, match="fifo"):
        ChunkManager(4, "fifo")


def test_negative_capacity_is_rejected() -> None:
    with pytest.raises(ValueError, match="capacity"):
        ChunkManager(-1)


# --- random operation sequences against a model of the contract ---


class Op(NamedTuple):
    kind: str  # store | complete | load | unload | touch
    keys: list[int]
    success: bool


OPS = st.builds(
    Op,
    st.sampled_from(["store", "complete", "load", "unload", "touch"]),
    st.lists(st.integers(min_value=0, max_value=7), min_size=1, max_size=5),
    st.booleans(),
)


@pytest.mark.parametrize("policy_name", POLICIES)
@pytest.mark.parametrize("capacity", [0, 1, 4])
@settings(max_examples=150, deadline=None)
@given(ops=st.lists(OPS, max_size=40))
def test_random_operations_keep_the_contract(
    policy_name: str, capacity: int, ops: list[Op]
) -> None:
    manager = ChunkManager(capacity, policy_name)
    ready: set[int] = set()
    in_flight: set[int] = set()
    pins: Counter[int] = Counter()
    for op in ops:
        key = op.keys[0]
        if op.kind == "store":
            new = [k for k in dict.fromkeys(op.keys) if k not in ready | in_flight]
            evictable = {k for k in ready if pins[k] == 0} - set(op.keys)
            plan = manager.place(op.keys)
            if plan is None:
                assert len(new) > manager.num_free + len(evictable)
                continue
            assert plan.keys == new
            assert set(plan.evicted) <= evictable
            ready -= set(plan.evicted)
            in_flight |= set(new)
        elif op.kind == "complete":
            if op.success:
                manager.complete_store(dict.fromkeys(op.keys, 0))
            else:
                manager.complete_store({}, op.keys)
            done = in_flight & set(op.keys)
            in_flight -= done
            if op.success:
                ready |= done
        elif op.kind == "load" and key in ready:
            manager.prepare_load([key])
            pins[key] += 1
        elif op.kind == "load":
            with pytest.raises(ValueError):
                manager.prepare_load([key])
        elif op.kind == "unload" and pins[key] > 0:
            manager.complete_load([key])
            pins[key] -= 1
        elif op.kind == "touch":
            manager.touch(op.keys)
        manager.check_integrity()
        for k in range(8):
            assert manager.lookup([k]).ready == (k in ready)
        assert manager.num_free == capacity - len(ready) - len(in_flight)
        assert manager.num_pinned == sum(pins.values())


def test_remove_drops_ready_unpinned_chunks_only(policy: str) -> None:
    manager = ChunkManager(4, policy)
    store(manager, [1, 2, 3])
    manager.prepare_load([2])  # pinned by a load
    assert manager.place([4]) is not None  # in flight
    manager.take_events()

    assert manager.remove([1, 2, 4, 9]) == [1]
    assert manager.lookup([1]) == Found(0, False)
    assert manager.num_free == 1
    assert manager.take_events() == [TierEvent(EventKind.REMOVED, [1], "cpu")]
    manager.check_integrity()

"""The scheduler half's request logic, as a specification: 4-token blocks, one chunk per block,
byte-string block hashes, two worker ranks."""

from __future__ import annotations

import pytest

from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKeyMaker, LayoutFingerprint
from kvtier.scheduler.connector import GroupSpec, ScheduledRequest, SchedulerConnector
from kvtier.step_plan import JobOutcome, StepPlan, WorkerReport

HASHES = [b"h0", b"h1", b"h2"]  # three full blocks: 12 tokens


def _connector(
    ranks: int = 2, groups: tuple[GroupSpec, ...] = (GroupSpec(4),), capacity: int = 8
) -> SchedulerConnector:
    fingerprint = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 4)
    # hits of a few 4-token blocks: any asynchronous load is worth it here
    config = KVTierConfig(cpu_bytes_to_use=1, min_async_load_tokens=1)
    return SchedulerConnector(config, list(groups), capacity, ranks, ChunkKeyMaker(fingerprint, 1))


def _done(job_id: int, ranks: int = 1) -> WorkerReport:
    return WorkerReport({job_id: JobOutcome(ranks=ranks, bytes=100, seconds=0.01)})


def _store(
    connector: SchedulerConnector, req: str, blocks: list[int], hashes: list[bytes] = HASHES
) -> StepPlan:
    """``req`` computes its three blocks this step."""
    assert connector.lookup(req, hashes, 0) == 0
    connector.on_alloc(req, [blocks], 0)
    return connector.build_plan([ScheduledRequest(req, [blocks], 12)])


def test_a_store_is_done_only_when_every_rank_reported_it() -> None:
    connector = _connector(ranks=2)
    plan = _store(connector, "a", [10, 11, 12])
    (job,) = plan.stores
    assert job.src.block_ids.tolist() == [10, 11, 12]

    connector.on_report(_done(job.job_id))  # rank 0
    assert connector.lookup("b", HASHES, 0) is None  # in flight: ask again next step
    connector.on_report(_done(job.job_id))  # rank 1
    assert connector.lookup("b", HASHES, 0) == 12
    assert connector.stats.cpu.stored_chunks == 3
    assert connector.stats.cpu.stored_bytes == 200  # both ranks' bytes
    connector.check_integrity()


def test_a_load_keeps_its_chunks_pinned_until_every_rank_reported_it() -> None:
    connector = _connector(ranks=2)
    (store,) = _store(connector, "a", [10, 11, 12]).stores
    connector.on_report(_done(store.job_id, ranks=2))

    assert connector.lookup("b", HASHES, 4) == 8  # the engine holds the first block itself
    connector.on_alloc("b", [[20, 21, 22]], 8)
    (load,) = connector.build_plan([]).loads
    assert load.dst.block_ids.tolist() == [21, 22]
    assert load.dst.block_indices == (1,)
    assert connector.manager.num_pinned == 2
    connector.on_report(_done(load.job_id))
    assert connector.manager.num_pinned == 2
    connector.on_report(_done(load.job_id))
    assert connector.manager.num_pinned == 0
    assert connector.stats.cpu.loaded_chunks == 2
    connector.check_integrity()


def test_a_finished_request_is_held_until_its_stores_drain() -> None:
    connector = _connector(ranks=1)
    (store,) = _store(connector, "a", [10, 11, 12]).stores
    assert connector.request_finished("a") is True
    assert connector.build_plan([]).held == ["a"]
    connector.on_report(_done(store.job_id))
    assert "a" not in connector.requests
    assert connector.request_finished("c") is False  # never seen: nothing to wait for


def test_reused_blocks_and_preemption_flush_pending_stores() -> None:
    connector = _connector(ranks=1)
    (store,) = _store(connector, "a", [10, 11, 12]).stores
    assert connector.request_finished("a") is True  # held, its blocks stay allocated
    # a new request is handed block 11 while the store reading it may still run
    assert connector.lookup("b", [b"x"], 0) == 0
    connector.on_alloc("b", [[11]], 0)
    plan = connector.build_plan([ScheduledRequest("b", [[11]], 1)])
    assert plan.flush == [store.job_id]

    (other,) = _store(connector, "d", [30, 31, 32], [b"d0", b"d1", b"d2"]).stores
    plan = connector.build_plan([], preempted=["d"])
    assert other.job_id in plan.flush
    assert connector.stats.preemptions == 1


def test_a_sliding_window_group_stores_and_loads_only_its_window() -> None:
    full, window = GroupSpec(4), GroupSpec(4, sliding_window=4)
    connector = _connector(ranks=1, groups=(full, window))
    assert connector.lookup("a", HASHES, 0) == 0
    connector.on_alloc("a", [[10, 11, 12], [0, 21, 22]], 0)  # block 20 left the window: null
    (store,) = connector.build_plan([ScheduledRequest("a", [[10, 11, 12], [0, 21, 22]], 12)]).stores
    assert store.src.block_ids.tolist() == [10, 11, 12, 21, 22]
    assert store.src.group_sizes == (3, 2)
    connector.on_report(_done(store.job_id))

    assert connector.lookup("b", HASHES, 0) == 12  # the window's chunks are there
    connector.on_alloc("b", [[40, 41, 42], [0, 0, 52]], 12)
    (load,) = connector.build_plan([]).loads
    assert load.dst.block_ids.tolist() == [40, 41, 42, 52]
    assert (load.dst.group_sizes, load.dst.block_indices) == ((3, 1), (0, 2))
    connector.on_report(_done(load.job_id))
    connector.check_integrity()


@pytest.mark.parametrize("capacity_chunks", [0])
def test_no_host_memory_means_no_hits(capacity_chunks: int) -> None:
    fingerprint = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 4)
    connector = SchedulerConnector(
        KVTierConfig(cpu_bytes_to_use=1), [GroupSpec(4)], capacity_chunks, 1,
        ChunkKeyMaker(fingerprint, 1),
    )  # fmt: skip
    assert connector.lookup("a", HASHES, 0) == 0
    connector.on_alloc("a", [[1, 2, 3]], 0)
    plan = connector.build_plan([ScheduledRequest("a", [[1, 2, 3]], 12)])
    assert plan.stores == []
    assert connector.stats.cpu.skipped_stores == 3


def test_chunks_cut_for_room_are_offered_again_on_the_next_step() -> None:
    """A host tier of 2 chunks takes a 3-chunk prompt over two steps (counted skipped once)."""
    connector = _connector(ranks=1, capacity=2)
    assert connector.lookup("a", HASHES, 0) == 0
    connector.on_alloc("a", [[10, 11, 12]], 0)
    (first,) = connector.build_plan([ScheduledRequest("a", [[10, 11, 12]], 12)]).stores
    assert first.src.block_ids.tolist() == [10, 11]
    assert connector.stats.cpu.skipped_stores == 1
    assert connector.build_plan([ScheduledRequest("a", None, 13, 1, True)]).stores == []  # pinned
    connector.on_report(_done(first.job_id))
    (second,) = connector.build_plan([ScheduledRequest("a", None, 14, 1, True)]).stores
    assert second.src.block_ids.tolist() == [12]
    connector.on_report(_done(second.job_id))
    assert connector.keys.keys(HASHES, 0)[2] in connector.manager.stored()
    assert connector.stats.cpu.skipped_stores == 1
    connector.check_integrity()


def test_a_steps_stores_are_one_job_each_request_still_held_until_it_is_done() -> None:
    """Two requests each store their chunks and their prompt's tail in one step: one job id,
    four parts. Finished before the job is done, each keeps its blocks; the job's completion
    stores every chunk and forgets both requests."""
    connector = _connector(ranks=1)
    plans = []
    for req, hashes, blocks in (("a", [b"a0", b"a1"], [10, 11, 12]),
                                ("b", [b"b0", b"b1"], [20, 21, 22])):  # fmt: skip
        # 10 tokens: two full blocks, the tail's 2 tokens in a third
        assert connector.lookup(req, hashes, 0, 10, [7, 8]) == 0
        connector.on_alloc(req, [blocks], 0)
        plans.append(ScheduledRequest(req, [blocks], 10, 10))
    stores = connector.build_plan(plans).stores
    assert [(s.req_id, s.src.block_ids.tolist(), len(s.keys)) for s in stores] == [
        ("a", [10, 11], 2), ("b", [20, 21], 2), ("a", [12], 0), ("b", [22], 0)
    ]  # fmt: skip
    assert len({store.job_id for store in stores}) == 1
    assert connector.request_finished("a") and connector.request_finished("b")  # held
    connector.on_report(_done(stores[0].job_id))
    assert connector.requests == {}
    assert connector.stats.cpu.stored_chunks == 6  # 2 x (2 chunks and a tail)
    connector.check_integrity()

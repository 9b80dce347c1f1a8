"""A step hands the scheduler half each request's new blocks, never its whole table: the tables
kvtier keeps, the stores and the flushes, as a specification. 4-token blocks, byte hashes, one
worker rank."""

from __future__ import annotations

from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKeyMaker, LayoutFingerprint
from kvtier.scheduler.connector import (
    GroupSpec,
    ScheduledRequest,
    SchedulerConnector,
    StepRequests,
)
from kvtier.step_plan import JobOutcome, StepPlan, WorkerReport

FULL, WINDOW4 = GroupSpec(4), GroupSpec(4, sliding_window=4)


def _connector(
    factor: int = 1, groups: tuple[GroupSpec, ...] = (FULL,), chunks: int = 16
) -> SchedulerConnector:
    fingerprint = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 4 * factor)
    return SchedulerConnector(
        KVTierConfig(cpu_bytes_to_use=1),
        list(groups),
        chunks,
        1,
        ChunkKeyMaker(fingerprint, factor),
    )


def _hashes(req: str, blocks: int) -> list[bytes]:
    return [f"{req}{i}".encode() for i in range(blocks)]


def _done(connector: SchedulerConnector, plan: StepPlan) -> None:
    for job in [*plan.loads, *plan.stores]:
        connector.on_report(WorkerReport({job.job_id: JobOutcome(ranks=1, bytes=1)}))


def _start(
    connector: SchedulerConnector,
    req: str,
    hashes: list[bytes],
    tables: list[list[int]],
    tokens: int,
) -> StepPlan:
    """``req`` arrives and computes its ``tokens``-token prompt in one step (no hit)."""
    connector.lookup(req, hashes, 0)
    connector.on_alloc(req, tables, 0)
    return connector.build_plan([ScheduledRequest(req, tables, tokens, tokens)])


def _decode(
    connector: SchedulerConnector, req: str, new: list[list[int]] | None, computed: int
) -> StepPlan:
    """``req`` computes one more token (``computed`` after it), with ``new`` blocks."""
    return connector.build_plan([ScheduledRequest(req, new, computed, 1, appended=True)])


def test_blocks_arrive_step_by_step_and_each_chunk_is_stored_once_complete() -> None:
    connector = _connector(factor=2)  # 8-token chunks of two blocks
    hashes = _hashes("a", 1)  # the engine's list: it grows as tokens are known
    assert _start(connector, "a", hashes, [[10, 11]], 6).stores == []
    hashes.append(b"a1")
    assert _decode(connector, "a", None, 7).stores == []
    (first,) = _decode(connector, "a", None, 8).stores  # token 7 completes chunk 0
    assert first.src.block_ids.tolist() == [10, 11]
    assert _decode(connector, "a", [[12]], 9).stores == []
    hashes.append(b"a2")  # block 2: hashed before the step computing its last token
    for computed in range(10, 16):
        new = [[13]] if computed == 13 else None  # token 12 needs block 3
        assert _decode(connector, "a", new, computed).stores == []
    hashes.append(b"a3")
    (second,) = _decode(connector, "a", None, 16).stores
    assert second.src.block_ids.tolist() == [12, 13]
    assert connector.requests["a"].block_ids == [[10, 11, 12, 13]]
    connector.check_integrity()


def test_a_resumed_request_replaces_its_table_and_grows_the_new_one() -> None:
    connector = _connector(factor=2)
    hashes = _hashes("a", 4)
    (store,) = _start(connector, "a", hashes, [[10, 11, 12, 13]], 16).stores
    plan = connector.build_plan([], preempted=["a"])  # its blocks went back to the pool
    assert plan.flush == [store.job_id]
    _done(connector, plan)
    assert connector.requests["a"].block_ids == [[]]

    # resumed: vLLM hands over its whole new table; chunks already stored are not offered again
    connector.lookup("a", hashes, 0)
    connector.on_alloc("a", [[20, 21, 22, 23, 24]], 0)
    assert (
        connector.build_plan([ScheduledRequest("a", [[20, 21, 22, 23, 24]], 17, 17)]).stores == []
    )
    hashes += [b"a4", b"a5"]
    assert _decode(connector, "a", [[25]], 21).stores == []
    (store,) = _decode(connector, "a", None, 24).stores  # chunk 2 from the new table
    assert store.src.block_ids.tolist() == [24, 25]
    assert connector.requests["a"].block_ids == [[20, 21, 22, 23, 24, 25]]


def test_only_blocks_new_to_a_request_are_checked_for_stores_reading_them() -> None:
    connector = _connector()
    (store,) = _start(connector, "a", _hashes("a", 2), [[10, 11]], 8).stores
    assert connector.request_finished("a") is True  # held: its store still reads 10 and 11
    _start(connector, "b", _hashes("b", 1), [[30]], 4)
    assert _decode(connector, "b", [[11]], 5).flush == [store.job_id]  # 11 handed to b
    assert _decode(connector, "b", None, 6).flush == []  # b still holds 11: nothing new
    # a request kvtier does not track (it never looked up) is checked all the same
    plan = connector.build_plan([ScheduledRequest("x", [[10]], 1, 1, appended=True)])
    assert plan.flush == [store.job_id]


def test_a_load_into_a_block_a_store_still_reads_flushes_the_store() -> None:
    connector = _connector()
    hashes = _hashes("a", 3)
    _done(connector, _start(connector, "a", hashes, [[10, 11, 12]], 12))
    hashes.append(b"a3")
    (reading_13,) = _decode(connector, "a", [[13]], 16).stores
    assert connector.request_finished("a") is True
    # b's hit of a's first three blocks loads into 13 while the request waits (not scheduled)
    connector.lookup("b", [*hashes[:3], b"b3"], 0)
    connector.on_alloc("b", [[13, 21, 22, 23]], 12)
    plan = connector.build_plan([])
    (load,) = plan.loads
    assert load.dst.block_ids.tolist() == [13, 21, 22]
    assert plan.flush == [reading_13.job_id]


def test_a_sliding_window_drops_blocks_inside_a_chunk_without_saying_so() -> None:
    """Window 4 < chunk 8: when token 7 completes chunk 0, vLLM has already freed the window
    group's block 0 (tokens 0..3 lie before the window of token 7): the incremental table still
    names it, the step's first token says it is gone. A whole table shows vLLM's null block."""
    for whole in (False, True):
        connector = _connector(factor=2, groups=(FULL, WINDOW4))
        hashes = _hashes("a", 1)
        _start(connector, "a", hashes, [[10, 11], [20, 21]], 7)
        hashes.append(b"a1")
        step = ScheduledRequest("a", None, 8, 1, appended=True)
        if whole:  # as vLLM's own table reads after this step's allocation
            step = ScheduledRequest("a", [[10, 11], [0, 21]], 8, 1)
        (store,) = connector.build_plan([step]).stores
        assert store.src.block_ids.tolist() == [10, 11]
        assert store.src.group_sizes == (2, 0)
        connector.check_integrity()


class _Watched(StepRequests):
    """A step that records which requests the scheduler half looked at."""

    looked: list[int]

    def request(self, i: int) -> ScheduledRequest:
        self.looked.append(i)
        return super().request(i)


def test_a_step_looks_only_at_requests_with_new_blocks_or_something_to_store() -> None:
    """100 requests decode; the step looks at the one handed a block, the one whose chunk its
    token completes, and one kvtier does not track (its new block may be read by a store),
    not at the 97 others: the rest cost a few passes in C (``StepRequests.due``)."""
    connector = _connector(factor=2)  # 8-token chunks
    reqs = [f"r{i}" for i in range(100)]
    for i, req in enumerate(reqs):
        connector.lookup(req, _hashes(req, 2), 0)
        connector.on_alloc(req, [[2 * i + 1, 2 * i + 2]], 0)
    first = StepRequests.of(ScheduledRequest(req, [[2 * i + 1, 2 * i + 2]], 6, 6)
                            for i, req in enumerate(reqs))  # fmt: skip
    assert connector.build_plan(first).stores == []  # 6 of 8 tokens: no chunk yet
    computed = [6] * 100 + [0]
    computed[7] = 7  # its next token completes its chunk
    blocks: list[list[list[int]] | None] = [None] * 100 + [[[500]]]
    blocks[5] = [[300]]
    step = _Watched([*reqs, "untracked"], blocks, computed, dict.fromkeys([*reqs, "untracked"], 1))
    object.__setattr__(step, "looked", [])
    (store,) = connector.build_plan(step).stores
    assert step.looked == [5, 7, 100]
    assert store.req_id == "r7" and store.src.block_ids.tolist() == [15, 16]
    assert connector.requests["r5"].block_ids == [[11, 12, 300]]
    connector.check_integrity()


def test_a_request_that_sat_a_step_out_stores_its_chunk_when_it_computes_it() -> None:
    """vLLM's token budget can leave a running request out of a step (pipeline stages take
    turns too): that step bounds only the requests in it, so the next is looked at, and the
    request's chunk completed there is stored. 8-token chunks."""
    connector = _connector(factor=2)
    tables = {"A": [100, 101, 102, 103, 104, 105], "R": [200, 201, 202, 203]}
    for req in tables:
        connector.lookup(req, _hashes(req, 20), 0)
        connector.on_alloc(req, [tables[req]], 0)

    def stores(plan: StepPlan) -> list[tuple[str, list[int]]]:
        return [(store.req_id, store.src.block_ids.tolist()) for store in plan.stores]

    first = connector.build_plan([ScheduledRequest("A", [tables["A"]], 20, 20),
                                  ScheduledRequest("R", [tables["R"]], 13, 13)])  # fmt: skip
    assert stores(first) == [("A", [100, 101, 102, 103]), ("R", [200, 201])]
    alone = connector.build_plan([ScheduledRequest("A", [[106]], 24, 4, appended=True)])
    assert stores(alone) == [("A", [104, 105])]  # R sat this step out
    both = connector.build_plan([ScheduledRequest("A", None, 25, 1, appended=True),
                                 ScheduledRequest("R", None, 16, 3, appended=True)])  # fmt: skip
    assert stores(both) == [("R", [202, 203])]  # R's second chunk, complete at 16 tokens

"""The scheduler half's per-step work is flat in the requests' lengths, and its incremental tables
decide exactly what whole tables did. Counts, not timings: the machine may be busy."""

from __future__ import annotations

from typing import Any, SupportsIndex

import pytest

from kvtier.apps.bench.scheduler.sim import EngineSim, Workload
from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKeyMaker, LayoutFingerprint
from kvtier.scheduler.connector import GroupSpec, ScheduledRequest, SchedulerConnector
from kvtier.step_plan import StepPlan


def _connector(groups: tuple[GroupSpec, ...], factor: int, chunks: int) -> SchedulerConnector:
    fingerprint = LayoutFingerprint("m", "f32", "test", 0, 1, 0, groups[0].block_tokens * factor)
    return SchedulerConnector(
        KVTierConfig(cpu_bytes_to_use=1),
        list(groups),
        chunks,
        1,
        ChunkKeyMaker(fingerprint, factor),
    )


def _summary(plan: StepPlan) -> tuple[Any, ...]:
    loads = [(j.job_id, j.req_id, j.dst.block_ids.tolist(), j.dst.group_sizes) for j in plan.loads]
    stores = [
        (j.job_id, j.req_id, j.src.block_ids.tolist(), j.src.group_sizes, j.dst.slots.tolist())
        for j in plan.stores
    ]
    return loads, stores, plan.flush, plan.held


@pytest.mark.parametrize("window", [None, 4, 12])
def test_new_blocks_decide_the_same_stores_and_flushes_as_whole_tables(window: int | None) -> None:
    """A scripted engine (arrivals sharing a prefix, decodes, finishes, a preemption now and then,
    a sliding window freeing blocks in place, freed blocks reused at once, reports four steps late,
    a host tier of 160 chunks) runs twice: once handing kvtier whole tables every step, once only
    the new blocks. Every plan is the same."""
    groups = (GroupSpec(4),) if window is None else (GroupSpec(4), GroupSpec(4, window))
    # 264 shared tokens: a hit must be worth an asynchronous load
    work = Workload(
        running=6, context=300, prompt=280, shared=264, decode=(2, 30), preempt_every=6,
        report_delay=4,
    )  # fmt: skip
    plans, sims = [], []
    for whole in (True, False):
        sim = EngineSim(_connector(groups, 2, 160), work, whole_tables=whole)
        plans.append([_summary(sim.step().plan) for _ in range(200)])
        sim.connector.check_integrity()
        sims.append(sim)
    assert plans[0] == plans[1]
    steps = plans[1]
    assert sims[1].preemptions > 5
    assert sum(bool(flush) for _, _, flush, _ in steps) > 5  # stores flushed: blocks reused
    assert sum(len(stores) for _, stores, _, _ in steps) > 50
    assert sum(len(loads) for loads, _, _, _ in steps) > 5  # hits on the shared prefix


class _Reads(list[Any]):
    """A list that counts the elements read from it (indexing, slicing, iterating)."""

    reads = 0

    def __getitem__(self, index: SupportsIndex | slice) -> Any:  # type: ignore[override]
        got = super().__getitem__(index)
        _Reads.reads += len(got) if isinstance(index, slice) else 1
        return got

    def __iter__(self) -> Any:
        _Reads.reads += len(self)
        return super().__iter__()


def _reads_per_step(requests: int, context: int, steps: int) -> list[int]:
    """Elements of kvtier's block tables and key lists read in each of ``steps`` decode steps of
    ``requests`` requests of ``context`` tokens (16-token blocks, 64-token chunks)."""
    connector = _connector((GroupSpec(16),), 4, 1 << 16)  # room for every chunk: all stored
    tables = {f"r{i}": [[1000 * i + b for b in range(context // 16)]] for i in range(requests)}
    for req, table in tables.items():
        hashes = [f"{req}:{b}".encode() for b in range(context // 16 + steps)]
        connector.lookup(req, hashes, 0)
        connector.on_alloc(req, table, 0)
    connector.build_plan([ScheduledRequest(req, t, context, context) for req, t in tables.items()])
    for state in connector.requests.values():
        state.block_ids[0] = _Reads(state.block_ids[0])
        state.keys[0] = _Reads(state.keys[0])
    counts = []
    for step in range(steps):
        computed = context + step + 1
        new = [[10**9 + step]] if (computed - 1) % 16 == 0 else None
        _Reads.reads = 0
        connector.build_plan(
            [ScheduledRequest(req, new, computed, 1, appended=True) for req in tables]
        )
        counts.append(_Reads.reads)
    return counts


def test_a_decode_step_reads_nothing_of_the_old_blocks_however_long_the_requests() -> None:
    """Decoding 64 tokens: a new block every 16, one chunk completed at the 64th. Only the steps
    that complete a chunk read anything (its 4 blocks and its key, a few times), and exactly as
    much for 4096-token requests as for 64-token ones, for 400 requests as for 10."""
    short = _reads_per_step(10, 64, 64)
    long = _reads_per_step(10, 4096, 64)
    many = _reads_per_step(400, 4096, 64)
    assert long == short
    assert many == [count * 40 for count in long]
    assert long[:-1] == [0] * 63
    assert 0 < long[-1] <= 10 * 16  # the completing step: a bounded handful per request

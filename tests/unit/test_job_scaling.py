"""A job's Python work grows at most in proportion to the views it moves, never with their square.

A 70B-class tensor-parallel rank hands kvtier 160 views of 4 KiB pages: a 4,096-token host job is
3 ms on an H200's bus. Working out a group's block bytes view by view, from page sizes recomputed
per view, cost that job 7-12 ms of the engine thread's time (host tier) and a disk or Redis
load 1.4-2 s (on the CPU here; the same Python runs beside a GPU). Counted here: the calls a
job makes, on whichever thread runs it, for layouts of 8, 32 and 128 views with the same blocks
and chunks. Calls are counted, not timed, so the check is exact on a busy machine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from call_counts import Calls, profiled

from kvtier.addresses import EngineBlocks, HostChunks, TierChunks
from kvtier.apps.bench.gpu.plan_cost import JobPlanner
from kvtier.keys import make_key
from kvtier.layout import KVLayout, build_layout
from kvtier.pages import grid
from kvtier.pages.mechanism import Mechanism
from kvtier.tiers.base.chunk_io import TierLoadHandler
from kvtier.tiers.base.handler import Transfer
from kvtier.tiers.disk.files import DiskTier
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.io import engine_host_handlers
from kvtier.tiers.host.io.engine_host import EngineHostHandler

BLOCKS, CHUNKS, FACTOR = 64, 8, 4
VIEWS = (8, 32, 128)


def _layout(views: int) -> KVLayout:
    """``views // 2`` FlashAttention-style layers (a K and a V view each), one group."""
    caches = {f"layer.{i}": torch.zeros(2, BLOCKS, 4, 8) for i in range(views // 2)}
    return build_layout(caches, [list(caches)], BLOCKS)


def _blocks() -> EngineBlocks:
    count = CHUNKS * FACTOR
    return EngineBlocks(np.arange(count, dtype=np.int64), (count,), (0,))


def _host_job(views: int, store: bool) -> int:
    layout = _layout(views)
    host = HostTier(layout, CHUNKS, FACTOR)
    handler = engine_host_handlers(layout, host, lanes=1)[0 if store else 1]
    slots = HostChunks(np.arange(CHUNKS, dtype=np.int64))
    src, dst = (_blocks(), slots) if store else (slots, _blocks())
    assert handler.transfer_async(0, src, dst)  # first-use work, not counted
    counts = []
    for job_id in (1, 2):  # the fewer: not a one-time event of the process (a lazy set-up)
        calls = Calls(type(handler).transfer_async.__code__)
        with profiled(calls):
            assert handler.transfer_async(job_id, src, dst)
        counts.append(calls.count)
    handler.shutdown()
    return min(counts)


def _disk_load(views: int, root: Path) -> int:
    layout = _layout(views)
    tier = DiskTier(root / str(views), 0, bytes(16), "test layout", layout, FACTOR)
    keys = tuple(make_key(bytes(range(16)), i, 0) for i in range(CHUNKS))
    for key in keys:
        tier.write(key, [np.zeros(n, dtype=np.uint8) for n in tier.view_bytes(0)])
    calls = Calls(TierLoadHandler._load.__code__)  # the job, on the handler's thread
    with profiled(calls):
        handler = TierLoadHandler(layout, tier, "disk")
        counts = []
        for job_id in (0, 1, 2):  # the first one's calls are first-use work, not counted
            calls.count = 0
            assert handler.transfer_async(job_id, TierChunks("disk", keys), _blocks())
            handler.wait([job_id])
            (result,) = handler.get_finished()
            assert result.success
            counts.append(calls.count)
    handler.shutdown()
    return min(counts[1:])  # the fewer: not a one-time event of the process


def _tables(planner: JobPlanner) -> grid.Tables:
    assert isinstance(planner.planned, grid.Tables)
    return planner.planned


def _gpu_plan(views: int, mechanism: Mechanism) -> int:
    layout = _layout(views)
    handler = JobPlanner(layout, HostTier(layout, CHUNKS, FACTOR), mechanism)
    job = (_blocks(), HostChunks(np.arange(CHUNKS, dtype=np.int64)))
    assert handler.transfer_async(0, *job)
    calls = Calls(EngineHostHandler.transfer_async.__code__)
    with profiled(calls):
        assert handler.transfer_async(1, *job)
    assert len(_tables(handler).grids) == 1
    return calls.count


@pytest.mark.parametrize("mechanism", list(Mechanism))
def test_a_gpu_jobs_planning_is_the_same_at_any_number_of_views(mechanism: Mechanism) -> None:
    """What a job on a GPU asks of the engine's thread before its kernel launches (``bench
    gpu``'s planner): the job planned, its grids, the grid kernel's tables over the engine's
    views (``kernel``), or over the staging area's records, with their host copies (``dma``)."""
    counts = {views: _gpu_plan(views, mechanism) for views in VIEWS}
    assert len(set(counts.values())) == 1, counts


def test_a_steps_stores_of_many_requests_are_one_grid_per_group() -> None:
    """A step's stores are one job of a part per request: one grid (one kernel launch) for
    them all, holding the same pages as each part's own."""
    layout = _layout(8)
    host = HostTier(layout, CHUNKS, FACTOR)
    parts = [Transfer(7, EngineBlocks(np.arange(r * FACTOR, (r + 1) * FACTOR), (FACTOR,), (0,)),
                      HostChunks(np.array([CHUNKS - 1 - r]))) for r in range(CHUNKS)]  # fmt: skip
    handler = JobPlanner(layout, host, Mechanism.KERNEL)
    assert handler.transfer_batch(parts) == [True] * CHUNKS
    assert len(_tables(handler).grids) == 1
    expected: set[tuple[int, int, int]] = set()
    for part in parts:
        alone = JobPlanner(layout, host, Mechanism.KERNEL)
        assert alone.transfer_async(0, part.src, part.dst)
        expected |= _copies(_tables(alone))
    assert _copies(_tables(handler)) == expected


def _copies(tables: grid.Tables) -> set[tuple[int, int, int]]:
    """Every (engine address, host offset, bytes) the tables' grids copy."""
    found = set()
    for index in range(len(tables.grids)):
        engine, hosted, size = grid.addresses(*tables.of(index), host=0)
        found |= set(zip(engine.tolist(), hosted.tolist(), size.tolist(), strict=True))
    return found


JOBS: dict[str, Callable[[int, Path], int]] = {
    "host store": lambda views, _: _host_job(views, store=True),
    "host load": lambda views, _: _host_job(views, store=False),
    "disk load": _disk_load,
}


@pytest.mark.parametrize("job", JOBS)
def test_a_jobs_calls_grow_at_most_with_its_views(job: str, tmp_path: Path) -> None:
    counts = {views: JOBS[job](views, tmp_path) for views in VIEWS}
    assert all(count > 0 for count in counts.values()), counts  # the hook saw the job
    most, least = max(VIEWS), min(VIEWS)
    # in proportion: 16 times the views, at most 16 times the calls (the square: 256 times)
    assert counts[most] <= counts[least] * most // least, counts
    assert counts[most] - counts[32] <= 4 * (counts[32] - counts[least]) + 64, counts

"""Byte-exact engine <-> host transfers on CPU tensors, several groups, unaligned chunks.

Layout: groups 0 and 2 alias the same two layer buffers (as vLLM 0.32's hybrid models), group 1
has its own. One transfer: group 0 aligned (2 whole chunks), group 1 empty, group 2 starting one
block into a chunk and ending one block before a chunk's end (trimmed at both ends for factor 3).

Pieces are forced down to one page here (``MIN_PIECE_BYTES``), so every job is split across the
copy lanes (``LANES`` threads, 1 to 3) the way a large job is in an engine.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from kvtier.addresses import EngineBlocks, HostChunks
from kvtier.layout import KVLayout, build_layout
from kvtier.media import Medium
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.io import copy_cpu, engine_host_handlers, handlers
from kvtier.tiers.host.io.row_batch import RowBatch
from kvtier.worker import TransferWorker

NUM_BLOCKS, NUM_CHUNKS = 24, 10
LANES = [1, 2, 3]


@pytest.fixture(autouse=True)
def _one_page_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copy_cpu, "MIN_PIECE_BYTES", 1)


# (group, engine block id) -> (host slot, sub-block), written out per factor
EXPECTED = {
    3: {
        "engine": EngineBlocks(
            block_ids=np.array([0, 1, 2, 3, 4, 5, 9, 10, 11, 12]),
            group_sizes=(6, 0, 4),
            block_indices=(0, 7, 4),
        ),
        "host": HostChunks(slots=np.array([7, 2, 5, 0])),
        "map": {
            (0, 0): (7, 0),
            (0, 1): (7, 1),
            (0, 2): (7, 2),
            (0, 3): (2, 0),
            (0, 4): (2, 1),
            (0, 5): (2, 2),
            (2, 9): (5, 1),
            (2, 10): (5, 2),
            (2, 11): (0, 0),
            (2, 12): (0, 1),
        },
    },
    1: {
        "engine": EngineBlocks(
            block_ids=np.array([0, 1, 9, 10]), group_sizes=(2, 0, 2), block_indices=(0, 3, 5)
        ),
        "host": HostChunks(slots=np.array([7, 2, 5, 0])),
        "map": {(0, 0): (7, 0), (0, 1): (2, 0), (2, 9): (5, 0), (2, 10): (0, 0)},
    },
}


def _engine() -> tuple[dict[str, torch.Tensor], list[list[str]]]:
    torch.manual_seed(0)
    backing = torch.randn(2 * NUM_BLOCKS * 2 * 32 * 16)  # two full/sliding layers, aliased
    shared = [backing.view(2, NUM_BLOCKS, 2, 32, 16)[i] for i in range(2)]
    caches = {"full.0": shared[0], "full.1": shared[1], "own.0": torch.randn(NUM_BLOCKS, 8, 16)}
    caches |= {"swa.0": shared[0], "swa.1": shared[1]}
    return caches, [["full.0", "full.1"], ["own.0"], ["swa.0", "swa.1"]]


Setup = Callable[..., tuple[KVLayout, HostTier, TransferWorker]]


@pytest.fixture
def setup() -> Iterator[Setup]:
    """``setup(factor, lanes=2)``: the layout, a host tier of random bytes, a worker; the
    workers' threads are shut down after the test."""
    workers: list[TransferWorker] = []

    def make(factor: int, lanes: int = 2) -> tuple[KVLayout, HostTier, TransferWorker]:
        caches, groups = _engine()
        layout = build_layout(caches, groups, NUM_BLOCKS)
        host = HostTier(layout, NUM_CHUNKS, factor)
        memory = host.memory_np
        memory[:] = np.random.default_rng(factor).integers(0, 256, memory.shape, dtype=np.uint8)
        worker = TransferWorker()
        workers.append(worker)
        # stores on their thread: the threaded mode's ordering and shutdown are tested here
        store, load = engine_host_handlers(layout, host, lanes=lanes, inline_stores=False)
        worker.register_handler(Medium.ENGINE, Medium.CPU, store)
        worker.register_handler(Medium.CPU, Medium.ENGINE, load)
        return layout, host, worker

    yield make
    for worker in workers:
        worker.shutdown()


def _sub_block(host: HostTier, group: int, view: int, slot: int, sub: int) -> torch.Tensor:
    """The host page of ``view`` in ``slot``'s chunk of ``group``, as bytes."""
    return torch.from_numpy(host.page(group, view, slot, sub))


def _engine_page(layout: KVLayout, view: int, block: int) -> torch.Tensor:
    return layout.views[view][block].view(torch.uint8)


def _run(worker: TransferWorker, job_id: int, spec: tuple[EngineBlocks | HostChunks, ...]) -> int:
    assert worker.transfer_async(job_id, (spec[0], spec[1]))
    worker.wait([job_id])
    (result,) = worker.get_finished()
    assert result.job_id == job_id and result.success
    return result.bytes


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("factor", [1, 3])
def test_store_copies_every_block_and_nothing_else(factor: int, lanes: int, setup: Setup) -> None:
    layout, host, worker = setup(factor, lanes)
    case = EXPECTED[factor]
    before = host.memory_np.copy()
    nbytes = _run(worker, 1, (case["engine"], case["host"]))

    written = np.zeros(before.shape, dtype=bool)  # the host bytes the store wrote
    for (group, block), (slot, sub) in case["map"].items():
        for view in layout.groups[group]:
            page = _sub_block(host, group, view, slot, sub)
            assert torch.equal(page, _engine_page(layout, view, block))
            start = page.numpy().ctypes.data - host.memory_np[slot].ctypes.data
            written[slot, start : start + len(page)] = True
    assert (host.memory_np[~written] == before[~written]).all()  # nothing else
    assert nbytes == sum(
        layout.page_bytes[v] for (group, _), _ in case["map"].items() for v in layout.groups[group]
    )


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("factor", [1, 3])
def test_load_copies_every_block_and_nothing_else(factor: int, lanes: int, setup: Setup) -> None:
    layout, host, worker = setup(factor, lanes)
    case = EXPECTED[factor]
    before = [v.clone() for v in layout.views]
    nbytes = _run(worker, 2, (case["host"], case["engine"]))

    loaded: set[tuple[int, int]] = set()
    for (group, block), (slot, sub) in case["map"].items():
        for view in layout.groups[group]:
            assert torch.equal(_engine_page(layout, view, block),
                               _sub_block(host, group, view, slot, sub))  # fmt: skip
            loaded.add((view, block))
    for view, rows in enumerate(layout.views):
        for block in range(NUM_BLOCKS):
            if (view, block) not in loaded:
                assert torch.equal(rows[block], before[view][block])
    assert nbytes == sum(
        layout.page_bytes[v] for (group, _), _ in case["map"].items() for v in layout.groups[group]
    )


@pytest.mark.parametrize("lanes", LANES)
def test_round_trip_restores_the_engine_bytes(lanes: int, setup: Setup) -> None:
    layout, host, worker = setup(3, lanes)
    case = EXPECTED[3]
    original = [v.clone() for v in layout.views]
    _run(worker, 1, (case["engine"], case["host"]))
    for view in layout.views:
        view.zero_()
    _run(worker, 2, (case["host"], case["engine"]))
    for group, block in case["map"]:
        for v in layout.groups[group]:
            assert torch.equal(layout.views[v][block], original[v][block])


@pytest.mark.parametrize("lanes", LANES)
def test_jobs_of_one_direction_finish_in_submission_order(lanes: int, setup: Setup) -> None:
    """Big multi-piece stores and one-block stores interleaved: reported in submission order,
    each slot holding the last job's bytes; waiting for the last job waits for all."""
    layout, host, worker = setup(1, lanes)
    rng = np.random.default_rng(0)
    jobs = []
    for job_id in range(1, 21):
        n = 10 if job_id % 2 else 1
        blocks = rng.permutation(NUM_BLOCKS)[:n]
        slots = rng.permutation(NUM_CHUNKS)[:n]
        jobs.append((job_id, blocks, slots))
        engine = EngineBlocks(blocks, (n, 0, 0), (0, 0, 0))
        assert worker.transfer_async(job_id, (engine, HostChunks(slots)))
    worker.wait([20])
    assert [r.job_id for r in worker.get_finished()] == list(range(1, 21))
    assert worker.num_in_flight == 0
    last_block: dict[int, int] = {}
    for _, blocks, slots in jobs:
        last_block.update(zip(slots.tolist(), blocks.tolist()))
    for slot, block in last_block.items():
        for view in layout.groups[0]:
            page = _sub_block(host, 0, view, slot, 0)
            assert torch.equal(page, _engine_page(layout, view, block))


def test_a_load_has_finished_when_transfer_async_returns(setup: Setup) -> None:
    """Loads are synchronous: the bytes are in the engine blocks and the job is reported by the
    next get_finished, with no wait()."""
    layout, host, worker = setup(3)
    case = EXPECTED[3]
    assert worker.transfer_async(7, (case["host"], case["engine"]))
    for (group, block), (slot, sub) in case["map"].items():
        for view in layout.groups[group]:
            assert torch.equal(_engine_page(layout, view, block),
                               _sub_block(host, group, view, slot, sub))  # fmt: skip
    (result,) = worker.get_finished()
    assert result.job_id == 7 and result.success


def test_stores_run_off_the_caller_and_split_across_lanes(
    monkeypatch: pytest.MonkeyPatch, setup: Setup
) -> None:
    """A store returns before its copy and is copied on the store thread and its lane."""
    layout, host, worker = setup(1, lanes=2)
    release = threading.Event()
    threads: set[str] = set()
    original = copy_cpu.CpuCopyHandler._run_piece

    def recorded(self: copy_cpu.CpuCopyHandler, piece: Callable[[], None]) -> None:
        assert release.wait(10.0)  # held until the caller checked it was not waited for
        threads.add(threading.current_thread().name)
        original(self, piece)

    monkeypatch.setattr(copy_cpu.CpuCopyHandler, "_run_piece", recorded)
    engine = EngineBlocks(np.arange(10), (10, 0, 0), (0, 0, 0))
    assert worker.transfer_async(1, (engine, HostChunks(np.arange(10))))
    assert worker.get_finished() == []  # still held: the store did not run on this thread
    release.set()
    worker.wait([1])
    (result,) = worker.get_finished()
    assert result.success
    assert threading.current_thread().name not in threads
    assert threads <= {"kvtier-store_0", "kvtier-store-lane1"}


def test_after_shutdown_stores_are_refused_and_loads_still_copy(setup: Setup) -> None:
    """vLLM may shut the connector down under a running engine (another engine's late teardown):
    nothing waits for threads that are gone."""
    layout, host, worker = setup(3, lanes=2)
    case = EXPECTED[3]
    worker.shutdown()
    with pytest.raises(RuntimeError):  # the worker connector counts it as a failed store
        worker.transfer_async(1, (case["engine"], case["host"]))
    assert worker.transfer_async(2, (case["host"], case["engine"]))  # inline, on this thread
    (result,) = worker.get_finished()
    assert result.job_id == 2 and result.success


def test_a_shutdown_on_the_store_thread_does_not_join_itself(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The garbage collector may run an engine's finalizer, and so this shutdown, on any thread."""
    layout, host, worker = setup(1, lanes=2)
    original = copy_cpu.CpuCopyHandler._copy

    def shut_down_first(self: copy_cpu.CpuCopyHandler, batch: RowBatch, total: int) -> None:
        self.shutdown()
        original(self, batch, total)

    monkeypatch.setattr(copy_cpu.CpuCopyHandler, "_copy", shut_down_first)
    engine = EngineBlocks(np.arange(4), (4, 0, 0), (0, 0, 0))
    assert worker.transfer_async(1, (engine, HostChunks(np.arange(4))))
    worker.wait([1])
    (result,) = worker.get_finished()
    assert result.success


def test_lanes_follow_the_cores_this_thread_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM binds a rank's threads to cores; the handlers' threads inherit that mask."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert handlers.copy_lanes() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert handlers.copy_lanes() == handlers.MAX_COPY_LANES


def test_bad_specs_are_refused_without_copying(setup: Setup) -> None:
    layout, host, worker = setup(3)
    before = host.memory_np.copy()
    engine = EngineBlocks(np.array([0, 1, 2]), (3, 0, 0), (0, 0, 0))
    assert not worker.transfer_async(1, (engine, HostChunks(np.array([0, 1]))))  # 1 chunk spanned
    assert not worker.transfer_async(2, (engine, HostChunks(np.array([NUM_CHUNKS]))))  # no slot
    bad_block = EngineBlocks(np.array([0, 1, NUM_BLOCKS]), (3, 0, 0), (0, 0, 0))
    assert not worker.transfer_async(3, (bad_block, HostChunks(np.array([0]))))
    uneven = EngineBlocks(np.array([0, 1]), (3, 0, 0), (0, 0, 0))
    assert not worker.transfer_async(4, (uneven, HostChunks(np.array([0]))))
    assert worker.get_finished() == []
    assert (host.memory_np == before).all()
    with pytest.raises(ValueError, match="no handler for cpu -> cpu"):
        worker.transfer_async(5, (HostChunks(np.array([0])), HostChunks(np.array([1]))))


def test_cpu_stores_copy_inline_by_default() -> None:
    """The default CPU store has copied when transfer_async returns (beside the next forward, a
    threaded store slowed it more than the copy costs)."""
    caches, groups = _engine()
    layout = build_layout(caches, groups, NUM_BLOCKS)
    host = HostTier(layout, NUM_CHUNKS, 1)
    store, load = engine_host_handlers(layout, host, lanes=2)
    engine = EngineBlocks(np.arange(4), (4, 0, 0), (0, 0, 0))
    assert store.transfer_async(1, engine, HostChunks(np.arange(4)))
    (result,) = store.get_finished()
    assert result.success
    for view in layout.groups[0]:
        for block in range(4):
            page = _sub_block(host, 0, view, block, 0)
            assert torch.equal(page, _engine_page(layout, view, block))
    store.shutdown()
    load.shutdown()

"""Byte-exact engine <-> host transfers on CPU tensors, several groups, unaligned chunks.

Layout: groups 0 and 2 alias the same two layer buffers (as vLLM 0.32's hybrid models), group 1
has its own. One transfer: group 0 aligned (2 whole chunks), group 1 empty, group 2 starting one
block into a chunk and ending one block before a chunk's end (trimmed at both ends for factor 3).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvtier.addresses import EngineBlocks, HostChunks
from kvtier.layout import KVLayout, build_layout
from kvtier.media import Medium
from kvtier.tiers.cpu import HostTier
from kvtier.worker import TransferWorker, engine_host_handlers

NUM_BLOCKS, NUM_CHUNKS = 24, 10

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


def _setup(factor: int) -> tuple[KVLayout, HostTier, TransferWorker]:
    caches, groups = _engine()
    layout = build_layout(caches, groups, NUM_BLOCKS)
    host = HostTier(layout, NUM_CHUNKS, factor)
    for buffer in host.buffers:
        buffer.copy_(torch.randint(-(2**62), 2**62, buffer.shape))
    worker = TransferWorker()
    store, load = engine_host_handlers(layout, host)
    worker.register_handler(Medium.ENGINE, Medium.CPU, store)
    worker.register_handler(Medium.CPU, Medium.ENGINE, load)
    return layout, host, worker


def _sub_block(host: HostTier, view: int, slot: int, sub: int) -> torch.Tensor:
    return host.page_rows(view)[slot * host.block_size_factor + sub]


def _run(worker: TransferWorker, job_id: int, spec: tuple[EngineBlocks | HostChunks, ...]) -> int:
    assert worker.transfer_async(job_id, (spec[0], spec[1]))
    worker.wait([job_id])
    (result,) = worker.get_finished()
    assert result.job_id == job_id and result.success
    return result.bytes


@pytest.mark.parametrize("factor", [1, 3])
def test_store_copies_every_block_and_nothing_else(factor: int) -> None:
    layout, host, worker = _setup(factor)
    case = EXPECTED[factor]
    before = [b.clone() for b in host.buffers]
    nbytes = _run(worker, 1, (case["engine"], case["host"]))

    written: set[tuple[int, int, int]] = set()
    for (group, block), (slot, sub) in case["map"].items():
        for view in layout.groups[group]:
            assert torch.equal(_sub_block(host, view, slot, sub), layout.views[view][block])
            written.add((view, slot, sub))
    for view in range(len(layout.views)):
        for slot in range(NUM_CHUNKS):
            for sub in range(factor):
                if (view, slot, sub) not in written:
                    rows = before[view].view(NUM_CHUNKS * factor, -1)
                    assert torch.equal(_sub_block(host, view, slot, sub), rows[slot * factor + sub])
    assert nbytes == sum(
        layout.page_bytes[v] for (group, _), _ in case["map"].items() for v in layout.groups[group]
    )


@pytest.mark.parametrize("factor", [1, 3])
def test_load_copies_every_block_and_nothing_else(factor: int) -> None:
    layout, host, worker = _setup(factor)
    case = EXPECTED[factor]
    before = [v.clone() for v in layout.views]
    nbytes = _run(worker, 2, (case["host"], case["engine"]))

    loaded: set[tuple[int, int]] = set()
    for (group, block), (slot, sub) in case["map"].items():
        for view in layout.groups[group]:
            assert torch.equal(layout.views[view][block], _sub_block(host, view, slot, sub))
            loaded.add((view, block))
    for view, rows in enumerate(layout.views):
        for block in range(NUM_BLOCKS):
            if (view, block) not in loaded:
                assert torch.equal(rows[block], before[view][block])
    assert nbytes == sum(
        layout.page_bytes[v] for (group, _), _ in case["map"].items() for v in layout.groups[group]
    )


def test_round_trip_restores_the_engine_bytes() -> None:
    layout, host, worker = _setup(3)
    case = EXPECTED[3]
    original = [v.clone() for v in layout.views]
    _run(worker, 1, (case["engine"], case["host"]))
    for view in layout.views:
        view.zero_()
    _run(worker, 2, (case["host"], case["engine"]))
    for group, block in case["map"]:
        for v in layout.groups[group]:
            assert torch.equal(layout.views[v][block], original[v][block])


def test_jobs_of_one_direction_finish_in_submission_order() -> None:
    layout, host, worker = _setup(1)
    big = EngineBlocks(np.arange(10), (10, 0, 0), (0, 0, 0))
    small = EngineBlocks(np.array([20]), (1, 0, 0), (0, 0, 0))
    assert worker.transfer_async(1, (big, HostChunks(np.arange(10))))
    assert worker.transfer_async(2, (small, HostChunks(np.array([0]))))
    worker.wait([1, 2])
    assert [r.job_id for r in worker.get_finished()] == [1, 2]
    assert worker.num_in_flight == 0


def test_bad_specs_are_refused_without_copying() -> None:
    layout, host, worker = _setup(3)
    before = [b.clone() for b in host.buffers]
    engine = EngineBlocks(np.array([0, 1, 2]), (3, 0, 0), (0, 0, 0))
    assert not worker.transfer_async(1, (engine, HostChunks(np.array([0, 1]))))  # 1 chunk spanned
    assert not worker.transfer_async(2, (engine, HostChunks(np.array([NUM_CHUNKS]))))  # no slot
    bad_block = EngineBlocks(np.array([0, 1, NUM_BLOCKS]), (3, 0, 0), (0, 0, 0))
    assert not worker.transfer_async(3, (bad_block, HostChunks(np.array([0]))))
    uneven = EngineBlocks(np.array([0, 1]), (3, 0, 0), (0, 0, 0))
    assert not worker.transfer_async(4, (uneven, HostChunks(np.array([0]))))
    assert worker.get_finished() == []
    assert all(torch.equal(a, b) for a, b in zip(before, host.buffers))
    with pytest.raises(ValueError, match="no handler for cpu -> cpu"):
        worker.transfer_async(5, (HostChunks(np.array([0])), HostChunks(np.array([1]))))

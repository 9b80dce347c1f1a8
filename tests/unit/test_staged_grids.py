"""The ``dma`` mechanism on grids (``kvtier/pages/staged_grids.py``): what it plans, on the CPU.

A job's grids staged in batches of host records: the grid kernel between the engine and the
staging area, over tables of ``V + K`` entries a grid, and the copy engine between the staging
area and host memory, a copy per run of host bytes. Checked here without running a kernel: the
staged grids and their copies together say exactly the engine pages <-> host bytes of the grids
given (``grid.addresses``, the kernel's reference), for every KV layout, on scattered blocks and
slots with partial first and last chunks; batches stay in the staging area; copies are few and
cross no pinned piece. The kernels moving bytes under Triton's interpreter:
``test_kernels_on_cpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kv_layouts import LAYOUTS

from kvtier.addresses import EngineBlocks, HostChunks
from kvtier.layout import KVLayout, build_layout
from kvtier.pages import grid
from kvtier.pages.grid import PageGrid
from kvtier.pages.staged_grids import StagedBatch, staged_batches
from kvtier.tiers.base.chunk_plan import plan_copy
from kvtier.tiers.host.buffers import HostTier

CPU = torch.device("cpu")
PIECE = 3 * 4096


def _job(name: str, seed: int = 0) -> tuple[KVLayout, HostTier, list[PageGrid]]:
    """``round_trip``'s job (``kv_layouts.py``): scattered blocks into scattered slots, its
    first and last chunks partial, per group."""
    caches, groups, num_blocks = LAYOUTS[name](CPU)
    layout = build_layout(caches, groups, num_blocks)
    factor = 1 if name == "mla" else 4
    host = HostTier(layout, 12, factor)
    sizes, starts = ((9, 3), (2, 5)) if len(groups) == 2 else ((9,), (2,))
    spans = [-(-(n + s % factor) // factor) for n, s in zip(sizes, starts, strict=True)]
    rng = np.random.default_rng(seed)
    blocks = rng.permutation(num_blocks)[: sum(sizes)].astype(np.int64)
    slots = HostChunks(rng.permutation(12)[: sum(spans)].astype(np.int64))
    plan = plan_copy(EngineBlocks(blocks, sizes, starts), slots, factor)
    return layout, host, [host.page_grid(c.group, c.block_ids, c.host_rows) for c in plan]


def _pages(grids: list[PageGrid], layout: KVLayout, host: int) -> set[tuple[int, int, int]]:
    """Every (engine address, host address, bytes) ``grids`` say, as the grid kernel does."""
    found = grid.tables(grids, grid.view_table(layout.views), host)
    assert found is not None
    pages: set[tuple[int, int, int]] = set()
    for index in range(len(grids)):
        engine, hosted, size = grid.addresses(*found.of(index), host)
        pages |= set(zip(engine.tolist(), hosted.tolist(), size.tolist(), strict=True))
    return pages


def _through_staging(batch: StagedBatch, layout: KVLayout) -> set[tuple[int, int, int]]:
    """Every (engine address, host offset, bytes) a batch moves: its grids' pages in the
    staging area (from 0), each taken to host memory by the copies that cover it (two where
    a pinned piece of host memory ends inside the page), all at one offset."""
    at, staged, size = batch.copies.T
    moved = set()
    for engine, where, nbytes in _pages(batch.grids, layout, 0):
        over = np.flatnonzero((staged < where + nbytes) & (where < staged + size))
        covered = np.minimum(staged + size, where + nbytes) - np.maximum(staged, where)
        assert covered[over].sum() == nbytes
        (delta,) = set((at - staged)[over].tolist())
        moved.add((engine, where + delta, nbytes))
    return moved


@pytest.mark.parametrize("piece", [0, PIECE], ids=["whole", "pieces"])
@pytest.mark.parametrize("stage_bytes", [64 << 20, PIECE], ids=["one-batch", "batches"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_staged_grids_move_exactly_the_pages_of_the_grids(
    name: str, stage_bytes: int, piece: int
) -> None:
    layout, host, grids = _job(name)
    page_bytes = np.array(layout.page_bytes, dtype=np.int64)
    batches = staged_batches(grids, page_bytes, stage_bytes, piece)
    moved = [page for batch in batches for page in _through_staging(batch, layout)]
    assert len(moved) == len(set(moved))  # no page twice
    assert set(moved) == _pages(grids, layout, 0)
    for batch in batches:
        assert batch.grids and len(batch.copies)  # no empty batch
        at, staged, size = batch.copies.T
        assert (staged + size).max() <= batch.nbytes
        assert batch.nbytes <= stage_bytes or len({int(a) // host.record_bytes for a in at}) == 1
        assert size.sum() == sum(int(page_bytes[g.views].sum()) * len(g.blocks)
                                 for g in batch.grids)  # only the pages: holes stay  # fmt: skip
        if piece:
            assert (at // piece == (at + size - 1) // piece).all()
        order = np.argsort(staged)  # no two copies overlap in the staging area
        assert (staged[order][1:] >= (staged + size)[order][:-1]).all()


def _flash(blocks: int = 32) -> tuple[KVLayout, HostTier]:
    backing = torch.zeros(2, 2, blocks, 16, 2, 64, dtype=torch.bfloat16)  # 4 views, 4 KiB pages
    caches = {f"l{i}": backing[i] for i in range(2)}
    layout = build_layout(caches, [list(caches)], blocks)
    return layout, HostTier(layout, 16, 4)


def test_whole_chunks_are_a_copy_each_and_consecutive_slots_one() -> None:
    layout, host = _flash()
    page_bytes = np.array(layout.page_bytes, dtype=np.int64)
    record = host.record_bytes  # 4 views x 4 pages of 4 KiB
    scattered = np.concatenate([np.arange(4) + 4 * s for s in (9, 2, 14)])
    (batch,) = staged_batches([host.page_grid(0, np.arange(12), scattered)], page_bytes, 1 << 30)
    assert batch.copies.tolist() == [[s * record, i * record, record]
                                     for i, s in enumerate((2, 9, 14))]  # fmt: skip
    assert batch.grids[0].at.tolist() == np.repeat([0, record, 2 * record], 4).tolist()
    consecutive = np.arange(20, 32)  # slots 5, 6, 7
    (batch,) = staged_batches([host.page_grid(0, np.arange(12), consecutive)], page_bytes, 1 << 30)
    assert batch.copies.tolist() == [[5 * record, 0, 3 * record]]


def test_a_batch_holds_what_the_staging_area_holds_and_joins_no_copy_across_batches() -> None:
    layout, host = _flash()
    page_bytes = np.array(layout.page_bytes, dtype=np.int64)
    record = host.record_bytes
    rows = np.arange(4 * 7)  # seven whole chunks in slots 0..6
    batches = staged_batches([host.page_grid(0, np.arange(28), rows)], page_bytes, 3 * record)
    assert [b.nbytes for b in batches] == [3 * record, 3 * record, record]
    assert [b.copies.tolist() for b in batches] == [[[0, 0, 3 * record]],
                                                    [[3 * record, 0, 3 * record]],
                                                    [[6 * record, 0, record]]]  # fmt: skip
    assert [len(b.grids[0].blocks) for b in batches] == [12, 12, 4]


def test_a_partial_chunk_is_a_copy_per_view_of_its_pages_only() -> None:
    layout, host = _flash()
    page_bytes = np.array(layout.page_bytes, dtype=np.int64)
    page = int(page_bytes[0])
    # sub-blocks 1 and 2 of slot 3: two pages of each of the four views, a hole around them
    (batch,) = staged_batches([host.page_grid(0, np.array([5, 6]), np.array([13, 14]))],
                              page_bytes, 1 << 30)  # fmt: skip
    at, staged, size = batch.copies.T
    view_bytes = 4 * page
    assert at.tolist() == [3 * host.record_bytes + v * view_bytes + page for v in range(4)]
    assert size.tolist() == [2 * page] * 4
    assert staged.tolist() == [v * view_bytes + page for v in range(4)]


def test_a_record_larger_than_the_staging_area_is_a_batch_of_its_own() -> None:
    layout, host = _flash()
    page_bytes = np.array(layout.page_bytes, dtype=np.int64)
    batches = staged_batches([host.page_grid(0, np.arange(8), np.arange(8))], page_bytes, 4096)
    assert [b.nbytes for b in batches] == [host.record_bytes] * 2


def test_no_grid_or_no_block_is_no_batch() -> None:
    layout, host = _flash()
    page_bytes = np.array(layout.page_bytes, dtype=np.int64)
    empty = host.page_grid(0, np.empty(0, np.int64), np.empty(0, np.int64))
    assert staged_batches([], page_bytes, 1 << 20) == []
    assert staged_batches([empty], page_bytes, 1 << 20) == []

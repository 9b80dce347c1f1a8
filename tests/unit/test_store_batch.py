"""A step's stores submitted together (``transfer_batch``): the bytes land as if each job had
been copied alone, a bad job is refused alone, a failed batch copy fails only the jobs that fail
alone; the batch's plan (``row_batch.py``) maps every block as ``plan_copy`` does."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from kvtier.addresses import EngineBlocks, HostChunks
from kvtier.layout import KVLayout, build_layout
from kvtier.media import Medium
from kvtier.tiers.base.chunk_plan import chunks_spanned, plan_copy
from kvtier.tiers.base.handler import Transfer
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.io import copy_cpu, engine_host_handlers
from kvtier.tiers.host.io.row_batch import RowBatch, plan_rows
from kvtier.worker import TransferWorker

NUM_BLOCKS, NUM_CHUNKS, FACTOR = 32, 12, 2


def _layout() -> KVLayout:
    torch.manual_seed(1)
    caches = {"a.0": torch.randn(NUM_BLOCKS, 4, 8), "a.1": torch.randn(NUM_BLOCKS, 4, 8)}
    caches |= {"b.0": torch.randn(NUM_BLOCKS, 2, 8)}
    return build_layout(caches, [["a.0", "a.1"], ["b.0"]], NUM_BLOCKS)


@pytest.fixture
def inline() -> Iterator[tuple[KVLayout, HostTier, TransferWorker]]:
    """The default CPU handlers (stores inline), host rows zeroed."""
    layout = _layout()
    host = HostTier(layout, NUM_CHUNKS, FACTOR)
    host.memory_np[:] = 0
    worker = TransferWorker()
    store, load = engine_host_handlers(layout, host, lanes=2)
    worker.register_handler(Medium.ENGINE, Medium.CPU, store)
    worker.register_handler(Medium.CPU, Medium.ENGINE, load)
    yield layout, host, worker
    worker.shutdown()


def _store(job_id: int, blocks: list[int], slots: list[int], group: int = 0) -> Transfer:
    sizes = (len(blocks), 0) if group == 0 else (0, len(blocks))
    engine = EngineBlocks(np.array(blocks, dtype=np.int64), sizes, (0, 0))
    return Transfer(job_id, engine, HostChunks(np.array(slots, dtype=np.int64)))


# one-chunk stores of many requests into consecutive slots, one out of order, one of group 1
BATCH = [
    _store(1, [3, 4], [0]),
    _store(2, [9, 1], [1]),
    _store(3, [20, 21, 22, 23], [2, 3]),
    _store(4, [7, 8], [9]),
    _store(5, [30, 31], [4], group=1),
]


def _pages(host: HostTier, layout: KVLayout, slot: int, subs: range) -> torch.Tensor:
    """The pages of view 0 (group 0) in ``slot``'s sub-blocks ``subs``, typed as the engine's."""
    return torch.stack([torch.from_numpy(host.page(0, 0, slot, sub)) for sub in subs]).view(
        layout.views[0].dtype
    )


def _host_after(transfers: list[Transfer], batched: bool) -> np.ndarray:
    layout = _layout()
    host = HostTier(layout, NUM_CHUNKS, FACTOR)
    host.memory_np[:] = 0
    store, load = engine_host_handlers(layout, host, lanes=2)
    if batched:
        assert store.transfer_batch(transfers) == [True] * len(transfers)
    else:
        assert all(store.transfer_async(*transfer) for transfer in transfers)
    assert all(result.success for result in store.get_finished())
    store.shutdown()
    load.shutdown()
    return host.memory_np.copy()


def test_a_batch_copies_the_bytes_each_job_copies_alone() -> None:
    alone, together = _host_after(BATCH, batched=False), _host_after(BATCH, batched=True)
    assert together.any()
    assert (alone == together).all()


def test_each_job_of_a_batch_is_reported_with_its_bytes(
    inline: tuple[KVLayout, HostTier, TransferWorker],
) -> None:
    layout, _, worker = inline
    assert worker.transfer_batch(BATCH) == [True] * len(BATCH)
    results = {result.job_id: result for result in worker.get_finished()}
    assert sorted(results) == [1, 2, 3, 4, 5]
    group_bytes = [sum(layout.page_bytes[v] for v in views) for views in layout.groups]
    for transfer in BATCH:
        engine = transfer.src
        assert isinstance(engine, EngineBlocks)
        expected = sum(n * group_bytes[g] for g, n in enumerate(engine.group_sizes))
        assert results[transfer.job_id].success
        assert results[transfer.job_id].bytes == expected
    assert worker.num_in_flight == 0


def test_a_bad_job_is_refused_alone(inline: tuple[KVLayout, HostTier, TransferWorker]) -> None:
    layout, host, worker = inline
    bad = _store(7, [NUM_BLOCKS, 1], [5])  # a block id past the engine's
    assert worker.transfer_batch([BATCH[0], bad, BATCH[1]]) == [True, False, True]
    assert sorted(r.job_id for r in worker.get_finished()) == [1, 2]
    assert torch.equal(_pages(host, layout, 0, range(2)), layout.views[0][[3, 4]])
    assert not host.memory_np[5].any()  # slot 5: untouched


def test_a_failed_batch_copy_fails_only_the_job_that_fails_alone(
    inline: tuple[KVLayout, HostTier, TransferWorker], monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, host, worker = inline
    copy = copy_cpu.CpuCopyHandler._copy

    def fail_on_block_9(self: copy_cpu.CpuCopyHandler, batch: RowBatch, total: int) -> None:
        if any(9 in ids for ids in batch.ids):  # job 2's block: the joined copy, then job 2
            raise RuntimeError("a copy fails")
        copy(self, batch, total)

    monkeypatch.setattr(copy_cpu.CpuCopyHandler, "_copy", fail_on_block_9)
    assert worker.transfer_batch(BATCH) == [True] * len(BATCH)
    outcomes = {result.job_id: result.success for result in worker.get_finished()}
    assert outcomes == {1: True, 2: False, 3: True, 4: True, 5: True}
    assert torch.equal(
        torch.cat([_pages(host, layout, slot, range(2)) for slot in (2, 3)]),
        layout.views[0][[20, 21, 22, 23]],
    )


@pytest.mark.parametrize("inline_stores", [True, False])
def test_transfers_of_one_job_id_are_its_parts_copied_and_reported_once(
    inline_stores: bool,
) -> None:
    """A step's stores are one job of several parts (one per request's run, one per tail):
    every part's bytes land, the job is reported once with all their bytes, on the inline path
    as on the job thread's; a part refused refuses its job, not the others."""
    layout = _layout()
    host = HostTier(layout, NUM_CHUNKS, FACTOR)
    host.memory_np[:] = 0
    worker = TransferWorker()
    store, load = engine_host_handlers(layout, host, lanes=2, inline_stores=inline_stores)
    worker.register_handler(Medium.ENGINE, Medium.CPU, store)
    worker.register_handler(Medium.CPU, Medium.ENGINE, load)
    parts = [_store(9, [3, 4], [0]), _store(9, [9, 1], [1]), _store(9, [30, 31], [4], group=1)]
    refused = [_store(8, [7, 8], [9]), _store(8, [NUM_BLOCKS, 1], [5])]  # its second part: bad
    assert worker.transfer_batch([*parts, *refused]) == [True, True, True, False, False]
    worker.wait([9])
    (result,) = worker.get_finished()
    group_bytes = [sum(layout.page_bytes[v] for v in views) for views in layout.groups]
    assert result.job_id == 9 and result.success
    assert result.bytes == 4 * group_bytes[0] + 2 * group_bytes[1]
    pages = torch.cat([_pages(host, layout, slot, range(2)) for slot in (0, 1)])
    assert torch.equal(pages, layout.views[0][[3, 4, 9, 1]])
    assert not host.memory_np[9].any()  # job 8's first part (slot 9): not copied
    assert worker.num_in_flight == 0
    worker.shutdown()


@pytest.mark.parametrize("factor", [1, 2, 3])
def test_plan_rows_maps_blocks_as_plan_copy_does(factor: int) -> None:
    rng = np.random.default_rng(factor)
    for _ in range(200):
        sizes = tuple(int(n) for n in rng.integers(0, 7, size=3))
        starts = tuple(int(i) for i in rng.integers(0, 9, size=3))
        spans = sum(chunks_spanned(n, i, factor) for n, i in zip(sizes, starts, strict=True))
        engine = EngineBlocks(rng.permutation(64)[: sum(sizes)].astype(np.int64), sizes, starts)
        host = HostChunks(rng.permutation(40)[:spans].astype(np.int64))
        expected = [
            (copy.group, copy.block_ids.tolist(), copy.host_rows.tolist())
            for copy in plan_copy(engine, host, factor)
        ]
        assert plan_rows(engine, host, factor, 3) == expected


REFUSED = [
    (EngineBlocks(np.array([0, 1, 2]), (3, 0, 0), (0, 0, 0)), [0, 1]),  # 3 blocks: 1 chunk
    (EngineBlocks(np.array([0, 1]), (3, 0, 0), (0, 0, 0)), [0]),  # fewer ids than sizes say
    (EngineBlocks(np.array([0]), (1, 0), (0, 0, 0)), [0]),  # sizes and indices disagree
]


@pytest.mark.parametrize(("engine", "slots"), REFUSED)
def test_plan_rows_refuses_what_plan_copy_refuses(engine: EngineBlocks, slots: list[int]) -> None:
    host = HostChunks(np.array(slots))
    with pytest.raises(ValueError) as expected:
        plan_copy(engine, host, 3)
    with pytest.raises(ValueError) as refused:
        plan_rows(engine, host, 3, 3)
    assert str(refused.value) == str(expected.value)
    too_many = EngineBlocks(np.array([0]), (1, 0, 0, 0), (0, 0, 0, 0))
    with pytest.raises(ValueError, match="4 groups in a transfer, the layout has 3"):
        plan_rows(too_many, HostChunks(np.array([0])), 3, 3)


def test_a_batch_knows_whether_its_ids_and_rows_are_in_range() -> None:
    batch = RowBatch([np.arange(12), np.arange(3) + 20], [np.arange(12) + 100, np.array([0, 5])])
    assert batch.within(23, 112) and not batch.within(22, 112) and not batch.within(23, 111)


def test_a_batch_with_an_unknown_medium_submits_nothing(
    inline: tuple[KVLayout, HostTier, TransferWorker],
) -> None:
    _, host, worker = inline
    foreign = Transfer(8, HostChunks(np.array([0])), HostChunks(np.array([1])))
    with pytest.raises(ValueError, match="no handler for cpu -> cpu"):
        worker.transfer_batch([BATCH[0], foreign])
    assert worker.num_in_flight == 0 and worker.get_finished() == []
    assert not host.memory_np.any()
    assert worker.transfer_batch([BATCH[0]]) == [True]
    with pytest.raises(ValueError, match="job 1 is already in flight"):
        worker.transfer_batch([BATCH[0]])

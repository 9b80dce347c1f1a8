"""CUDA engine tensors: pinned host tier, stream copies, byte-exact both ways (needs CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvtier.addresses import EngineBlocks, HostChunks
from kvtier.layout import build_layout
from kvtier.media import Medium
from kvtier.tiers.cpu import HostTier
from kvtier.worker import TransferWorker, engine_host_handlers

pytestmark = pytest.mark.gpu

NUM_BLOCKS, FACTOR = 40, 3


def _setup() -> tuple[dict[str, torch.Tensor], HostTier, TransferWorker]:
    torch.manual_seed(0)
    # FlashAttention layout: (2, num_blocks, block_size, kv_heads, head_size); two groups aliasing
    shared = [torch.randn(2, NUM_BLOCKS, 16, 2, 64, device="cuda", dtype=torch.bfloat16)]
    caches = {"full.0": shared[0], "swa.0": shared[0]}
    layout = build_layout(caches, [["full.0"], ["swa.0"]], NUM_BLOCKS)
    host = HostTier(layout, 8, FACTOR)
    worker = TransferWorker()
    store, load = engine_host_handlers(layout, host)
    worker.register_handler(Medium.ENGINE, Medium.CPU, store)
    worker.register_handler(Medium.CPU, Medium.ENGINE, load)
    return caches, host, worker


def _finish(worker: TransferWorker, job_id: int) -> int:
    worker.wait([job_id])
    finished = []
    while not finished:  # the event is complete; get_finished reports it on this poll
        finished = worker.get_finished()
    (result,) = finished
    assert result.job_id == job_id and result.success
    return result.bytes


def test_host_tier_is_pinned_and_views_split_k_v() -> None:
    caches, host, _ = _setup()
    assert len(host.buffers) == 2  # K and V
    assert all(buffer.is_pinned() for buffer in host.buffers)


def test_store_then_load_is_byte_exact_on_the_engine_device() -> None:
    caches, host, worker = _setup()
    kv = caches["full.0"]
    # group 0: 6 blocks aligned; group 1: 4 blocks starting 1 into a chunk (trimmed both ends)
    engine = EngineBlocks(np.array([0, 1, 2, 3, 4, 5, 20, 21, 22, 23]), (6, 4), (0, 4))
    slots = HostChunks(np.array([7, 2, 5, 0]))
    assert worker.transfer_async(1, (engine, slots))
    page = 16 * 2 * 64 * 2
    assert _finish(worker, 1) == 10 * 2 * page
    k_rows = host.page_rows(0).view(torch.uint8)
    expected = {0: (7, 0), 1: (7, 1), 2: (7, 2), 3: (2, 0), 20: (5, 1), 23: (0, 1)}
    for block, (slot, sub) in expected.items():
        row = k_rows[slot * FACTOR + sub]
        assert torch.equal(row, kv[0, block].contiguous().view(torch.uint8).flatten().cpu())

    original = kv.clone()
    kv.zero_()
    assert worker.transfer_async(2, (slots, engine))
    _finish(worker, 2)
    assert kv.device.type == "cuda"
    moved = engine.block_ids.tolist()
    assert torch.equal(kv[:, moved], original[:, moved])
    untouched = [b for b in range(NUM_BLOCKS) if b not in moved]
    assert not kv[:, untouched].any()


def test_jobs_of_one_direction_finish_in_order() -> None:
    _, _, worker = _setup()
    for job_id in range(1, 6):
        engine = EngineBlocks(np.array([job_id]), (1, 0), (0, 0))
        assert worker.transfer_async(job_id, (engine, HostChunks(np.array([job_id]))))
    worker.wait(range(1, 6))
    order: list[int] = []
    while len(order) < 5:
        order += [r.job_id for r in worker.get_finished()]
    assert order == [1, 2, 3, 4, 5]

"""CUDA engine tensors: pinned host tier, staged stream copies, byte-exact both ways (needs CUDA).

Each scenario runs through both host paths of ``copy_cuda.py``: ``staged`` (one device <-> host
copy per batch through the pinned staging buffer, then a CPU copy into the tier's rows) and
``direct`` (one copy per segment straight into the tier's rows), and with a staging area smaller
than a job (several batches reusing it).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from kvtier.addresses import EngineBlocks, HostChunks
from kvtier.layout import build_layout
from kvtier.media import Medium
from kvtier.tiers.host.buffers import HostTier
from kvtier.worker import TransferWorker, engine_host_handlers
from kvtier.worker.copy_cuda import Batch, CudaCopyHandler

pytestmark = pytest.mark.gpu

NUM_BLOCKS, FACTOR = 40, 3
PAGE = 16 * 2 * 64 * 2  # bytes of one block's K (or V): block_size 16, 2 heads, head_dim 64, bf16
PATHS = {
    "staged": {"direct_min_bytes": 1 << 30},
    "direct": {"direct_min_bytes": 0},
    "staged-small-area": {"direct_min_bytes": 1 << 30, "stage_bytes": 3 * PAGE},
    "direct-small-area": {"direct_min_bytes": 0, "stage_bytes": 3 * PAGE},
}


def _setup(
    path: str | None = None,
) -> tuple[dict[str, torch.Tensor], HostTier, TransferWorker]:
    torch.manual_seed(0)
    # FlashAttention layout: (2, num_blocks, block_size, kv_heads, head_size); two groups aliasing
    shared = [torch.randn(2, NUM_BLOCKS, 16, 2, 64, device="cuda", dtype=torch.bfloat16)]
    caches = {"full.0": shared[0], "swa.0": shared[0]}
    layout = build_layout(caches, [["full.0"], ["swa.0"]], NUM_BLOCKS)
    host = HostTier(layout, 8, FACTOR)
    worker = TransferWorker()
    if path is None:
        store, load = engine_host_handlers(layout, host)
    else:
        options = PATHS[path]
        store = CudaCopyHandler(layout, host, store=True, **options)
        load = CudaCopyHandler(layout, host, store=False, **options)
    worker.register_handler(Medium.ENGINE, Medium.CPU, store)
    worker.register_handler(Medium.CPU, Medium.ENGINE, load)
    return caches, host, worker


def _finish(worker: TransferWorker, job_id: int) -> int:
    worker.wait([job_id])
    (result,) = worker.get_finished()  # wait() returns once the job is recorded
    assert result.job_id == job_id and result.success
    return result.bytes


def test_host_tier_is_pinned_and_views_split_k_v() -> None:
    caches, host, _ = _setup()
    assert len(host.buffers) == 2  # K and V
    assert all(buffer.is_pinned() for buffer in host.buffers)


@pytest.mark.parametrize("path", list(PATHS))
def test_store_then_load_is_byte_exact_on_the_engine_device(path: str) -> None:
    caches, host, worker = _setup(path)
    kv = caches["full.0"]
    # group 0: 6 blocks aligned; group 1: 4 blocks starting 1 into a chunk (trimmed both ends)
    engine = EngineBlocks(np.array([0, 1, 2, 3, 4, 5, 20, 21, 22, 23]), (6, 4), (0, 4))
    slots = HostChunks(np.array([7, 2, 5, 0]))
    assert worker.transfer_async(1, (engine, slots))
    assert _finish(worker, 1) == 10 * 2 * PAGE
    k_rows = host.page_rows(0).view(torch.uint8)
    v_rows = host.page_rows(1).view(torch.uint8)
    expected = {0: (7, 0), 1: (7, 1), 2: (7, 2), 3: (2, 0), 20: (5, 1), 23: (0, 1)}
    for block, (slot, sub) in expected.items():
        row = slot * FACTOR + sub
        assert torch.equal(k_rows[row], kv[0, block].contiguous().view(torch.uint8).flatten().cpu())
        assert torch.equal(v_rows[row], kv[1, block].contiguous().view(torch.uint8).flatten().cpu())

    original = kv.clone()
    kv.zero_()
    assert worker.transfer_async(2, (slots, engine))
    # a load has finished when transfer_async returns: no wait, and reported at once
    moved = engine.block_ids.tolist()
    assert torch.equal(kv[:, moved], original[:, moved])
    (result,) = worker.get_finished()
    assert result.job_id == 2 and result.success
    assert kv.device.type == "cuda"
    untouched = [b for b in range(NUM_BLOCKS) if b not in moved]
    assert not kv[:, untouched].any()


@pytest.mark.parametrize("path", ["staged", "direct"])
def test_a_store_reads_what_the_engine_wrote_before_it(path: str) -> None:
    """The store waits for the engine's stream as it was at submission."""
    caches, host, worker = _setup(path)
    kv = caches["full.0"]
    # the engine's stream is busy for a while, then writes the block
    torch.cuda._sleep(50_000_000)  # type: ignore[no-untyped-call]
    kv[:, 3].fill_(7)
    engine = EngineBlocks(np.array([3]), (1, 0), (0, 0))
    assert worker.transfer_async(1, (engine, HostChunks(np.array([4]))))
    _finish(worker, 1)
    row = host.page_rows(0).view(torch.uint8)[4 * FACTOR]
    assert torch.equal(row, kv[0, 3].contiguous().view(torch.uint8).flatten().cpu())


@pytest.mark.parametrize("path", ["staged", "direct"])
def test_jobs_of_one_direction_finish_in_order(path: str) -> None:
    _, _, worker = _setup(path)
    for job_id in range(1, 6):
        engine = EngineBlocks(np.array([job_id, job_id + 10]), (2, 0), (0, 0))
        assert worker.transfer_async(job_id, (engine, HostChunks(np.array([job_id]))))
    worker.wait(range(1, 6))
    assert [r.job_id for r in worker.get_finished()] == [1, 2, 3, 4, 5]


def test_the_store_thread_binds_the_engine_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores run on a job thread that bound the worker's device once, in its initializer."""
    caches, host, worker = _setup("staged")
    seen: list[tuple[str, int]] = []
    original = CudaCopyHandler._store_batch

    def recorded(self: CudaCopyHandler, batch: Batch) -> None:
        seen.append((threading.current_thread().name, torch.cuda.current_device()))
        original(self, batch)

    monkeypatch.setattr(CudaCopyHandler, "_store_batch", recorded)
    engine = EngineBlocks(np.array([0, 1, 2]), (3, 0), (0, 0))
    assert worker.transfer_async(1, (engine, HostChunks(np.array([0]))))
    _finish(worker, 1)
    device = caches["full.0"].device.index or 0
    assert seen and all(name.startswith("kvtier-store") for name, _ in seen)
    assert all(index == device for _, index in seen)

"""CUDA engine tensors and the host tier: records pinned as the engine serves, one ``PageMover``
job per transfer on a stream, byte-exact both ways (needs CUDA).

Every scenario runs through both mechanisms (``dma``: a gather on the device, then a copy per
run of records on the copy engine; ``kernel``: pages straight to pinned host memory) and with a
staging area smaller than a job (several batches reusing it).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch

from kvtier.addresses import EngineBlocks, HostChunks
from kvtier.layout import KVLayout, build_layout
from kvtier.media import Medium
from kvtier.pages import kernel
from kvtier.pages.mechanism import Mechanism
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.io import engine_host_handlers
from kvtier.tiers.host.io.copy_cuda import CudaCopyHandler
from kvtier.tiers.host.pinning import PIECE_BYTES
from kvtier.tiers.host.room import Room
from kvtier.worker import TransferWorker
from kvtier.worker.connector import WorkerConnector

pytestmark = pytest.mark.gpu

NUM_BLOCKS, FACTOR = 40, 3
PAGE = 16 * 2 * 64 * 2  # bytes of one block's K (or V): block_size 16, 2 heads, head_dim 64, bf16
PATHS = {
    "dma": {"mechanism": Mechanism.DMA},
    "kernel": {"mechanism": Mechanism.KERNEL},
    "dma-small-area": {"mechanism": Mechanism.DMA, "stage_bytes": 3 * PAGE},
}


def _setup(
    path: str | None = None, pin_piece_bytes: int = PIECE_BYTES
) -> tuple[torch.Tensor, KVLayout, HostTier, TransferWorker]:
    torch.manual_seed(0)
    # FlashAttention layout: (2, num_blocks, block_size, kv_heads, head_size); two groups aliasing
    kv = torch.randn(2, NUM_BLOCKS, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    layout = build_layout({"full.0": kv, "swa.0": kv}, [["full.0"], ["swa.0"]], NUM_BLOCKS)
    host = HostTier(layout, 8, FACTOR, pin_piece_bytes)
    assert host.pinning is not None and host.pinning.wait(60)
    worker = TransferWorker()
    if path is None:
        store, load = engine_host_handlers(layout, host)
    else:
        options = PATHS[path]
        store = CudaCopyHandler(layout, host, store=True, **options)  # type: ignore[arg-type]
        load = CudaCopyHandler(layout, host, store=False, **options)  # type: ignore[arg-type]
    worker.register_handler(Medium.ENGINE, Medium.CPU, store)
    worker.register_handler(Medium.CPU, Medium.ENGINE, load)
    return kv, layout, host, worker


def _finish(worker: TransferWorker, job_id: int) -> int:
    worker.wait([job_id])
    (result,) = worker.get_finished()  # wait() returns once the job's event completed
    assert result.job_id == job_id and result.success
    return result.bytes


def _page(host: HostTier, group: int, view: int, slot: int, sub: int) -> torch.Tensor:
    return torch.from_numpy(host.page(group, view, slot, sub).copy())


def test_the_host_tier_is_pinned_once_the_engine_serves() -> None:
    _, _, host, _ = _setup()
    assert host.pinned and host.memory.is_pinned()
    assert host.pinning is not None and host.pinning.rate() is not None


@pytest.mark.parametrize("path", list(PATHS))
def test_store_then_load_is_byte_exact_on_the_engine_device(path: str) -> None:
    kv, _, host, worker = _setup(path)
    # group 0: 6 blocks aligned; group 1: 4 blocks starting 1 into a chunk (trimmed both ends)
    engine = EngineBlocks(np.array([0, 1, 2, 3, 4, 5, 20, 21, 22, 23]), (6, 4), (0, 4))
    slots = HostChunks(np.array([7, 2, 5, 0]))
    assert worker.transfer_async(1, (engine, slots))
    assert _finish(worker, 1) == 10 * 2 * PAGE
    expected = {(0, 0): (7, 0), (0, 1): (7, 1), (0, 2): (7, 2), (0, 3): (2, 0),
                (1, 20): (5, 1), (1, 23): (0, 1)}  # fmt: skip
    for (group, block), (slot, sub) in expected.items():
        for view in (0, 1):  # K, V
            page = kv[view, block].contiguous().view(torch.uint8).flatten().cpu()
            assert torch.equal(_page(host, group, view, slot, sub), page)

    original = kv.clone()
    kv.zero_()
    assert worker.transfer_async(2, (slots, engine))
    worker.fence([2])  # the engine's stream waits for the load, this thread does not
    moved = engine.block_ids.tolist()
    assert torch.equal(kv[:, moved], original[:, moved])  # read on the engine's stream
    _finish(worker, 2)
    untouched = [b for b in range(NUM_BLOCKS) if b not in moved]
    assert not kv[:, untouched].any()


@pytest.mark.parametrize("path", ["dma", "kernel"])
def test_a_store_reads_what_the_engine_wrote_before_it(path: str) -> None:
    """The store waits for the engine's stream as it was at submission."""
    kv, _, host, worker = _setup(path)
    torch.cuda._sleep(50_000_000)  # type: ignore[no-untyped-call]  # the engine's stream, busy
    kv[:, 3].fill_(7)
    engine = EngineBlocks(np.array([3]), (1, 0), (0, 0))
    assert worker.transfer_async(1, (engine, HostChunks(np.array([4]))))
    _finish(worker, 1)
    page = kv[0, 3].contiguous().view(torch.uint8).flatten().cpu()
    assert torch.equal(_page(host, 0, 0, 4, 0), page)


@pytest.mark.parametrize("path", ["dma", "kernel"])
def test_jobs_of_one_direction_finish_in_order(path: str) -> None:
    _, _, _, worker = _setup(path)
    for job_id in range(1, 6):
        engine = EngineBlocks(np.array([job_id, job_id + 10]), (2, 0), (0, 0))
        assert worker.transfer_async(job_id, (engine, HostChunks(np.array([job_id]))))
    worker.wait(range(1, 6))
    assert [r.job_id for r in worker.get_finished()] == [1, 2, 3, 4, 5]


def test_a_load_does_not_hold_the_engine_thread() -> None:
    """transfer_async queues the copies and returns: the job is reported once its event is done,
    with its time on the device."""
    kv, _, _, worker = _setup("dma")
    torch.cuda._sleep(200_000_000)  # type: ignore[no-untyped-call]  # the engine's stream, busy
    engine = EngineBlocks(np.arange(12), (12, 0), (0, 0))
    assert worker.transfer_async(1, (HostChunks(np.array([0, 1, 2, 3])), engine))
    assert worker.get_finished() == []  # still queued behind the engine's work
    worker.wait([1])
    (result,) = worker.get_finished()
    assert result.success and 0 < result.seconds < 1.0


@pytest.mark.parametrize("path", ["dma", "kernel"])
def test_a_run_of_records_over_a_pinned_pieces_end_is_byte_exact(path: str) -> None:
    """Slots 0..7 in one job over a tier pinned in pieces of 5 OS pages (a record is 6): CUDA
    refuses one copy over two registrations, so the run is cut where they meet."""
    kv, _, host, worker = _setup(path, pin_piece_bytes=5 * 4096)
    assert host.pin_piece_bytes == 5 * 4096
    engine = EngineBlocks(np.arange(24), (24, 0), (0, 0))
    slots = HostChunks(np.arange(8))
    assert worker.transfer_async(1, (engine, slots))
    _finish(worker, 1)
    for block in range(24):
        for view in (0, 1):
            page = kv[view, block].contiguous().view(torch.uint8).flatten().cpu()
            assert torch.equal(_page(host, 0, view, *divmod(block, FACTOR)), page)
    original = kv.clone()
    kv.zero_()
    assert worker.transfer_async(2, (slots, engine))
    _finish(worker, 2)
    assert torch.equal(kv[:, :24], original[:, :24])


def test_copies_are_correct_while_the_tier_is_still_being_pinned() -> None:
    """A large tier pinned a piece at a time: copies into its unpinned part are still right."""
    kv = torch.randn(2, NUM_BLOCKS, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    layout = build_layout({"a": kv}, [["a"]], NUM_BLOCKS)
    record = 2 * PAGE * FACTOR
    host = HostTier(layout, (4 << 30) // record, FACTOR)  # 4 GiB: seconds of pinning
    store, load = engine_host_handlers(layout, host)
    last = host.num_chunks - 1  # the end of the tier: pinned last
    engine = EngineBlocks(np.array([0, 1, 2]), (3,), (0,))
    assert store.transfer_async(1, engine, HostChunks(np.array([last])))
    store.wait([1])
    for sub in range(FACTOR):
        page = kv[0, sub].contiguous().view(torch.uint8).flatten().cpu()
        assert torch.equal(_page(host, 0, 0, last, sub), page)
    # a run of three records over the first piece's end, pinned on one side or both by now
    first = PIECE_BYTES // record - 1
    assert first * record < PIECE_BYTES < (first + 3) * record
    engine = EngineBlocks(np.arange(9), (9,), (0,))
    assert store.transfer_async(2, engine, HostChunks(np.arange(first, first + 3)))
    store.wait([2])
    for block in range(9):
        slot, sub = divmod(block, FACTOR)
        page = kv[1, block].contiguous().view(torch.uint8).flatten().cpu()
        assert torch.equal(_page(host, 0, 1, first + slot, sub), page)
    assert host.pinning is not None and host.pinning.wait(120)
    assert host.pinned
    store.shutdown()
    load.shutdown()
    host.close()


def test_a_job_in_the_pinned_part_goes_straight_before_the_whole_tier_is_pinned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ``kernel`` mechanism moves a job whose slots are pinned already while the rest of a
    large tier is still being pinned; a job past the pinned part goes by the copy engine."""
    assert kernel.available() and kernel.reaches_host(torch.device("cuda"))
    kv = torch.randn(2, NUM_BLOCKS, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    layout = build_layout({"a": kv}, [["a"]], NUM_BLOCKS)
    host = HostTier(layout, (16 << 30) // (2 * PAGE * FACTOR), FACTOR)  # 16 GiB: seconds
    store = CudaCopyHandler(layout, host, store=True, mechanism=Mechanism.KERNEL)
    straight = []  # grid kernel launches whose far side is the host tier (not a staging area)
    launch = kernel.grid_copy

    def counted(table: torch.Tensor, span: Any, base: int, *args: Any) -> None:
        straight.extend([base] if base == host.memory.data_ptr() else [])
        launch(table, span, base, *args)

    monkeypatch.setattr(kernel, "grid_copy", counted)
    deadline = time.monotonic() + 60
    while not host.pinned_below(3) and time.monotonic() < deadline:
        time.sleep(0.01)  # polled: the pinning thread signals only its end
    assert host.pinned_below(3) and not host.pinned
    slots = HostChunks(np.arange(3))
    assert store.transfer_async(1, EngineBlocks(np.arange(9), (9,), (0,)), slots)
    store.wait([1])
    assert len(straight) == 1  # slots 0..2 pinned: straight
    last = host.num_chunks - 1
    assert not host.pinned_below(last + 1)
    slots = HostChunks(np.array([last]))
    assert store.transfer_async(2, EngineBlocks(np.arange(3), (3,), (0,)), slots)
    store.wait([2])
    assert len(straight) == 1  # the last slot is not pinned yet: by the copy engine
    for block in range(9):
        slot, sub = divmod(block, FACTOR)
        page = kv[1, block].contiguous().view(torch.uint8).flatten().cpu()
        assert torch.equal(_page(host, 0, 1, slot, sub), page)
        if block < 3:
            assert torch.equal(_page(host, 0, 1, last, block), page)
    store.shutdown()
    host.close()


def test_a_store_to_a_slot_not_pinned_yet_leaves_the_engines_thread_free() -> None:
    """CUDA copies to pageable memory once the engine's work before them is done: queued by the
    engine's thread, a store into the part of the tier not pinned yet would hold it for the
    step in flight. It returns while the step runs, and stores what the step wrote.

    Whatever runs after the step in flight is launched once before it: CUDA loads a kernel's
    module at its first launch (lazily, torch's default), and loading waits for the device's
    work in flight, which would hold this thread for the step whatever kvtier does (as it did
    the first time this ran on an H200)."""
    kv = torch.randn(2, NUM_BLOCKS, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    layout = build_layout({"a": kv}, [["a"]], NUM_BLOCKS)
    host = HostTier(layout, (32 << 30) // (2 * PAGE * FACTOR), FACTOR)  # 32 GiB: seconds to pin
    store, load = engine_host_handlers(layout, host)
    last = host.num_chunks - 1
    engine = torch.cuda.current_stream()
    kv.add_(1)  # loaded: the step's own kernel
    before = HostChunks(np.array([last - 1]))  # a pageable store's kernels and copies, loaded
    assert store.transfer_async(0, EngineBlocks(np.arange(3), (3,), (0,)), before)
    store.wait([0])
    assert [r.success for r in store.get_finished()] == [True]
    torch.cuda.synchronize()
    torch.cuda._sleep(1 << 30)  # type: ignore[no-untyped-call]  # the step in flight: ~0.5 s
    kv.add_(1)  # what it writes, which the store must read
    assert not host.pinned_below(last + 1)
    slots = HostChunks(np.array([last]))
    assert store.transfer_async(1, EngineBlocks(np.arange(3), (3,), (0,)), slots)
    assert not engine.query()  # returned while the step still runs
    store.wait([1])
    (result,) = store.get_finished()
    assert result.job_id == 1 and result.success
    for sub in range(FACTOR):
        page = kv[0, sub].contiguous().view(torch.uint8).flatten().cpu()
        assert torch.equal(_page(host, 0, 0, last, sub), page)
    store.shutdown()
    load.shutdown()
    host.close()


def test_a_host_tier_beyond_the_machines_memory_fails_the_start_naming_the_setting() -> None:
    """Pinned as the engine serves, a tier larger than the memory would show only once it is
    reached: the worker refuses it at registration, as committing it does on the CPU."""
    room = Room.read()
    assert room.total is not None
    worker = WorkerConnector(2 * room.total, block_size_factor=FACTOR, world_size=1)
    kv = torch.zeros(2, NUM_BLOCKS, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cpu_bytes_to_use"):
        worker.register({"a": kv}, [["a"]], NUM_BLOCKS)

"""The worker half with a disk tier, on CPU tensors: loads from two tiers, writes before stores.

One layer of 16 engine blocks (pages of 1 KiB), factor 1, a host tier of 8 chunks. Chunk keys
are integers 0, 1, 2, ... in group 0.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from disk_faults import full_disk_for
from tier_setup import disk_tier

from kvtier.addresses import EngineBlocks, HostChunks, TierChunks, TransferSpec
from kvtier.keys import ChunkKey, LayoutFingerprint, make_key
from kvtier.step_plan import LoadJob, StepPlan, StoreJob, TierWriteJob
from kvtier.tiers.base.chunk_format import HEADER_BYTES, Buffer
from kvtier.tiers.disk.files import DiskTier
from kvtier.worker.connector import WorkerConnector

NUM_BLOCKS, NUM_CHUNKS, PAGE = 16, 8, 1024
FINGERPRINT = LayoutFingerprint(
    model="tiny", dtype="float32", layout="", tp_rank=0, tp_size=1, pp_rank=0, chunk_tokens=16
)
KEYS = [make_key(FINGERPRINT.digest(), i, 0) for i in range(8)]


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[WorkerConnector]:
    worker = WorkerConnector(cpu_bytes_to_use=NUM_CHUNKS * PAGE, block_size_factor=1, world_size=1)
    caches = {"layer.0": torch.randn(NUM_BLOCKS, 2, 8, 16)}  # 1 KiB per block
    worker.register(caches, [["layer.0"]], NUM_BLOCKS, [disk_tier(tmp_path, 0, FINGERPRINT)])
    assert worker.host is not None and worker.host.num_chunks == NUM_CHUNKS
    yield worker
    worker.shutdown()


@pytest.fixture
def gate(worker: WorkerConnector) -> Iterator[threading.Event]:
    """Holds disk I/O until set; set at teardown too (before the worker's shutdown)."""
    event = threading.Event()
    yield event
    event.set()


def _disk(worker: WorkerConnector) -> DiskTier:
    files = worker.tier("disk").flush
    assert isinstance(files, DiskTier)
    return files


def _block(worker: WorkerConnector, block: int) -> bytes:
    assert worker.layout is not None
    return worker.layout.views[0][block].numpy().tobytes()


def _slot(worker: WorkerConnector, slot: int) -> bytes:
    assert worker.host is not None
    return worker.host.memory_np[slot].tobytes()


def _fill_slot(worker: WorkerConnector, slot: int, seed: int) -> bytes:
    assert worker.host is not None
    row = worker.host.memory_np[slot]
    row[:] = np.random.default_rng(seed).integers(0, 256, PAGE, dtype=np.uint8)
    return row.tobytes()


def _write_file(worker: WorkerConnector, key: ChunkKey, seed: int) -> bytes:
    payload = np.random.default_rng(seed).integers(0, 256, PAGE, dtype=np.uint8)
    _disk(worker).write(key, [payload])
    return payload.tobytes()


def _file(worker: WorkerConnector, key: ChunkKey) -> bytes:
    out = np.zeros(PAGE, dtype=np.uint8)
    _disk(worker).read(key, [out])  # verified
    return out.tobytes()


def _engine(blocks: list[int], first: int) -> EngineBlocks:
    return EngineBlocks(np.array(blocks), (len(blocks),), (first,))


def _two_tier_load() -> StepPlan:
    """Request "a" hits 4 chunks: slots 0 and 1 of the host tier, then keys 2 and 3 on disk."""
    host = LoadJob(1, "a", HostChunks(np.array([0, 1])), _engine([4, 5], 0))
    disk = LoadJob(2, "a", TierChunks("disk", (KEYS[2], KEYS[3])), _engine([6, 7], 2))
    return StepPlan(loads=[host, disk], num_chunks=NUM_CHUNKS)


def _hold(
    monkeypatch: pytest.MonkeyPatch, tier: DiskTier, verb: str, gate: threading.Event
) -> None:
    run = getattr(tier, verb)

    def held(key: ChunkKey, buffers: Sequence[Buffer]) -> object:
        gate.wait()
        return run(key, buffers)

    monkeypatch.setattr(tier, verb, held)


def test_a_request_loading_from_two_tiers_is_done_when_both_are(
    worker: WorkerConnector, gate: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_bytes = [_fill_slot(worker, 0, seed=0), _fill_slot(worker, 1, seed=1)]
    disk_bytes = [_write_file(worker, KEYS[2], seed=2), _write_file(worker, KEYS[3], seed=3)]
    _hold(monkeypatch, _disk(worker), "read", gate)
    worker.begin_step(_two_tier_load())
    worker.start_loads()

    assert worker.finished(set()) == (set(), set(), set())  # the host part alone is not enough
    assert list(worker.report().jobs) == [1]
    gate.set()
    worker.transfers.wait([2])
    assert worker.finished(set()) == (set(), {"a"}, set())
    assert worker.finished(set()) == (set(), set(), set())  # reported once

    assert [_block(worker, b) for b in (4, 5, 6, 7)] == host_bytes + disk_bytes
    assert worker.take_failed_blocks() == set()
    report = worker.report()
    assert list(report.jobs) == [2]
    assert (report.jobs[2].failed, report.jobs[2].bytes, report.jobs[2].bad) == (0, 2 * PAGE, [])
    counters = worker.counters
    assert (counters.loads, counters.failed_loads, counters.loaded_bytes) == (2, 0, 4 * PAGE)
    assert counters.bad_chunks == 0


def test_a_bad_file_fails_the_request_and_its_disk_blocks(worker: WorkerConnector) -> None:
    host_bytes = [_fill_slot(worker, 0, seed=0), _fill_slot(worker, 1, seed=1)]
    first = _write_file(worker, KEYS[2], seed=2)
    _write_file(worker, KEYS[3], seed=3)
    path = _disk(worker).path(KEYS[3])
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 100] ^= 0x80
    path.write_bytes(bytes(data))
    untouched = _block(worker, 7)
    worker.begin_step(_two_tier_load())
    worker.start_loads()
    worker.transfers.wait([1, 2])

    assert worker.finished(set()) == (set(), {"a"}, {"a"})
    assert worker.take_failed_blocks() == {6, 7}  # the disk job's blocks: the engine recomputes
    assert worker.take_failed_blocks() == set()
    report = worker.report()
    assert (report.jobs[1].failed, report.jobs[1].bad) == (0, [])
    assert (report.jobs[2].ranks, report.jobs[2].failed, report.jobs[2].bad) == (1, 1, [1])
    assert not path.exists()
    assert [_block(worker, b) for b in (4, 5, 6)] == [*host_bytes, first]
    assert _block(worker, 7) == untouched  # no unverified byte reached the engine
    counters = worker.counters
    assert (counters.loads, counters.failed_loads, counters.bad_chunks) == (1, 1, 1)


def test_a_missing_file_fails_the_load_and_counts_a_bad_chunk(worker: WorkerConnector) -> None:
    load = LoadJob(3, "c", TierChunks("disk", (KEYS[5],)), _engine([2], 0))
    worker.begin_step(StepPlan(loads=[load], num_chunks=NUM_CHUNKS))
    worker.start_loads()
    worker.transfers.wait([3])
    assert worker.finished(set()) == (set(), {"c"}, {"c"})
    assert worker.take_failed_blocks() == {2}
    assert worker.report().jobs[3].bad == [0]
    assert (worker.counters.failed_loads, worker.counters.bad_chunks) == (1, 1)


def test_a_staged_write_takes_the_slot_before_the_steps_store_reuses_it(
    worker: WorkerConnector, gate: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = _fill_slot(worker, 3, seed=3)
    new = _block(worker, 9)
    assert old != new
    write = TierWriteJob(5, HostChunks(np.array([3])), TierChunks("disk", (KEYS[0],), staged=True))
    store = StoreJob(6, "b", _engine([9], 0), HostChunks(np.array([3])))
    # the disk thread runs late, each store at once: only the submit order and staging count
    _hold(monkeypatch, _disk(worker), "write", gate)
    submit = worker.transfers.transfer_async

    def submit_stores_done(job_id: int, spec: tuple[TransferSpec, TransferSpec]) -> bool:
        submitted = submit(job_id, spec)
        if isinstance(spec[1], HostChunks):
            worker.transfers.wait([job_id])
        return submitted

    monkeypatch.setattr(worker.transfers, "transfer_async", submit_stores_done)
    worker.begin_step(StepPlan(stores=[store], tier_writes=[write], num_chunks=NUM_CHUNKS))
    worker.start_loads()
    worker.start_stores()
    gate.set()
    worker.transfers.wait([5, 6])

    assert worker.finished(set()) == (set(), set(), set())
    assert _file(worker, KEYS[0]) == old
    assert _slot(worker, 3) == new
    report = worker.report()
    assert sorted(report.jobs) == [5, 6]
    assert (report.jobs[5].failed, report.jobs[5].bad) == (0, [])
    assert report.jobs[5].bytes == _disk(worker).file_bytes(0)
    assert report.jobs[6].failed == 0
    counters = worker.counters
    assert (counters.tier_writes, counters.tier_write_errors, counters.stores) == (1, 0, 1)


def test_a_full_disk_counts_the_chunk_it_could_not_write(
    worker: WorkerConnector, monkeypatch: pytest.MonkeyPatch
) -> None:
    slots = [_fill_slot(worker, s, seed=s) for s in (0, 1, 2)]
    full_disk_for(monkeypatch, _disk(worker).path(KEYS[1]).name)
    write = TierWriteJob(7, HostChunks(np.array([0, 1, 2])), TierChunks("disk", tuple(KEYS[:3])))
    worker.begin_step(StepPlan(tier_writes=[write], num_chunks=NUM_CHUNKS))
    worker.start_stores()
    worker.transfers.wait([7])
    worker.finished(set())

    outcome = worker.report().jobs[7]
    assert (outcome.ranks, outcome.failed, outcome.bad) == (1, 1, [1])
    assert outcome.bytes == 2 * _disk(worker).file_bytes(0)
    assert (worker.counters.tier_writes, worker.counters.tier_write_errors) == (2, 1)
    assert [_file(worker, KEYS[0]), _file(worker, KEYS[2])] == [slots[0], slots[2]]
    assert not _disk(worker).path(KEYS[1]).exists()


def test_a_refused_write_counts_all_its_chunks(worker: WorkerConnector) -> None:
    write = TierWriteJob(
        8, HostChunks(np.array([0, NUM_CHUNKS])), TierChunks("disk", tuple(KEYS[:2]))
    )
    worker.begin_step(StepPlan(tier_writes=[write], num_chunks=NUM_CHUNKS))
    worker.start_stores()
    worker.finished(set())
    outcome = worker.report().jobs[8]
    assert (outcome.failed, outcome.bytes, outcome.bad) == (1, 0, [])
    assert (worker.counters.tier_writes, worker.counters.tier_write_errors) == (0, 2)
    assert not _disk(worker).path(KEYS[0]).exists()

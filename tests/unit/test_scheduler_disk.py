"""The scheduler half with a disk tier, as a specification: 4-token blocks, byte-string block
hashes, a disk tier in tmp_path whose files the test writes as the workers would (the scheduler
reads only names and sizes). ``_step`` and ``_report`` check the connector's integrity each time."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from kvtier.addresses import HostChunks, TierChunks
from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKey, ChunkKeyMaker, LayoutFingerprint
from kvtier.scheduler.connector import GroupSpec, ScheduledRequest, SchedulerConnector
from kvtier.step_plan import JobOutcome, StepPlan, WorkerReport
from kvtier.tiers.disk.config import DiskConfig
from kvtier.tiers.disk.index import DiskIndex
from kvtier.tiers.disk.names import chunk_path

FINGERPRINT = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 4)
FILE = 100  # bytes of one rank's chunk file
HASHES = [b"h0", b"h1", b"h2", b"h3"]  # four full blocks: 16 tokens
HASHES8 = [f"h{i}".encode() for i in range(8)]  # eight full blocks: 32 tokens


def _connector(
    root: Path,
    ranks: int = 1,
    factor: int = 1,
    host_chunks: int = 8,
    disk_chunks: int = 16,
    write_through: bool = False,
) -> SchedulerConnector:
    budget = disk_chunks * FILE * ranks
    disk_config = DiskConfig(str(root), budget, write_through)
    # hits of a few 4-token blocks: any asynchronous load is worth it here
    config = KVTierConfig(
        cpu_bytes_to_use=1, min_async_load_tokens=1, sections={"disk": disk_config}
    )
    disk = DiskIndex(root, budget, ranks, FINGERPRINT.digest(), FILE * ranks, write_through)
    return SchedulerConnector(
        config, [GroupSpec(4)], host_chunks, ranks, ChunkKeyMaker(FINGERPRINT, factor), [disk]
    )


def _keys(connector: SchedulerConnector, hashes: Sequence[bytes]) -> list[ChunkKey]:
    return connector.keys.keys(hashes, 0)


def _on_disk(root: Path, keys: Iterable[ChunkKey], ranks: int = 1) -> None:
    """Every rank's file of ``keys``, as workers (of this engine or another) wrote them."""
    for key in keys:
        for rank in range(ranks):
            path = chunk_path(root, key, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(bytes(FILE))


def _step(connector: SchedulerConnector, scheduled: Iterable[ScheduledRequest] = ()) -> StepPlan:
    plan = connector.build_plan(scheduled)
    connector.check_integrity()
    return plan


def _report(
    connector: SchedulerConnector, job_id: int, ranks: int = 1, outcome: JobOutcome | None = None
) -> None:
    """``ranks`` worker ranks finished ``job_id`` (each with ``outcome``, or a success)."""
    for _ in range(ranks):
        done = outcome or JobOutcome(ranks=1, bytes=FILE, seconds=0.01)
        connector.on_report(WorkerReport({job_id: done}))
        connector.check_integrity()


def _write(connector: SchedulerConnector, plan: StepPlan, ranks: int = 1) -> None:
    """The workers write the plan's disk writes, every file."""
    assert connector.tier("disk") is not None
    for job in plan.tier_writes:
        _on_disk(connector.tier("disk").root, job.dst.keys, ranks)
        outcome = JobOutcome(ranks=1, bytes=FILE * len(job.dst.keys), seconds=0.01)
        _report(connector, job.job_id, ranks, outcome)


def _store_in_host(
    connector: SchedulerConnector, req: str, hashes: Sequence[bytes], blocks: list[int], ranks: int
) -> None:
    """``req`` computes its whole prompt; its stores finish on every rank; it ends."""
    tokens = 4 * len(hashes)
    assert connector.lookup(req, hashes, 0) == 0
    connector.on_alloc(req, [blocks], 0)
    for store in _step(connector, [ScheduledRequest(req, [blocks], tokens)]).stores:
        _report(connector, store.job_id, ranks)
    assert connector.request_finished(req) is False


def test_a_hit_in_the_host_tier_then_on_disk_is_loaded_by_two_jobs(tmp_path: Path) -> None:
    connector = _connector(tmp_path, ranks=2, disk_chunks=2)
    keys = _keys(connector, HASHES)
    _store_in_host(connector, "a", HASHES[:2], [10, 11], ranks=2)
    _on_disk(tmp_path, keys[2:], ranks=2)

    assert connector.lookup("b", HASHES, 0) == 16
    connector.on_alloc("b", [[20, 21, 22, 23]], 16)
    plan = _step(connector)

    host, disk = plan.loads
    slots = connector.manager.stored()
    assert isinstance(host.src, HostChunks)
    assert host.src.slots.tolist() == [slots[keys[0]], slots[keys[1]]]
    assert host.dst.block_ids.tolist() == [20, 21]
    assert (host.dst.group_sizes, host.dst.block_indices) == ((2,), (0,))
    assert disk.src == TierChunks("disk", (keys[2], keys[3]))
    assert disk.dst.block_ids.tolist() == [22, 23]
    assert (disk.dst.group_sizes, disk.dst.block_indices) == ((2,), (2,))
    assert plan.tier_writes == []  # write-back, and the engine is busy
    assert connector.tier("disk") is not None
    assert connector.tier("disk").prepare_store([keys[0]]) == []  # both disk chunks are pinned

    _report(connector, host.job_id, ranks=2)
    _report(connector, disk.job_id, ranks=2)
    assert connector.stats.cpu.loaded_chunks == connector.stats.tiers["disk"].loaded_chunks == 2
    assert connector.tier("disk").prepare_store([keys[0]]) == [keys[0]]  # unpinned: one is evicted
    connector.tier("disk").complete_store({}, [keys[0]])
    connector.check_integrity()


def test_a_hit_after_an_engine_prefix_that_ends_inside_a_host_chunk(tmp_path: Path) -> None:
    connector = _connector(tmp_path, factor=2)  # chunks of two blocks, 8 tokens
    keys = _keys(connector, HASHES8)
    _store_in_host(connector, "a", HASHES8[:4], [10, 11, 12, 13], ranks=1)
    _on_disk(tmp_path, keys[2:])

    assert connector.lookup("b", HASHES8, 12) == 20  # the engine holds three blocks
    connector.on_alloc("b", [list(range(20, 28))], 20)
    host, disk = _step(connector).loads

    assert isinstance(host.src, HostChunks)
    assert host.src.slots.tolist() == [connector.manager.stored()[keys[1]]]
    assert host.dst.block_ids.tolist() == [23]  # the second half of chunk 1
    assert (host.dst.group_sizes, host.dst.block_indices) == ((1,), (3,))
    assert disk.src == TierChunks("disk", (keys[2], keys[3]))
    assert disk.dst.block_ids.tolist() == [24, 25, 26, 27]
    assert (disk.dst.group_sizes, disk.dst.block_indices) == ((4,), (4,))


def test_a_hit_after_an_engine_prefix_that_ends_inside_a_disk_chunk(tmp_path: Path) -> None:
    connector = _connector(tmp_path, factor=2)
    keys = _keys(connector, HASHES8)
    _store_in_host(connector, "a", HASHES8[:2], [10, 11], ranks=1)
    _on_disk(tmp_path, keys[1:])

    assert connector.lookup("b", HASHES8, 12) == 20
    connector.on_alloc("b", [list(range(20, 28))], 20)
    (disk,) = _step(connector).loads

    assert disk.src == TierChunks("disk", (keys[1], keys[2], keys[3]))
    assert disk.dst.block_ids.tolist() == [23, 24, 25, 26, 27]
    assert (disk.dst.group_sizes, disk.dst.block_indices) == ((5,), (3,))


def test_a_prompt_only_on_disk_is_loaded_then_stored_in_the_host_tier_not_on_disk_again(
    tmp_path: Path,
) -> None:
    connector = _connector(tmp_path)
    keys = _keys(connector, HASHES[:3])
    _on_disk(tmp_path, keys)

    assert connector.lookup("b", HASHES[:3], 0) == 12
    connector.on_alloc("b", [[20, 21, 22]], 12)
    (load,) = _step(connector).loads
    assert load.src == TierChunks("disk", tuple(keys))
    assert load.dst.block_ids.tolist() == [20, 21, 22]
    _report(connector, load.job_id)

    (store,) = _step(connector, [ScheduledRequest("b", [[20, 21, 22]], 12)]).stores
    assert store.src.block_ids.tolist() == [20, 21, 22]  # promoted: hot again
    _report(connector, store.job_id)
    assert set(connector.manager.stored()) == set(keys)
    assert connector.request_finished("b") is False
    assert not connector.has_pending_work  # nothing is dirty

    assert _step(connector).tier_writes == []  # idle
    disk = connector.stats.tiers["disk"]
    assert (disk.hit_chunks, disk.loaded_chunks) == (3, 3)
    assert (disk.stored_chunks, disk.skipped_stores) == (0, 0)


def test_a_failed_disk_load_forgets_only_the_bad_chunk(tmp_path: Path) -> None:
    connector = _connector(tmp_path, ranks=2)
    keys = _keys(connector, HASHES[:3])
    _on_disk(tmp_path, keys, ranks=2)
    assert connector.lookup("b", HASHES[:3], 0) == 12
    connector.on_alloc("b", [[20, 21, 22]], 12)
    (load,) = _step(connector).loads

    chunk_path(tmp_path, keys[1], 0).unlink()  # rank 0 found it bad and removed its file
    _report(connector, load.job_id, outcome=JobOutcome(ranks=1, failed=1, bytes=FILE, bad=[1]))
    _report(connector, load.job_id, outcome=JobOutcome(ranks=1, bytes=3 * FILE))

    assert connector.tier("disk") is not None
    assert connector.tier("disk").ready_keys() == [keys[0], keys[2]]
    assert not connector.tier("disk").holds(keys[1])
    assert connector.lookup("c", HASHES[:3], 0) == 4  # stops before the bad chunk
    disk = connector.stats.tiers["disk"]
    assert (disk.bad_chunks, disk.failed_loads, disk.loaded_chunks) == (1, 1, 0)
    assert not connector.requests["b"].load_jobs


def test_lookup_stats_of_both_tiers_add_up(tmp_path: Path) -> None:
    connector = _connector(tmp_path)
    keys = _keys(connector, HASHES)
    _store_in_host(connector, "a", HASHES[:2], [10, 11], ranks=1)
    _on_disk(tmp_path, keys[2:3])
    other = [b"x0", b"x1", b"x2", b"x3"]
    _on_disk(tmp_path, _keys(connector, other)[:3])

    for req, hashes, hit in [("b", HASHES, 12), ("c", other, 12), ("d", [b"y0", b"y1"], 0)]:
        assert connector.lookup(req, hashes, 0) == hit
        blocks = list(range(100, 100 + len(hashes)))
        connector.on_alloc(req, [blocks], hit)
        for load in _step(connector).loads:
            _report(connector, load.job_id)

    cpu, disk = connector.stats.cpu, connector.stats.tiers["disk"]
    assert connector.stats.lookups == 4  # "a" too
    assert (cpu.hit_chunks, cpu.miss_chunks) == (2, 2 + 2 + 4 + 2)  # "a" missed 2
    assert (disk.hit_chunks, disk.miss_chunks) == (1 + 3, 2 + 1 + 1 + 2)
    assert cpu.hit_chunks + cpu.miss_chunks == 2 + 4 + 4 + 2  # every chunk looked up
    assert disk.hit_chunks + disk.miss_chunks == cpu.miss_chunks
    assert (cpu.loaded_chunks, disk.loaded_chunks) == (cpu.hit_chunks, disk.hit_chunks)


def test_lookup_stats_after_an_engine_prefix_inside_a_chunk(tmp_path: Path) -> None:
    connector = _connector(tmp_path, factor=2)
    keys = _keys(connector, HASHES8)
    _store_in_host(connector, "a", HASHES8[:2], [10, 11], ranks=1)
    _on_disk(tmp_path, keys[1:])
    cpu, disk = connector.stats.cpu, connector.stats.tiers["disk"]
    before = cpu.hit_chunks, cpu.miss_chunks, disk.hit_chunks, disk.miss_chunks

    assert connector.lookup("b", HASHES8, 4) == 28  # the engine holds block 0 of chunk 0
    connector.on_alloc("b", [list(range(20, 28))], 28)
    host, from_disk = _step(connector).loads
    assert isinstance(host.src, HostChunks) and len(host.src.slots) == 1  # chunk 0's 2nd half
    assert from_disk.src == TierChunks("disk", (keys[1], keys[2], keys[3]))

    after = cpu.hit_chunks, cpu.miss_chunks, disk.hit_chunks, disk.miss_chunks
    assert [a - b for a, b in zip(after, before)] == [1, 3, 3, 0]


def test_write_back_waits_for_idle_and_keeps_the_engine_stepping_until_written(
    tmp_path: Path,
) -> None:
    connector = _connector(tmp_path)
    keys = _keys(connector, HASHES[:3])
    assert connector.lookup("a", HASHES[:3], 0) == 0
    connector.on_alloc("a", [[10, 11, 12]], 0)
    (store,) = _step(connector, [ScheduledRequest("a", [[10, 11, 12]], 12)]).stores
    _report(connector, store.job_id)

    assert connector.has_pending_work  # dirty chunks wait
    assert _step(connector, [ScheduledRequest("a", [[10, 11, 12]], 13)]).tier_writes == []
    assert connector.request_finished("a") is False

    plan = _step(connector)  # idle
    (write,) = plan.tier_writes
    assert write.dst.keys == tuple(keys) and not write.dst.staged
    assert write.src.slots.tolist() == [connector.manager.stored()[k] for k in keys]
    assert connector.has_pending_work  # the write is in flight
    _write(connector, plan)

    assert not connector.has_pending_work
    assert connector.tier("disk") is not None and connector.tier("disk").ready_keys() == keys
    assert _step(connector).tier_writes == []
    assert connector.stats.tiers["disk"].stored_chunks == 3


def test_write_through_writes_on_the_next_step_while_busy(tmp_path: Path) -> None:
    connector = _connector(tmp_path, write_through=True)
    keys = _keys(connector, HASHES[:2])
    assert connector.lookup("a", HASHES[:2], 0) == 0
    connector.on_alloc("a", [[10, 11]], 0)
    (store,) = _step(connector, [ScheduledRequest("a", [[10, 11]], 8)]).stores
    _report(connector, store.job_id)

    plan = _step(connector, [ScheduledRequest("a", [[10, 11]], 9)])

    (write,) = plan.tier_writes
    assert write.dst.keys == tuple(keys)
    _write(connector, plan)
    assert not connector.has_pending_work


def test_a_dirty_chunk_evicted_from_the_host_tier_is_written_before_its_slot_is_reused(
    tmp_path: Path,
) -> None:
    connector = _connector(tmp_path, host_chunks=2)
    keys = _keys(connector, HASHES[:2])
    assert connector.lookup("a", HASHES[:2], 0) == 0
    connector.on_alloc("a", [[10, 11]], 0)
    (store,) = _step(connector, [ScheduledRequest("a", [[10, 11]], 8)]).stores
    _report(connector, store.job_id)
    slots = connector.manager.stored()

    other = [b"x0", b"x1"]
    assert connector.lookup("b", other, 0) == 0
    connector.on_alloc("b", [[20, 21]], 0)
    plan = _step(connector, [ScheduledRequest("b", [[20, 21]], 8)])

    (write,) = plan.tier_writes  # in the same plan as the stores that reuse the slots
    assert write.dst.keys == tuple(keys) and write.dst.staged
    assert write.src.slots.tolist() == [slots[k] for k in keys]
    assert sorted(plan.stores[0].dst.slots.tolist()) == sorted(slots.values())
    _write(connector, plan)
    assert connector.lookup("c", HASHES[:2], 0) == 8  # from disk now


# ---- a failed disk load drops every bad chunk, and the recomputed ones are written again -------


def test_a_failed_disk_load_drops_every_bad_chunk_on_every_rank(tmp_path: Path) -> None:
    connector = _connector(tmp_path, ranks=2)
    keys = _keys(connector, HASHES)
    _on_disk(tmp_path, keys, ranks=2)
    assert connector.lookup("b", HASHES, 0) == 16
    connector.on_alloc("b", [[20, 21, 22, 23]], 16)
    (load,) = _step(connector).loads

    for position in (0, 2):  # each rank removed the files it found bad
        chunk_path(tmp_path, keys[position], 0).unlink()
    chunk_path(tmp_path, keys[3], 1).unlink()
    _report(connector, load.job_id, outcome=JobOutcome(ranks=1, failed=1, bad=[0, 2]))
    _report(connector, load.job_id, outcome=JobOutcome(ranks=1, failed=1, bad=[2, 3]))

    assert connector.tier("disk") is not None
    assert connector.tier("disk").ready_keys() == [keys[1]]  # verified good on both ranks: kept
    for position, there in enumerate([False, True, False, False]):
        assert [chunk_path(tmp_path, keys[position], r).exists() for r in (0, 1)] == [there] * 2
    assert not any(connector.tier("disk").holds(keys[p]) for p in (0, 2, 3))
    disk = connector.stats.tiers["disk"]
    assert (disk.bad_chunks, disk.failed_loads, disk.loaded_chunks) == (3, 1, 0)


def test_the_recomputed_chunks_of_a_failed_disk_load_are_written_to_disk_again(
    tmp_path: Path,
) -> None:
    connector = _connector(tmp_path)
    keys = _keys(connector, HASHES8)
    blocks = list(range(20, 28))
    _store_in_host(connector, "a", HASHES8[:2], [10, 11], ranks=1)
    _on_disk(tmp_path, keys[2:])
    assert connector.lookup("b", HASHES8, 0) == 32
    connector.on_alloc("b", [blocks], 32)
    host, from_disk = _step(connector).loads
    _report(connector, host.job_id)

    for position in (1, 3):  # keys 3 and 5
        chunk_path(tmp_path, keys[2 + position], 0).unlink()
    _report(connector, from_disk.job_id, outcome=JobOutcome(ranks=1, failed=1, bad=[1, 3]))
    # vLLM recomputes the failed load's blocks (2..7), and kvtier stores them in the host tier
    (store,) = _step(connector, [ScheduledRequest("b", [blocks], 32)]).stores
    assert store.keys == tuple(keys[2:])
    _report(connector, store.job_id)
    assert connector.request_finished("b") is False

    plan = _step(connector)  # idle: the dirty chunks are written
    (write,) = plan.tier_writes
    # a's chunks (never on disk), then the recomputed bad ones; the good ones are on disk
    assert write.dst.keys == (keys[0], keys[1], keys[3], keys[5])
    _write(connector, plan)
    assert connector.tier("disk") is not None
    assert set(connector.tier("disk").ready_keys()) == set(keys)
    assert not connector.has_pending_work


def test_a_bad_chunk_another_load_pins_is_dropped_at_once_and_removed_after_that_load(
    tmp_path: Path,
) -> None:
    connector = _connector(tmp_path, ranks=2)
    keys = _keys(connector, HASHES[:2])
    _on_disk(tmp_path, keys, ranks=2)
    loads = {}
    for req in ("b", "c"):
        assert connector.lookup(req, HASHES[:2], 0) == 8
        connector.on_alloc(req, [[20, 21]], 8)
        (loads[req],) = _step(connector).loads

    chunk_path(tmp_path, keys[1], 0).unlink()  # b's rank 0 found it bad
    _report(connector, loads["b"].job_id, outcome=JobOutcome(ranks=1, failed=1, bad=[1]))
    _report(connector, loads["b"].job_id)
    assert connector.tier("disk") is not None
    assert not connector.tier("disk").holds(keys[1])  # a recomputed copy is written again
    assert connector.lookup("d", HASHES[:2], 0) == 4  # never served again
    assert chunk_path(tmp_path, keys[1], 1).exists()  # c still reads it

    _report(connector, loads["c"].job_id, outcome=JobOutcome(ranks=1, failed=1, bad=[1]))
    _report(connector, loads["c"].job_id)
    assert not chunk_path(tmp_path, keys[1], 1).exists()  # every rank's file is gone
    assert connector.tier("disk").ready_keys() == [keys[0]]


def test_a_host_copy_of_a_chunk_found_bad_on_disk_is_written_again(tmp_path: Path) -> None:
    connector = _connector(tmp_path)
    keys = _keys(connector, HASHES[:2])
    assert connector.lookup("a", HASHES[:2], 0) == 0  # "a" computes the prompt itself
    connector.on_alloc("a", [[10, 11]], 0)
    _on_disk(tmp_path, keys)  # meanwhile another engine writes it to disk
    assert connector.lookup("b", HASHES[:2], 0) == 8
    connector.on_alloc("b", [[20, 21]], 8)
    (load,) = _step(connector).loads
    (store,) = _step(connector, [ScheduledRequest("a", [[10, 11]], 8)]).stores
    _report(connector, store.job_id)  # in the host tier, and (so far) on disk: not dirty
    assert connector.request_finished("a") is False

    chunk_path(tmp_path, keys[1], 0).unlink()
    _report(connector, load.job_id, outcome=JobOutcome(ranks=1, failed=1, bad=[1]))
    assert connector.request_finished("b") is False

    plan = _step(connector)  # idle
    (write,) = plan.tier_writes
    assert write.dst.keys == (keys[1],)
    _write(connector, plan)
    assert connector.tier("disk") is not None and set(connector.tier("disk").ready_keys()) == set(
        keys
    )

"""TierWrites to the disk tier as a specification: a host tier of 4 chunks (a real ChunkManager),
a disk tier of ``FILE``-byte chunks in tmp_path (a real DiskIndex), one worker rank played by
the test, and a clock the test moves (``RETRY_S``, ``VERIFY_S``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from kvtier.counters import TierStats
from kvtier.keys import ChunkKey, LayoutFingerprint, make_key
from kvtier.scheduler import tier_writes
from kvtier.scheduler.job_table import JobTable
from kvtier.scheduler.tier_writes import TierWrites
from kvtier.step_plan import JobOutcome, TierWriteJob
from kvtier.tiers.disk.index import DiskIndex
from kvtier.tiers.disk.names import chunk_path
from kvtier.tiers.host.index import ChunkManager

FP = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 4).digest()
FILE = 100  # bytes of one chunk's file


def key(i: int) -> ChunkKey:
    return make_key(FP, i, 0)


class Rig:
    """The scheduler's host tier and disk tier, and the worker rank that writes the files."""

    def __init__(
        self,
        root: Path,
        write_through: bool = False,
        max_in_flight: int = 64,
        disk_chunks: int = 10,
        host_chunks: int = 4,
    ) -> None:
        self.root = root
        self.host = ChunkManager(host_chunks)
        self.disk = DiskIndex(root, disk_chunks * FILE, 1, FP, FILE, write_through)
        self.disk.max_in_flight = max_in_flight
        self.jobs = JobTable(1)
        self.stats = TierStats()
        self.now = 0.0
        self.writes = TierWrites(self.disk, self.host, self.jobs, self.stats, lambda: self.now)

    def wait(self, seconds: float) -> None:
        self.now += seconds

    def store(self, keys: Sequence[ChunkKey]) -> dict[ChunkKey, int]:
        """Store ``keys`` in the host tier, as a step does; returns the slots of those evicted."""
        plan = self.host.place(keys)
        assert plan is not None
        evicted = list(zip(plan.evicted, plan.evicted_slots))
        self.writes.evicted(evicted)  # type: ignore[arg-type]
        self.host.complete_store(dict.fromkeys(plan.keys, 0))
        self.writes.stored(plan.keys)  # type: ignore[arg-type]
        return dict(evicted)  # type: ignore[arg-type]

    def flush(self, idle: bool) -> list[TierWriteJob]:
        self.writes.flush(idle)
        plan = self.writes.take_plan()
        self.check()
        return plan

    def finish(self, job: TierWriteJob, bad: Sequence[int] = ()) -> None:
        """The worker wrote ``job``'s files, but for the chunks at positions ``bad``."""
        written = [k for i, k in enumerate(job.dst.keys) if i not in bad]
        for k in written:
            path = chunk_path(self.root, k, 0)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(bytes(FILE))
        outcome = JobOutcome(1, int(bool(bad)), FILE * len(written), 0.01, list(bad))
        done = self.jobs.report(job.job_id, outcome)
        assert done is not None
        self.writes.complete(done)
        self.check()

    def check(self) -> None:
        self.host.check_integrity()
        self.disk.check_integrity()
        pinned = sum(len(job.keys) for job in self.jobs if job.pinned)
        assert self.host.num_pinned == pinned


def test_write_back_writes_nothing_while_busy_and_evicted_dirty_chunks_staged(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    rig.store([key(1), key(2), key(3), key(4)])
    assert rig.flush(idle=False) == []
    assert rig.writes.pending

    evicted = rig.store([key(5)])  # evicts key(1), the least recently used

    (job,) = rig.flush(idle=False)
    assert job.dst.keys == (key(1),) and job.dst.staged
    assert job.src.slots.tolist() == [evicted[key(1)]]  # the slot key(5) now reuses
    assert rig.host.num_pinned == 0  # a staged copy pins nothing
    assert rig.disk.holds(key(1)) and rig.disk.lookup([key(1)]).ready == 0  # being written
    rig.finish(job)
    assert rig.disk.ready_keys() == [key(1)]
    assert rig.stats.stored_chunks == 1 and rig.stats.stored_bytes == FILE


def test_write_back_flushes_the_oldest_dirty_chunks_when_idle_pinned_until_written(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, host_chunks=8)
    rig.store([key(1), key(2)])
    rig.store([key(3)])

    (job,) = rig.flush(idle=True)

    assert job.dst.keys == (key(1), key(2), key(3)) and not job.dst.staged
    slots = rig.host.stored()
    assert job.src.slots.tolist() == [slots[key(1)], slots[key(2)], slots[key(3)]]
    assert rig.host.num_pinned == 3  # the slots must not be reused while the worker reads them
    assert rig.host.place([key(i) for i in range(4, 10)]) is None  # 5 free, 3 pinned
    assert not rig.writes.pending
    rig.finish(job)
    assert rig.host.num_pinned == 0
    assert rig.disk.ready_keys() == [key(1), key(2), key(3)]
    assert rig.disk.used == 3 * FILE
    assert rig.flush(idle=True) == []


def test_write_through_writes_at_once(tmp_path: Path) -> None:
    rig = Rig(tmp_path, write_through=True)
    rig.store([key(1), key(2)])

    (job,) = rig.flush(idle=False)

    assert job.dst.keys == (key(1), key(2)) and not job.dst.staged
    rig.finish(job)
    assert rig.disk.ready_keys() == [key(1), key(2)]
    assert not rig.writes.pending


def test_chunks_already_on_disk_are_not_written_again(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.store([key(1), key(2)])
    (job,) = rig.flush(idle=True)
    rig.finish(job)
    rig.host.remove([key(1), key(2)])  # gone from the host tier, still on disk

    rig.store([key(1), key(2), key(3), key(4)])  # e.g. loaded from disk, stored again
    assert rig.flush(idle=False) == []
    rig.store([key(5), key(6)])  # evicts key(1) and key(2): clean, nothing to write
    assert rig.flush(idle=False) == []
    (job,) = rig.flush(idle=True)
    assert job.dst.keys == (key(3), key(4), key(5), key(6))
    assert rig.stats.skipped_stores == 0  # key(1) and key(2) were never dirty


def test_removed_chunks_are_not_written(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.store([key(1), key(2)])
    rig.writes.removed(rig.host.remove([key(1)]))  # type: ignore[arg-type]

    (job,) = rig.flush(idle=True)
    assert job.dst.keys == (key(2),)
    rig.finish(job)
    assert not rig.disk.holds(key(1))


def test_a_reset_counts_the_dirty_chunks_it_drops_as_lost(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.store([key(1), key(2)])
    (job,) = rig.flush(idle=True)
    rig.finish(job)  # both on disk: clean
    rig.store([key(3)])
    rig.writes.removed(rig.host.remove([key(1), key(3)]), reset=True)  # type: ignore[arg-type]
    assert rig.stats.lost == {"reset": 1}  # key(3) never reached the disk
    assert rig.flush(idle=True) == []


def test_a_chunk_with_no_room_on_disk_stays_dirty_and_is_written_once_there_is_room(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, disk_chunks=1)
    rig.store([key(1)])
    (job,) = rig.flush(idle=True)
    rig.finish(job)
    rig.disk.prepare_load([key(1)])  # the disk's only chunk is pinned by a load
    rig.store([key(2), key(3)])

    assert rig.flush(idle=True) == []  # refused: kept dirty, not lost

    assert rig.stats.skipped_stores == 0 and rig.stats.lost == {}
    assert not rig.writes.pending  # the engine stops stepping for them
    rig.wait(tier_writes.RETRY_S / 2)
    assert rig.flush(idle=True) == []  # not asked again before RETRY_S
    rig.disk.complete_load([key(1)])
    rig.wait(tier_writes.RETRY_S)
    assert rig.writes.pending
    (retried,) = rig.flush(idle=True)  # room now (key(1) evicted from disk): the oldest first
    assert retried.dst.keys == (key(2),)
    rig.finish(retried)
    assert rig.disk.ready_keys() == [key(2)]
    assert rig.writes.num_dirty == 1  # key(3): no room beside key(2), asked again later
    assert rig.stats.lost == {}


def test_an_evicted_dirty_chunk_with_no_room_is_skipped(tmp_path: Path) -> None:
    rig = Rig(tmp_path, disk_chunks=1)
    rig.store([key(9)])
    (job,) = rig.flush(idle=True)
    rig.finish(job)
    rig.disk.prepare_load([key(9)])
    rig.host.remove([key(9)])
    rig.store([key(1), key(2), key(3), key(4)])

    rig.store([key(5)])  # evicts key(1), dirty, with no room on disk

    assert rig.flush(idle=False) == []
    assert rig.stats.skipped_stores == 1
    assert rig.stats.lost == {"no_room": 1}  # it left host memory unwritten
    assert not rig.disk.holds(key(1))


def test_a_failed_write_rolls_back_only_the_bad_chunks(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.store([key(1), key(2), key(3)])
    (job,) = rig.flush(idle=True)

    rig.finish(job, bad=[1])  # key(2)'s write failed (a full disk)

    assert rig.disk.ready_keys() == [key(1), key(3)]
    assert not rig.disk.holds(key(2))
    assert not chunk_path(tmp_path, key(2), 0).exists()
    assert rig.disk.used == 2 * FILE
    assert (rig.stats.failed_stores, rig.stats.stored_chunks) == (1, 2)
    assert rig.host.num_pinned == 0
    assert rig.flush(idle=True) == []  # retried, but not at once
    assert not rig.writes.pending


def test_a_write_failed_with_no_chunk_named_rolls_back_all(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.store([key(1), key(2)])
    (job,) = rig.flush(idle=True)

    done = rig.jobs.report(job.job_id, JobOutcome(ranks=1, failed=1))
    assert done is not None
    rig.writes.complete(done)

    assert not rig.disk.holds(key(1)) and not rig.disk.holds(key(2))
    assert rig.disk.used == 0
    assert rig.stats.failed_stores == 2 and rig.host.num_pinned == 0
    rig.check()


def test_at_most_max_in_flight_chunks_are_written_at_once(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_in_flight=2)
    rig.store([key(1), key(2), key(3), key(4)])

    (first,) = rig.flush(idle=True)
    assert first.dst.keys == (key(1), key(2))
    assert rig.flush(idle=True) == []  # two in flight already
    assert rig.writes.pending
    rig.finish(first)
    (second,) = rig.flush(idle=True)
    assert second.dst.keys == (key(3), key(4))
    rig.finish(second)
    assert not rig.writes.pending


def test_staged_writes_stop_at_max_staged_whatever_the_tier_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tier with a long queue (Redis: max_queued_chunks) still copies aside at most
    MAX_STAGED evicted chunks: each copy costs a chunk of memory."""
    monkeypatch.setattr(tier_writes, "MAX_STAGED", 3)
    rig = Rig(tmp_path, max_in_flight=64)
    rig.store([key(1), key(2), key(3), key(4)])

    rig.store([key(5), key(6), key(7), key(8)])  # evicts four dirty chunks at once

    (job,) = rig.flush(idle=False)
    assert job.dst.keys == (key(1), key(2), key(3)) and job.dst.staged
    assert rig.stats.skipped_stores == 1
    assert rig.stats.lost == {"evicted_dirty": 1}


def test_staged_writes_of_evicted_chunks_stop_at_twice_max_in_flight(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_in_flight=1)
    rig.store([key(1), key(2), key(3), key(4)])

    rig.store([key(5), key(6), key(7), key(8)])  # evicts four dirty chunks at once

    (job,) = rig.flush(idle=False)
    assert job.dst.keys == (key(1), key(2)) and job.dst.staged
    assert rig.stats.skipped_stores == 2
    assert rig.stats.lost_evicted_dirty == 2
    rig.finish(job)


def test_staged_writes_count_the_writes_in_flight(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_in_flight=1)
    rig.store([key(1), key(2), key(3), key(4)])
    (flushed,) = rig.flush(idle=True)  # key(1), pinned while written
    assert flushed.dst.keys == (key(1),)

    rig.store([key(5), key(6), key(7)])  # evicts key(2..4), dirty

    (staged,) = rig.flush(idle=False)
    assert staged.dst.keys == (key(2),)  # room for 2 * 1 in flight, one taken
    assert rig.stats.skipped_stores == 2
    rig.finish(flushed)
    rig.finish(staged)
    assert rig.disk.ready_keys() == [key(1), key(2)]


def test_write_through_chunks_beyond_max_in_flight_wait_their_turn(tmp_path: Path) -> None:
    rig = Rig(tmp_path, write_through=True, max_in_flight=2)
    rig.store([key(1), key(2), key(3), key(4)])

    (first,) = rig.flush(idle=False)
    assert first.dst.keys == (key(1), key(2))
    assert rig.flush(idle=False) == []  # two in flight: the others wait, dirty
    rig.finish(first)
    (second,) = rig.flush(idle=False)
    assert second.dst.keys == (key(3), key(4))
    rig.finish(second)

    assert rig.disk.ready_keys() == [key(1), key(2), key(3), key(4)]
    assert rig.stats.skipped_stores == 0 and rig.stats.lost == {}


def test_a_chunk_whose_writes_fail_beside_written_ones_is_lost_after_max_attempts(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, write_through=True)
    rig.store([key(1), key(2)])

    for attempt in range(1, tier_writes.MAX_ATTEMPTS + 1):
        (job,) = rig.flush(idle=False)
        assert job.dst.keys == (key(1), key(attempt + 1))
        rig.finish(job, bad=[0])  # key(1) fails each time (say Redis refuses that record)
        assert rig.flush(idle=False) == []  # not before RETRY_S: no engine step spins on it
        rig.wait(tier_writes.RETRY_S)
        if attempt < tier_writes.MAX_ATTEMPTS:
            rig.store([key(attempt + 2)])

    assert rig.flush(idle=False) == []  # given up
    assert rig.stats.lost == {"write_error": 1}
    assert rig.stats.failed_stores == tier_writes.MAX_ATTEMPTS
    assert rig.disk.ready_keys() == [key(2), key(3), key(4)] and not rig.writes.pending


def test_writes_that_write_nothing_back_off_doubling_and_lose_nothing(tmp_path: Path) -> None:
    """A tier down or full (every write of a job failed): the chunks wait in host memory, asked
    again after 1, 2, 4 ... seconds (up to MAX_RETRY_S) until a write succeeds."""
    rig = Rig(tmp_path, write_through=True)
    rig.store([key(1), key(2)])
    for backoff in (1, 2, 4):
        (job,) = rig.flush(idle=False)
        assert job.dst.keys == (key(1), key(2))
        rig.finish(job, bad=[0, 1])
        rig.wait(backoff * tier_writes.RETRY_S - 0.01)
        assert rig.flush(idle=False) == [] and not rig.writes.pending
        rig.wait(0.01)

    (job,) = rig.flush(idle=False)
    rig.finish(job)

    assert rig.disk.ready_keys() == [key(1), key(2)]
    assert rig.stats.lost == {} and rig.stats.failed_stores == 6


def test_a_failed_staged_write_is_lost_at_once(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.store([key(1), key(2), key(3), key(4)])
    rig.store([key(5)])  # evicts key(1), dirty: a staged copy
    (staged,) = rig.flush(idle=False)

    rig.finish(staged, bad=[0])

    assert rig.stats.lost == {"write_error": 1}  # the copy is gone: nothing to retry
    rig.wait(tier_writes.RETRY_S)
    (job,) = rig.flush(idle=True)
    assert key(1) not in job.dst.keys


def test_chunks_stored_again_while_their_staged_write_runs_are_clean_once_written(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    rig.store([key(1), key(2), key(3), key(4)])
    rig.store([key(5)])  # evicts key(1): staged
    (staged,) = rig.flush(idle=False)
    rig.writes.removed(rig.host.remove([key(2)]))  # type: ignore[arg-type]
    rig.store([key(1)])  # computed again meanwhile: the disk is writing it, not dirty

    rig.finish(staged)

    (job,) = rig.flush(idle=True)
    assert key(1) not in job.dst.keys


def test_a_write_that_would_pin_most_of_a_small_host_tier_is_staged(tmp_path: Path) -> None:
    """Four chunks written through from a 4-chunk host tier: pinned, they would leave the next
    prompt's chunks no slot (and those would never reach the tier); copied aside, they do not."""
    rig = Rig(tmp_path, write_through=True)
    rig.store([key(1), key(2), key(3), key(4)])

    (job,) = rig.flush(idle=False)

    assert job.dst.keys == (key(1), key(2), key(3), key(4)) and job.dst.staged
    assert rig.host.num_pinned == 0
    rig.store([key(5), key(6), key(7), key(8)])  # evicts all four, being written: not dirty
    (second,) = rig.flush(idle=False)
    assert second.dst.keys == (key(5), key(6), key(7), key(8)) and second.dst.staged
    rig.finish(job)
    rig.finish(second)
    assert rig.disk.ready_keys() == [key(i) for i in range(1, 9)]
    assert rig.stats.lost == {} and rig.stats.skipped_stores == 0

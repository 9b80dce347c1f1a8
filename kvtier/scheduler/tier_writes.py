"""Which host-tier chunks are written to a tier below host memory, and when (DESIGN §3, step 6).

One ``TierWrites`` per entry of the tier chain (``lower_tier.py``): the disk tier, the Redis tier.
A chunk stored in the host tier is *dirty* for a lower tier until that tier holds it. Dirty
chunks are written:
- when evicted from the host tier (both modes): a *staged* write, since the slot is reused by
  the same step's stores, so the worker copies it before those stores run;
- write-through (the tier's ``write_through``; always for Redis, so the fleet finds a chunk as
  soon as one engine computed it): at once, on the step after their host store finished;
- write-back (the disk tier's default): while the engine is idle (no request in kvtier's hands),
  so a restarted engine finds them; under load only evictions reach the disk.
A non-staged write pins its host chunks until it is done. At most the tier's ``max_in_flight``
chunks are being written; a dirty chunk that finds no room (the disk budget is all pinned or in
flight, or too many writes queue) is skipped and counted, never retried, so the engine never spins
on it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from kvtier.addresses import HostChunks
from kvtier.counters import TierStats
from kvtier.keys import ChunkKey
from kvtier.scheduler.job_table import Job, JobKind, JobTable
from kvtier.scheduler.lower_tier import LowerTier
from kvtier.scheduler.manager import ChunkManager
from kvtier.step_plan import DiskWriteJob

MAX_STAGED = 128  # chunks copied aside (staged writes) or being written, when chunks are evicted


class TierWrites:
    def __init__(
        self,
        index: LowerTier,
        host: ChunkManager,
        jobs: JobTable,
        stats: TierStats,
    ) -> None:
        self.index = index
        self.host = host
        self.jobs = jobs
        self.stats = stats
        self.write_through = index.write_through
        self.max_in_flight = index.max_in_flight
        self._dirty: OrderedDict[ChunkKey, None] = OrderedDict()  # oldest first
        self._in_flight = 0  # chunks
        self._plan: list[DiskWriteJob] = []

    @property
    def pending(self) -> bool:
        """Dirty chunks wait to be written (the engine should keep stepping while idle)."""
        return bool(self._dirty)

    def stored(self, keys: Sequence[ChunkKey]) -> None:
        """``keys`` were stored in the host tier."""
        for key in keys:
            if not self.index.holds(key):
                self._dirty[key] = None

    def removed(self, keys: Sequence[ChunkKey]) -> None:
        """``keys`` left the host tier without being written (a copy found bad)."""
        for key in keys:
            self._dirty.pop(key, None)

    def evicted(self, chunks: Sequence[tuple[ChunkKey, int]]) -> None:
        """``chunks`` (key, slot) left the host tier this step: write the dirty ones back."""
        dirty = [(key, slot) for key, slot in chunks if key in self._dirty]
        for key, _ in dirty:
            del self._dirty[key]
        # staged copies cost memory: at most MAX_STAGED chunks, whatever the tier's queue
        room = max(0, min(2 * self.max_in_flight, MAX_STAGED) - self._in_flight)
        admitted = set(self.index.prepare_store([key for key, _ in dirty[:room]]))
        self.stats.skipped_stores += len(dirty) - len(admitted)
        kept = [(key, slot) for key, slot in dirty if key in admitted]
        if kept:
            self._add_job([key for key, _ in kept], [slot for _, slot in kept], staged=True)

    def flush(self, idle: bool) -> None:
        """Write the oldest dirty chunks: always with write-through, when ``idle`` otherwise."""
        if not self._dirty or not (self.write_through or idle):
            return
        count = min(len(self._dirty), self.max_in_flight - self._in_flight)
        if count <= 0:
            return
        keys = [self._dirty.popitem(last=False)[0] for _ in range(count)]
        admitted = self.index.prepare_store(keys)
        self.stats.skipped_stores += len(keys) - len(admitted)
        if admitted:
            slots = self.host.prepare_load(admitted).slots  # pinned until written
            self._add_job(admitted, slots, staged=False)

    def _add_job(self, keys: list[ChunkKey], slots: list[int], staged: bool) -> None:
        job = Job("", keys, JobKind.TIER_WRITE, pinned=not staged, tier=self.index.name)
        job_id = self.jobs.add(job)
        self._in_flight += len(keys)
        self._plan.append(
            DiskWriteJob(
                job_id,
                HostChunks(np.array(slots, dtype=np.int64)),
                self.index.spec(tuple(keys), staged=staged),
            )
        )

    def take_plan(self) -> list[DiskWriteJob]:
        plan, self._plan = self._plan, []
        return plan

    def complete(self, job: Job) -> None:
        """Every rank finished ``job``: index what was written, drop what was not."""
        outcome = job.outcome
        bad = set(outcome.bad) if outcome.bad or not outcome.failed else set(range(len(job.keys)))
        written = [key for i, key in enumerate(job.keys) if i not in bad]
        per_chunk = outcome.bytes // len(written) if written else 0
        self.index.complete_store({key: per_chunk for key in written}, [job.keys[i] for i in bad])
        if job.pinned:
            self.host.complete_load(job.keys)
        self._in_flight -= len(job.keys)
        stats = self.stats
        stats.stored_chunks += len(written)
        stats.stored_bytes += outcome.bytes
        stats.store_seconds += outcome.seconds
        stats.failed_stores += len(bad)
        stats.evicted_chunks = self.index.evicted

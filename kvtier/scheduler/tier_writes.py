"""Which host-tier chunks are written to a tier below host memory, and when (DESIGN §3, step 6).

One ``TierWrites`` per entry of the tier chain (``lower_tier.py``): the disk tier, the Redis tier.
A chunk stored in the host tier (never a prompt's tail) is *dirty* for a lower tier until that
tier holds it, then *clean*. Dirty chunks are written, oldest first:
- write-through (the tier's ``write_through``; always for Redis, so the fleet finds a chunk as
  soon as one engine computed it): at once, on the step after their host store finished;
- write-back (the disk tier's default): while the engine is idle (no request in kvtier's hands),
  so a restarted engine finds them; under load only evictions reach the disk;
- when evicted from the host tier (both modes): a *staged* write, since the slot is reused by
  the same step's stores, so the worker copies it before those stores run.
A non-staged write pins its host chunks until it is done, unless those pins would leave the host
tier less than half its chunks to evict for the next stores (a small host tier: one prompt's
chunks pinned while written to Redis would leave the next prompt's stores no room): then it is
staged too. At most the tier's ``max_in_flight`` chunks are being written: the others stay dirty
and go as writes finish, never dropped for waiting. A tier that refuses chunks (Redis down, the
disk budget all pinned) keeps them dirty and is offered none for ``RETRY_S``; ``pending`` is
False meanwhile, so an idle engine never spins on them. A failed write of a chunk still in host
memory leaves it dirty: a job that wrote nothing (the tier down or full) backs the tier off,
``RETRY_S`` doubling up to ``MAX_RETRY_S`` until a write succeeds; a chunk that failed beside
written ones (its own fault) is given up after ``MAX_ATTEMPTS`` such failures.

What never reaches the tier is counted by cause (``TierStats.lost_*``; the ones lost as they
leave host memory also in ``skipped_stores``, as before):
    evicted_dirty   left host memory dirty with no room for a staged copy (at most
                    ``MAX_STAGED`` chunks, or twice ``max_in_flight``, being written)
    no_room         left host memory dirty; the tier had no room for its staged write
    tier_down       left host memory dirty, or its staged copy's write failed, the tier down
    write_error     its staged copy's write failed (the tier up), or its write failed
                    ``MAX_ATTEMPTS`` times beside written chunks: an I/O error, Redis refused it
A shutdown writes what is still dirty from the workers' side (``worker/shutdown_flush.py``).

A tier may lose chunks unseen (a Redis restarted empty, flushed, or evicting): every
``VERIFY_S`` the oldest-verified ``VERIFY_SAMPLE`` clean chunks are handed to the tier's
``verify``, and the ones it finds gone (``take_gone``) are dirty again. A chunk found gone, or a
tier that ``forgotten`` all it knew (Redis failed), starts a sweep: every clean chunk verified, as
fast as the tier takes the queries. The chunks found gone are written at the pace above.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from itertools import islice

import numpy as np

from kvtier.addresses import HostChunks, TierChunks
from kvtier.counters import TierStats
from kvtier.keys import ChunkKey
from kvtier.scheduler.job_table import Job, JobKind, JobTable
from kvtier.step_plan import TierWriteJob
from kvtier.tiers.base.index import TierIndex
from kvtier.tiers.host.index import ChunkManager

MAX_STAGED = 128  # chunks copied aside (staged writes) or being written, when chunks are evicted
RETRY_S = 0.5  # a tier that refused chunks is offered none for this long; the first back-off
# after a write that wrote nothing (the Redis circuit breaker's first window)
MAX_RETRY_S = 30.0  # the longest back-off after writes that wrote nothing, in a row
MAX_ATTEMPTS = 3  # failed writes of one chunk, beside written ones, before it is given up
VERIFY_S = 1.0  # how often a sample of the clean chunks is verified
VERIFY_SAMPLE = 64  # clean chunks verified each VERIFY_S
SWEEP_STEP = 2048  # clean chunks a sweep offers the tier to verify per step (it takes fewer)


class TierWrites:
    def __init__(
        self,
        index: TierIndex,
        host: ChunkManager,
        jobs: JobTable,
        stats: TierStats,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.host = host
        self.jobs = jobs
        self.stats = stats
        self.write_through = index.traits.write_through
        self.max_in_flight = index.traits.max_in_flight
        self._clock = clock
        self._dirty: OrderedDict[ChunkKey, None] = OrderedDict()  # oldest first
        self._clean: OrderedDict[ChunkKey, None] = OrderedDict()  # least recently verified first
        self._failures: dict[ChunkKey, int] = {}  # dirty chunks whose writes failed so far
        self._in_flight = 0  # chunks
        self._plan: list[TierWriteJob] = []
        self._retry_at = 0.0  # the tier refused chunks: none offered before this time
        self._failed_jobs = 0  # write jobs in a row that wrote nothing
        self._verify_at = clock() + VERIFY_S
        self._sweep = 0  # clean chunks still to verify after the tier lost some
        self._forgotten = index.usage().forgotten

    @property
    def pending(self) -> bool:
        """Dirty chunks could be written now (the engine should keep stepping while idle)."""
        return bool(self._dirty) and self._clock() >= self._retry_at

    @property
    def num_dirty(self) -> int:
        return len(self._dirty)

    def stored(self, keys: Sequence[ChunkKey]) -> None:
        """``keys`` were stored in the host tier (or the tier lost them: dirty again)."""
        for key in keys:
            if self.index.holds(key):
                if key not in self._dirty:
                    self._clean[key] = None
            else:
                self._clean.pop(key, None)
                self._dirty[key] = None

    def removed(self, keys: Sequence[ChunkKey], reset: bool = False) -> None:
        """``keys`` left the host tier without being written: a copy found bad (never to be
        written), or a ``reset`` of the connector (the dirty ones are lost, and counted)."""
        if reset:
            self.stats.lose("reset", sum(key in self._dirty for key in keys))
        for key in keys:
            self._forget(key)

    def _forget(self, key: ChunkKey) -> None:
        self._dirty.pop(key, None)
        self._clean.pop(key, None)
        self._failures.pop(key, None)

    def evicted(self, chunks: Sequence[tuple[ChunkKey, int]]) -> None:
        """``chunks`` (key, slot) left the host tier this step: write the dirty ones back."""
        dirty = [(key, slot) for key, slot in chunks if key in self._dirty]
        for key, _ in chunks:
            self._forget(key)
        room = self._stage_room()
        staged, over = [key for key, _ in dirty[:room]], len(dirty[room:])
        admitted = set(self.index.prepare_store(staged))
        refused = [key for key in staged if key not in admitted and not self.index.holds(key)]
        self.stats.lose("evicted_dirty", over)
        self.stats.lose(self._refusal(), len(refused))
        self.stats.skipped_stores += over + len(refused)
        kept = [(key, slot) for key, slot in dirty if key in admitted]
        if kept:
            self._add_job([key for key, _ in kept], [slot for _, slot in kept], staged=True)

    def _stage_room(self) -> int:
        """Chunks that may be copied aside now: staged copies cost memory, so at most
        MAX_STAGED chunks (or twice ``max_in_flight``) being written, whatever the tier's queue."""
        return max(0, min(2 * self.max_in_flight, MAX_STAGED) - self._in_flight)

    def _starves_host(self, count: int) -> bool:
        """Whether pinning ``count`` more host chunks leaves fewer than half the host tier's
        chunks free or evictable for the next stores."""
        return 2 * (self.host.room - count) < self.host.capacity

    def _refusal(self) -> str:
        """Why the tier refuses chunks now: it is down, or it has no room."""
        return "no_room" if self.index.usage().available else "tier_down"

    def flush(self, idle: bool) -> None:
        """Verify the clean chunks in turn; write the oldest dirty chunks: always with
        write-through, when ``idle`` otherwise. Chunks the tier refuses stay dirty, and none is
        offered for ``RETRY_S``. Costs at most ``max_in_flight`` chunks' writes and
        ``SWEEP_STEP`` chunks' verifies."""
        now = self._clock()
        self._watch(now)
        if not self._dirty or not (self.write_through or idle) or now < self._retry_at:
            return
        count = min(len(self._dirty), self.max_in_flight - self._in_flight)
        staged = self._starves_host(count)
        if staged:
            count = min(count, self._stage_room())
        if count <= 0:
            return
        keys = list(islice(self._dirty, count))
        admitted = self.index.prepare_store(keys)
        taken = set(admitted)
        for key in keys:
            if key in taken:
                del self._dirty[key]
            elif self.index.holds(key):  # the tier has it already (another engine wrote it)
                del self._dirty[key]
                self._clean[key] = None
        if any(key in self._dirty for key in keys):  # refused: asked again later
            self._retry_at = now + RETRY_S
        if admitted and staged:  # copied by the worker before this step's stores
            self._add_job(admitted, self.host.slots(admitted), staged=True)
        elif admitted:
            self.host.prepare_load(admitted)  # pinned until written
            self._add_job(admitted, self.host.slots(admitted), staged=False)

    def _watch(self, now: float) -> None:
        """Dirty again the clean chunks the tier lost; verify a sample of them, or all of them
        (a sweep) once the tier was found to lose some."""
        for key in self.index.take_gone():
            if key in self._clean and not self.index.holds(key):
                del self._clean[key]
                self._dirty[key] = None
                self._sweep = self._sweep or len(self._clean)
        forgotten = self.index.usage().forgotten
        if forgotten != self._forgotten:
            self._forgotten = forgotten
            self._sweep = self._sweep or len(self._clean)
        self._sweep = min(self._sweep, len(self._clean))
        if not self._sweep and now < self._verify_at:
            return
        self._verify_at = now + VERIFY_S
        keys = list(islice(self._clean, min(self._sweep, SWEEP_STEP) or VERIFY_SAMPLE))
        queued = self.index.verify(keys)
        for key in keys[:queued]:  # verified last: asked again after all the others
            self._clean.move_to_end(key)
        self._sweep = max(0, self._sweep - queued)

    def _add_job(self, keys: list[ChunkKey], slots: list[int], staged: bool) -> None:
        job = Job("", keys, JobKind.TIER_WRITE, pinned=not staged, tier=self.index.name)
        job_id = self.jobs.add(job)
        self._in_flight += len(keys)
        self._plan.append(
            TierWriteJob(
                job_id,
                HostChunks(np.array(slots, dtype=np.int64)),
                TierChunks(self.index.name, tuple(keys), staged=staged),
            )
        )

    def take_plan(self) -> list[TierWriteJob]:
        plan, self._plan = self._plan, []
        return plan

    def complete(self, job: Job) -> None:
        """Every rank finished ``job``: index what was written; a chunk whose write failed is
        dirty again while the host tier holds it (``_failed``)."""
        outcome = job.outcome
        bad = set(outcome.bad) if outcome.bad or not outcome.failed else set(range(len(job.keys)))
        written = [key for i, key in enumerate(job.keys) if i not in bad]
        failed = [job.keys[i] for i in sorted(bad)]
        per_chunk = outcome.bytes // len(written) if written else 0
        self.index.complete_store({key: per_chunk for key in written}, failed)
        if job.pinned:
            self.host.complete_load(job.keys)
        self._in_flight -= len(job.keys)
        for key in written:
            self._failures.pop(key, None)
            if self.host.is_ready(key) and key not in self._dirty:
                self._clean[key] = None
        self._failed(failed, wrote=bool(written))
        stats = self.stats
        stats.stored_chunks += len(written)
        stats.stored_bytes += outcome.bytes
        stats.store_seconds += outcome.seconds
        stats.failed_stores += len(bad)
        stats.evicted_chunks = self.index.usage().evicted

    def _failed(self, keys: list[ChunkKey], wrote: bool) -> None:
        """Writes of ``keys`` failed (``wrote``: others of their job did not). Those the host
        tier still holds are dirty again, behind a back-off; the others (a staged copy) are
        lost."""
        if wrote:
            self._failed_jobs = 0
        if not keys:
            return
        if not wrote:  # the tier is down or full: back off, doubling
            self._failed_jobs += 1
        backoff = min(MAX_RETRY_S, RETRY_S * 2.0 ** max(0, self._failed_jobs - 1))
        self._retry_at = max(self._retry_at, self._clock() + backoff)
        for key in keys:
            self._clean.pop(key, None)
            attempts = self._failures.pop(key, 0) + wrote  # counted when the tier was up
            if attempts >= MAX_ATTEMPTS or not self.host.is_ready(key):
                self._dirty.pop(key, None)
                self.stats.lose("write_error" if self.index.usage().available else "tier_down", 1)
                continue
            self._failures[key] = attempts
            self._dirty[key] = None


def drop_host_chunks(host: ChunkManager, chain: Iterable[TierWrites]) -> bool:
    """Forget every host-tier chunk no transfer uses (the engine's connector-cache reset). Chunks
    pinned by a load or a tier write, and stores in flight, stay. The chain's tiers are kept: they
    persist across restarts and may be shared by other engines. Chunks not yet written to them
    are lost (``reset``). True when no loadable host chunk is left."""
    removed = host.remove(list(host.stored()))
    for writes in chain:
        writes.removed(removed, reset=True)  # type: ignore[arg-type]
    return not host.stored()

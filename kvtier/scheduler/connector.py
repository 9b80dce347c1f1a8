"""The scheduler half: which chunks a request can load, which it stores, and when a job is done.

Engine-independent: the vLLM adapter turns its calls into these, with plain data.

    lookup(req, block_hashes, num_computed_tokens) -> int | None   tokens loadable beyond the hit
    on_alloc(req, block_ids, num_external_tokens)                  pin the hit, plan its load
    build_plan(scheduled, preempted)            -> StepPlan         this step's loads and stores
    on_report(report)                                               count ranks; finish jobs
    request_finished(req)                       -> bool             True: hold blocks for stores

A job is done only when every worker rank reported it (``num_workers`` reports). Loads finish
before the request runs (the engine waits for them); stores run after the step's forward, and an
earlier store whose engine blocks are handed to someone else is flushed before the next forward.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvtier.config import KVTierConfig
from kvtier.counters import KVTierStats
from kvtier.keys import ChunkKey, ChunkKeyMaker
from kvtier.scheduler.base import EventKind, Key, StorePlan, TierEvent
from kvtier.scheduler.jobs import LoadJob, StepPlan, StoreJob, WorkerReport
from kvtier.scheduler.manager import ChunkManager
from kvtier.scheduler.request import RequestState
from kvtier.worker.base import EngineBlocks, HostChunks

logger = logging.getLogger(__name__)

NULL_BLOCK = 0  # vLLM's placeholder for blocks a group does not keep (outside a sliding window)


@dataclass(frozen=True)
class GroupSpec:
    """One KV cache group as the scheduler half needs it."""

    block_tokens: int
    sliding_window: int | None = None  # tokens; None for full attention


@dataclass(frozen=True)
class ScheduledRequest:
    """A request the engine runs this step: its blocks per group, tokens computed after it."""

    req_id: str
    block_ids: Sequence[Sequence[int]]
    num_computed_tokens: int


@dataclass
class _Job:
    req_id: str
    keys: list[ChunkKey]
    store: bool
    blocks: list[int] = field(default_factory=list)  # engine blocks a store reads
    ranks: int = 0
    failed: int = 0
    bytes: int = 0
    seconds: float = 0.0


class SchedulerConnector:
    def __init__(
        self,
        config: KVTierConfig,
        groups: Sequence[GroupSpec],
        num_chunks: int,
        num_workers: int,
        key_maker: ChunkKeyMaker,
    ) -> None:
        block_tokens = {g.block_tokens for g in groups}
        if len(block_tokens) != 1:
            raise ValueError(f"kvtier: KV cache groups with different block sizes {block_tokens}")
        self.groups = tuple(groups)
        self.block_tokens = block_tokens.pop()
        self.factor = key_maker.block_size_factor
        self.chunk_tokens = self.block_tokens * self.factor
        self.num_workers = num_workers
        self.keys = key_maker
        self.manager = ChunkManager(num_chunks, config.eviction_policy, config.store_threshold)
        self.stats = KVTierStats()
        self.requests: dict[str, RequestState] = {}
        self._jobs: dict[int, _Job] = {}  # in flight on at least one rank
        self._block_jobs: dict[int, set[int]] = {}  # engine block -> store jobs reading it
        self._next_job = 1
        self._plan = StepPlan(num_chunks=num_chunks)
        self._events: list[TierEvent] = []

    # ---- lookup and load -------------------------------------------------------------------

    def lookup(
        self, req_id: str, block_hashes: Sequence[bytes], num_computed_tokens: int
    ) -> int | None:
        """Tokens beyond ``num_computed_tokens`` loadable from kvtier, in whole chunks.

        None asks the engine to try again next step: the next chunk's store is still in flight.
        """
        state = self.requests.get(req_id)
        if state is None:
            state = self.requests[req_id] = RequestState(req_id, block_hashes, len(self.groups))
        first = num_computed_tokens // self.chunk_tokens
        full = len(block_hashes) // self.factor
        state.num_computed_tokens = num_computed_tokens
        state.lookup_start, state.lookup_end = first, max(first, full)
        if self.manager.capacity == 0 or full <= first or state.load_job is not None:
            return 0
        end, retry = full, False
        for g, spec in enumerate(self.groups):
            if spec.sliding_window is None:
                found = self.manager.lookup(state.group_keys(self.keys, g, full)[first:end])
                end, retry = first + found.ready, retry or found.retry_later
        while end > first and not self._window_ready(state, end):
            end -= 1
        hit = max(0, end * self.chunk_tokens - num_computed_tokens)
        if hit == 0 and retry:
            return None
        return hit

    def _window_ready(self, state: RequestState, end: int) -> bool:
        """Whether every sliding-window group holds the chunks its window needs at chunk ``end``."""
        for g, spec in enumerate(self.groups):
            if spec.sliding_window is None:
                continue
            first_token = max(0, end * self.chunk_tokens - spec.sliding_window)
            keys = state.group_keys(self.keys, g, end)[first_token // self.chunk_tokens : end]
            if self.manager.lookup(keys).ready < len(keys):
                return False
        return True

    def _ready(self, chunk_keys: list[ChunkKey], block: int) -> bool:
        return (
            self.manager.lookup(chunk_keys[block // self.factor : block // self.factor + 1]).ready
            == 1
        )

    def on_alloc(
        self, req_id: str, block_ids: Sequence[Sequence[int]], num_external_tokens: int
    ) -> None:
        """The engine allocated ``block_ids`` (per group, whole request): plan the hit's load."""
        state = self.requests[req_id]
        state.block_ids = [list(ids) for ids in block_ids]
        if state.lookup_end:  # count each lookup once: vLLM calls this again after a load
            hit_chunks = num_external_tokens // self.chunk_tokens
            self.stats.lookups += 1
            self.stats.cpu.hit_chunks += hit_chunks
            self.stats.cpu.miss_chunks += state.lookup_end - state.lookup_start - hit_chunks
            state.lookup_start = state.lookup_end = 0
        if num_external_tokens == 0:
            return
        start, end = state.num_computed_tokens, state.num_computed_tokens + num_external_tokens
        keys: list[ChunkKey] = []
        ids: list[int] = []
        sizes, starts = [], []
        for g, spec in enumerate(self.groups):
            first, last = start // self.block_tokens, end // self.block_tokens
            chunk_keys = state.group_keys(self.keys, g, -(-last // self.factor))
            blocks = state.block_ids[g]
            # a sliding window keeps only its last blocks (the others are NULL_BLOCK), and only
            # those chunks were required by lookup; skip what lies before them
            while first < last and (
                blocks[first] == NULL_BLOCK
                or (spec.sliding_window is not None and not self._ready(chunk_keys, first))
            ):
                first += 1
            keys += chunk_keys[first // self.factor :] if first < last else []
            ids += blocks[first:last]
            sizes.append(last - first)
            starts.append(first)
            state.stored_upto[g] = max(state.stored_upto[g], end // self.chunk_tokens)
        job_id = self._new_job(_Job(req_id, keys, store=False))
        slots = self.manager.prepare_load(keys).slots
        self._plan.loads.append(
            LoadJob(
                job_id,
                req_id,
                HostChunks(np.array(slots, dtype=np.int64)),
                EngineBlocks(np.array(ids, dtype=np.int64), tuple(sizes), tuple(starts)),
            )
        )
        state.load_job = job_id

    # ---- each step -------------------------------------------------------------------------

    def build_plan(
        self, scheduled: Iterable[ScheduledRequest], preempted: Iterable[str] = ()
    ) -> StepPlan:
        """This step's loads (from ``on_alloc``), stores of the chunks it completes, flushes."""
        scheduled = list(scheduled)
        flush: set[int] = set()
        for req_id in preempted:  # its blocks went back to the pool: finish what reads them
            state = self.requests.get(req_id)
            self.stats.preemptions += 1
            if state is not None:
                flush.update(state.store_jobs)
                state.block_ids = [[] for _ in self.groups]
                state.planned = [0] * len(self.groups)
        for request in scheduled:
            state = self.requests.get(request.req_id)
            if state is None:
                continue
            state.block_ids = [list(ids) for ids in request.block_ids]
            # a block table only grows (a preempted request starts over): the tail is new, and
            # a store still reading one of those blocks must finish before the engine writes it
            for g, ids in enumerate(state.block_ids):
                for block in ids[state.planned[g] :]:
                    flush.update(self._block_jobs.get(block, ()))
                state.planned[g] = len(ids)
        for request in scheduled:
            state = self.requests.get(request.req_id)
            if state is not None:
                self._plan_stores(state, request.num_computed_tokens)
        plan, self._plan = self._plan, StepPlan(num_chunks=self.manager.capacity)
        plan.flush = sorted(flush)
        return plan

    def _plan_stores(self, state: RequestState, num_computed_tokens: int) -> None:
        full = min(num_computed_tokens // self.chunk_tokens, len(state.block_hashes) // self.factor)
        runs: list[list[tuple[int, int, int]]] = []  # per group: (group, first chunk, end chunk)
        offered: list[ChunkKey] = []
        for g in range(len(self.groups)):
            keys = state.group_keys(self.keys, g, full) if full > state.stored_upto[g] else []
            chunks = [c for c in range(state.stored_upto[g], full) if self._computed(state, g, c)]
            state.stored_upto[g] = max(state.stored_upto[g], full)
            offered += [keys[c] for c in chunks]
            runs.append([(g, c, c + 1) for c in chunks])
        if not offered:
            return
        plan = self._prepare_store(offered)
        if plan is None:
            return
        self._record_evictions(plan.evicted)
        slot_of = dict(zip(plan.keys, plan.slots, strict=True))
        for group_runs in runs:  # keep the chunks prepare_store took, merge neighbours
            kept = [r for r in group_runs if state.keys[r[0]][r[1]] in slot_of]
            group_runs[:] = _merge(kept)
        for i in range(max(map(len, runs), default=0)):
            self._add_store_job(state, [r[i] if i < len(r) else None for r in runs], slot_of)

    def _prepare_store(self, offered: list[ChunkKey]) -> StorePlan | None:
        """Reserve slots for as long a prefix of ``offered`` as there is room for.

        Chunks pinned by loads or still being stored cannot be evicted, so a busy step may not
        fit all of them; the earliest chunks of a prompt are the most reused, so keep those.
        """
        for count in range(min(len(offered), self.manager.room), 0, -1):
            plan = self.manager.prepare_store(offered[:count])
            if plan is not None:
                self.stats.cpu.skipped_stores += len(offered) - count
                return plan
        self.stats.cpu.skipped_stores += len(offered)
        return None

    def _computed(self, state: RequestState, group: int, chunk: int) -> bool:
        blocks = state.block_ids[group][chunk * self.factor : (chunk + 1) * self.factor]
        return len(blocks) == self.factor and NULL_BLOCK not in blocks

    def _add_store_job(
        self,
        state: RequestState,
        runs: list[tuple[int, int, int] | None],
        slot_of: Mapping[Key, int],
    ) -> None:
        keys: list[ChunkKey] = []
        ids: list[int] = []
        sizes, starts = [], []
        for g, run in enumerate(runs):
            if run is None:
                sizes.append(0)
                starts.append(0)
                continue
            _, first, end = run
            keys += state.keys[g][first:end]
            ids += state.block_ids[g][first * self.factor : end * self.factor]
            sizes.append((end - first) * self.factor)
            starts.append(first * self.factor)
        job_id = self._new_job(_Job(state.req_id, keys, store=True, blocks=ids))
        for block in ids:
            self._block_jobs.setdefault(block, set()).add(job_id)
        state.store_jobs.add(job_id)
        self._plan.stores.append(
            StoreJob(
                job_id,
                state.req_id,
                EngineBlocks(np.array(ids, dtype=np.int64), tuple(sizes), tuple(starts)),
                HostChunks(np.array([slot_of[k] for k in keys], dtype=np.int64)),
            )
        )

    # ---- completions -----------------------------------------------------------------------

    def on_report(self, report: WorkerReport) -> None:
        """Count the ranks that finished each job; a job every rank finished is completed."""
        for job_id, outcome in report.jobs.items():
            job = self._jobs.get(job_id)
            if job is None:
                logger.warning("kvtier: report for unknown transfer job %d", job_id)
                continue
            job.ranks += outcome.ranks
            job.failed += outcome.failed
            job.bytes += outcome.bytes
            job.seconds = max(job.seconds, outcome.seconds)
            if job.ranks >= self.num_workers:
                self._complete(job_id, self._jobs.pop(job_id))

    def _complete(self, job_id: int, job: _Job) -> None:
        cpu = self.stats.cpu
        state = self.requests[job.req_id]
        if job.store:
            self.manager.complete_store(job.keys, success=not job.failed)
            for block in job.blocks:
                jobs = self._block_jobs[block]
                jobs.discard(job_id)
                if not jobs:
                    del self._block_jobs[block]
            state.store_jobs.discard(job_id)
            if job.failed:
                cpu.failed_stores += 1
            else:
                cpu.stored_chunks += len(job.keys)
                cpu.stored_bytes += job.bytes
                cpu.store_seconds += job.seconds
        else:
            self.manager.complete_load(job.keys)
            self.manager.touch(job.keys)
            state.load_job = None
            if job.failed:
                cpu.failed_loads += 1
            else:
                cpu.loaded_chunks += len(job.keys)
                cpu.loaded_bytes += job.bytes
                cpu.load_seconds += job.seconds
        if state.finished and state.idle:
            del self.requests[job.req_id]

    def request_finished(self, req_id: str) -> bool:
        """The request ended. True: keep its blocks until the workers report its stores done."""
        state = self.requests.get(req_id)
        if state is None:
            return False
        state.finished = True
        if state.store_jobs:
            self._plan.held.append(req_id)
            return True
        if state.idle:
            del self.requests[req_id]
        return False

    @property
    def has_jobs_in_flight(self) -> bool:
        return bool(self._jobs)

    def take_events(self) -> list[TierEvent]:
        events = self.manager.take_events()
        return [e for e in events if e.kind in (EventKind.STORED, EventKind.REMOVED)]

    def check_integrity(self) -> None:
        self.manager.check_integrity()
        pinned = sum(len(j.keys) for j in self._jobs.values() if not j.store)
        assert self.manager.num_pinned == pinned, (self.manager.num_pinned, pinned)

    # ---- helpers ---------------------------------------------------------------------------

    def _new_job(self, job: _Job) -> int:
        job_id, self._next_job = self._next_job, self._next_job + 1
        self._jobs[job_id] = job
        return job_id

    def _record_evictions(self, evicted: Sequence[object]) -> None:
        self.stats.cpu.evicted_chunks += len(evicted)


def _merge(runs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    merged: list[tuple[int, int, int]] = []
    for run in runs:
        if merged and merged[-1][2] == run[1]:
            merged[-1] = (run[0], merged[-1][1], run[2])
        else:
            merged.append(run)
    return merged

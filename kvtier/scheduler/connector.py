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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.config import KVTierConfig
from kvtier.counters import KVTierStats
from kvtier.keys import ChunkKey, ChunkKeyMaker
from kvtier.scheduler.base import TierEvent
from kvtier.scheduler.job_table import Job, JobTable
from kvtier.scheduler.jobs import LoadJob, StepPlan, WorkerReport
from kvtier.scheduler.manager import ChunkManager
from kvtier.scheduler.request import RequestState
from kvtier.scheduler.store_planner import NULL_BLOCK, StorePlanner
from kvtier.worker.base import EngineBlocks, HostChunks


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
        self._jobs = JobTable(num_workers)
        self._stores = StorePlanner(
            self.manager, self._jobs, self.keys, self.block_tokens, self.stats.cpu
        )
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
        job_id = self._jobs.add(Job(req_id, keys, store=False))
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
                flush.update(self._jobs.reading(ids[state.planned[g] :]))
                state.planned[g] = len(ids)
        for request in scheduled:
            state = self.requests.get(request.req_id)
            if state is not None:
                self._plan.stores += self._stores.plan(state, request.num_computed_tokens)
        plan, self._plan = self._plan, StepPlan(num_chunks=self.manager.capacity)
        plan.flush = sorted(flush)
        return plan

    # ---- completions -----------------------------------------------------------------------

    def on_report(self, report: WorkerReport) -> None:
        """Count the ranks that finished each job; a job every rank finished is completed."""
        for job_id, outcome in report.jobs.items():
            job = self._jobs.report(job_id, outcome)
            if job is not None:
                self._complete(job_id, job)

    def _complete(self, job_id: int, job: Job) -> None:
        cpu, outcome = self.stats.cpu, job.outcome
        state = self.requests[job.req_id]
        if job.store:
            self.manager.complete_store(job.keys, success=not outcome.failed)
            state.store_jobs.discard(job_id)
            if outcome.failed:
                cpu.failed_stores += 1
            else:
                cpu.stored_chunks += len(job.keys)
                cpu.stored_bytes += outcome.bytes
                cpu.store_seconds += outcome.seconds
        else:
            self.manager.complete_load(job.keys)
            state.load_job = None
            if outcome.failed:  # drop what it read: the engine's retry must miss, not fail again
                self.manager.remove(job.keys)
                cpu.failed_loads += 1
            else:
                self.manager.touch(job.keys)
                cpu.loaded_chunks += len(job.keys)
                cpu.loaded_bytes += outcome.bytes
                cpu.load_seconds += outcome.seconds
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
        """Chunks stored in or removed from the host tier since the last call."""
        return self.manager.take_events()

    def check_integrity(self) -> None:
        self.manager.check_integrity()
        pinned = sum(len(job.keys) for job in self._jobs if not job.store)
        assert self.manager.num_pinned == pinned, (self.manager.num_pinned, pinned)

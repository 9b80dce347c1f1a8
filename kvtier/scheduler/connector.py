"""The scheduler half: which chunks a request can load, which it stores, and when a job is done.

Engine-independent: the vLLM adapter turns its calls into these, with plain data.

    lookup(req, block_hashes, num_computed_tokens) -> int | None   tokens loadable beyond the hit
    on_alloc(req, block_ids, num_external_tokens)                  pin the hit, plan its load
    build_plan(scheduled, preempted)            -> StepPlan         this step's loads and stores
    on_report(report)                                               count ranks; finish jobs
    request_finished(req)                       -> bool             True: hold blocks for stores
    add_source(source)                                              a request source
    provenance(req, prompt_tokens)              -> Provenance|None  where its prompt's KV came from
    drop_host_chunks()                          -> bool             forget the host tier's chunks

A job is done only when every worker rank reported it (``num_workers`` reports). Loads finish
before the request runs (the engine waits for them); stores run after the step's forward, and an
earlier store whose engine blocks are handed to someone else is flushed before the next forward.

Below host memory is a chain of tiers (``lower_tier.py``, built from the tiers' specs in the order
of ``tiers/registry.py``). A hit is one run of chunks across host memory and the chain: one load
job per tier.
Chunks loaded from a lower tier are stored in the host tier again (they are hot), and host chunks
reach each lower tier as ``tier_writes.py`` decides. Request sources (``request_source.py``: a
prefill engine's KV) are asked for the requests they claim, outside the chain.

Over 300 lines because it is the scheduler half's one entry point: each method is short and
hands its work to the planners it imports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kvtier.config import KVTierConfig
from kvtier.counters import KVTierStats, TierStats
from kvtier.keys import ChunkKey, ChunkKeyMaker
from kvtier.scheduler.costs import HitCosts
from kvtier.scheduler.failed_loads import offer_again, untrusted_stores
from kvtier.scheduler.hit_policy import HitPolicy, HitRequest, choose_hit
from kvtier.scheduler.job_table import Job, JobKind, JobTable
from kvtier.scheduler.load_planner import GroupSpec, HitRun, LoadPlanner
from kvtier.scheduler.prefix_events import HOST, PrefixEvent, PrefixEvents
from kvtier.scheduler.provenance import JobLog, Provenance, provenance
from kvtier.scheduler.request import RequestState
from kvtier.scheduler.scheduled import (
    NEVER,
    ScheduledRequest,
    StepRequests,
    forget_blocks,
    take_blocks,
)
from kvtier.scheduler.sources import Sources
from kvtier.scheduler.store_planner import StorePlanner
from kvtier.scheduler.tail_store import TailStore
from kvtier.scheduler.tier_writes import TierWrites
from kvtier.step_plan import StepPlan, WorkerReport
from kvtier.tiers.base.index import TierIndex
from kvtier.tiers.base.results import EventKind
from kvtier.tiers.base.source import RequestSource
from kvtier.tiers.host.index import ChunkManager

__all__ = ["GroupSpec", "ScheduledRequest", "SchedulerConnector", "StepRequests"]


class SchedulerConnector:
    def __init__(
        self,
        config: KVTierConfig,
        groups: Sequence[GroupSpec],
        num_chunks: int,
        num_workers: int,
        key_maker: ChunkKeyMaker,
        lower: Sequence[TierIndex] = (),
        prefix_events: bool = False,
        clock: Callable[[], float] | None = None,
        chunk_bytes: int = 0,
    ) -> None:
        """``lower``: the tier chain below host memory, in order. ``prefix_events``: tell a
        router which prefixes each tier holds (``take_events``). ``clock`` (seconds,
        monotonic): what the engine's steps are timed with, so that a hit is decided by
        its measured costs (``costs/``); None: never timed, the rules decide.
        ``chunk_bytes``: a host chunk's bytes on all ranks (its ``usage``)."""
        block_tokens = {g.block_tokens for g in groups}
        if len(block_tokens) != 1:
            raise ValueError(f"kvtier: KV cache groups with different block sizes {block_tokens}")
        self.groups = tuple(groups)
        self.block_tokens = block_tokens.pop()
        self.factor = key_maker.block_size_factor
        self.chunk_tokens = self.block_tokens * self.factor
        self.num_workers = num_workers
        self._policy = HitPolicy(self.chunk_tokens, len(groups) == 1, config.min_async_load_tokens)
        self.costs = HitCosts(clock, self._policy.wait_tokens) if clock is not None else None
        self.keys = key_maker
        self.manager = ChunkManager(
            num_chunks, config.eviction_policy, config.store_threshold, chunk_bytes=chunk_bytes
        )
        self.stats = KVTierStats()
        self.job_log = JobLog()  # finished jobs: latency samples, each request's load record
        self.requests: dict[str, RequestState] = {}
        self.jobs = JobTable(num_workers)
        self._stores = StorePlanner(
            self.manager, self.jobs, self.keys, self.block_tokens, self.stats.cpu
        )
        self._tails = TailStore(self.keys, self.block_tokens)
        self.lower = tuple(lower)
        self._loads = LoadPlanner(
            self.groups, self.keys, self.block_tokens, self.manager, self.lower, self.jobs,
            self.stats,
        )  # fmt: skip
        self._plan = StepPlan(num_chunks=num_chunks)
        self.sources = Sources(self.stats, self.jobs, self.chunk_tokens)
        self._writes: dict[str, TierWrites] = {}  # per lower tier, by name
        for tier in self.lower:
            if tier.name in self.stats.tiers:
                raise ValueError(f"kvtier: two tiers named {tier.name!r}")
            stats = self.stats.tiers[tier.name] = TierStats()
            self._writes[tier.name] = TierWrites(tier, self.manager, self.jobs, stats)
        self._tiers = {tier.name: tier for tier in self.lower}
        self._counted = config.store_threshold > 1  # every lookup counts towards admission
        self.prefixes = (
            PrefixEvents(self.block_tokens, self.factor, [(t.name, t.holds) for t in self.lower])
            if prefix_events
            else None
        )
        # every running request is at least this many tokens from its ``due`` (0: look)
        self._slack = 0
        self._computed = 0  # at most the tokens a running request computed by the last step
        self._untrusted: set[tuple[int, str]] = set()  # store parts (job, request) to fail
        self._reported: dict[int, Job] = {}  # jobs the report being handled completed

    def add_source(self, source: RequestSource) -> None:
        """A request source (``tiers/base/source.py``), counted under its name in the stats."""
        self.sources.add(source)

    def source_lookup(
        self,
        name: str,
        req_id: str,
        block_hashes: Sequence[bytes],
        params: Mapping[str, Any] | None,
        num_prompt_tokens: int,
        num_computed_tokens: int,
    ) -> int:
        """Tokens request source ``name`` loads for ``req_id`` (a decode's pull), beyond
        ``num_computed_tokens``, asynchronously (0: not its request); planned by ``on_alloc``."""
        tokens = self.sources.by_name[name].lookup(params, num_prompt_tokens, num_computed_tokens)
        if tokens == 0 or params is None:
            return 0
        self.sources.claim(name, self.state(req_id, block_hashes), params, num_computed_tokens)
        return tokens

    def tier(self, name: str) -> TierIndex:
        """The chain's tier ``name`` (KeyError: none)."""
        return self._tiers[name]

    # ---- lookup and load -------------------------------------------------------------------

    def lookup(
        self,
        req_id: str,
        block_hashes: Sequence[bytes],
        num_computed_tokens: int,
        num_tokens: int | None = None,
        tail_tokens: Sequence[int] | None = None,
        token_ids: Sequence[int] = (),
    ) -> int | None:
        """Tokens beyond ``num_computed_tokens`` worth loading from kvtier; None asks the engine
        to try again next step (the next chunk's store is in flight, and worth waiting for).

        ``num_tokens`` is the request's length and ``tail_tokens`` its tokens after its last full
        block (None: the tokens do not name the KV, e.g. multimodal input: no tail). Which hit
        is worth loading, and whether synchronously (``loads_async``): ``hit_policy.py``.
        """
        state = self.state(req_id, block_hashes, token_ids)
        first = num_computed_tokens // self.chunk_tokens
        full = len(block_hashes) // self.factor
        state.num_computed_tokens = num_computed_tokens
        state.lookup_start, state.lookup_end = first, max(first, full)
        state.load_async, state.declined = False, ()
        state.due = self._slack = 0  # its tail may be new: looked at in its next step
        if state.load_jobs:
            return 0
        tail = self._tails.key(state, num_tokens, tail_tokens) if len(self.groups) == 1 else None
        if full <= first and tail is None:
            return 0
        run = self._loads.hit_run(state, first, full) if full > first else HitRun(first, first)
        if run.end == first < full and not (run.retry or run.pending) and not self._counted:
            return 0  # a miss from the first chunk on (no tail can follow): most new prompts
        tail_ready = tail is not None and self.manager.lookup([tail]).ready == 1
        costs = self.costs.view() if self.costs is not None else None
        request = HitRequest(num_computed_tokens, num_tokens, first, full)
        hit = choose_hit(run, request, self._policy, tail_ready, costs)
        state.load_async, state.declined = hit.load_async, hit.declined
        if self.costs is not None and costs is not None and hit.tokens is not None:
            self.costs.decided(hit.tiers, [part.tier for part in hit.declined])
        return hit.tokens

    def state(
        self, req_id: str, block_hashes: Sequence[bytes], token_ids: Sequence[int] = ()
    ) -> RequestState:
        """``req_id``'s state, created at its first lookup."""
        state = self.requests.get(req_id)
        if state is None:
            state = self.requests[req_id] = RequestState(
                req_id, block_hashes, len(self.groups), token_ids
            )
            if self.costs is not None:
                self.costs.started()
        return state

    def loads_async(self, req_id: str) -> bool:
        """Whether the last ``lookup`` of ``req_id`` answered a hit that makes the request wait."""
        state = self.requests.get(req_id)
        return state is not None and state.load_async

    def on_alloc(
        self, req_id: str, block_ids: Sequence[Sequence[int]], num_external_tokens: int
    ) -> None:
        """The engine allocated ``block_ids`` (per group, whole request): plan the hit's load."""
        state = self.requests[req_id]
        state.block_ids = [list(ids) for ids in block_ids]
        state.table_set = True
        state.due = self._slack = 0  # its next step reads its whole table
        load = self.sources.plan(state, num_external_tokens)
        if load is not None:
            self._plan.loads.append(load)
            return
        self._plan.loads += self._loads.plan(state, num_external_tokens)

    # ---- each step -------------------------------------------------------------------------

    def build_plan(
        self,
        scheduled: StepRequests | Iterable[ScheduledRequest],
        preempted: Iterable[str] = (),
        forward: bool = True,
    ) -> StepPlan:
        """This step's loads (from ``on_alloc``), stores of the chunks it completes, flushes.

        Costs what changed this step (the requests' new blocks, the chunks they complete), never
        the requests' whole tables (``scheduled.py``); a running request with no new block and
        nothing to store (``RequestState.due``) costs no Python step at all.
        """
        step = scheduled if isinstance(scheduled, StepRequests) else StepRequests.of(scheduled)
        if self.costs is not None:  # a step whose forward waits for a load times no compute
            tokens = sum(step.num_new_tokens.values()) if forward else 0
            sync = any(load.sync for load in self._plan.loads)
            self.costs.step(tokens, len(step) if forward else 0, timed=not sync)
        self._tier_events()  # before this step's writes: a chunk is told in a tier once written
        flush: set[int] = set()
        for req_id in preempted:  # its blocks went back to the pool: finish what reads them
            state = self.requests.get(req_id)
            self.stats.preemptions += 1
            if state is not None:
                flush.update(state.store_jobs)
                forget_blocks(state)
        # a store still reading a block the engine writes this step (a block newly handed to a
        # request, or a load's destination) must finish before the forward
        for load in self._plan.loads:
            flush.update(self.jobs.reading(load.dst.block_ids.tolist()))
        windows = [group.sliding_window for group in self.groups]
        visit: Sequence[int] = ()
        slack = NEVER  # after this step: how far every running request is from its due
        if any(w is not None for w in windows):  # frees blocks in place, unannounced: every
            visit, slack = range(len(step)), 0  # request, every step
        elif step.quiet(self._slack, self._computed):  # most decode steps: nothing to look at
            slack = self._slack - max(step.num_new_tokens.values(), default=0)
        else:
            visit, slack = step.due(self.requests)
        tracked: list[tuple[RequestState, int]] = []  # (state, tokens computed after the step)
        for i in visit:
            request = step.request(i)
            state = self.requests.get(request.req_id)
            for ids in take_blocks(state, request, windows, self.block_tokens):
                if ids:
                    flush.update(self.jobs.reading(ids))
            if state is None:
                continue
            state.table_set = False
            computed = request.num_computed_tokens
            if computed >= self._due(state):
                tracked.append((state, computed))
            else:
                state.due = self._due(state)
                slack = min(slack, state.due - computed)
        offers = [self._stores.offer(state, computed) for state, computed in tracked]
        tails = [self._tails.offer(state, computed) for state, computed in tracked]
        self._plan.stores += self._stores.plan(
            [offer for offer in offers if offer is not None],
            [tail for tail in tails if tail is not None],
        )
        for state, computed in tracked:
            state.due = self._due(state)
            slack = min(slack, state.due - computed)
        self._slack, self._computed = slack, step.computed_after()
        evicted = self._stores.take_evicted()
        for writes in self._writes.values():
            writes.evicted(evicted)
            writes.flush(idle=not self.requests)
            self._plan.tier_writes += writes.take_plan()
        plan, self._plan = self._plan, StepPlan(num_chunks=self.manager.capacity)
        plan.flush = sorted(flush)
        plan.forward = forward
        rooms = {tier.name: tier.usage().room for tier in self.lower}
        plan.tier_room = {name: room for name, room in rooms.items() if room is not None}
        plan.messages.update(self.sources.messages())
        return plan

    def _due(self, state: RequestState) -> int:
        """The tokens computed at which ``state``'s next chunk, or its tail, can be stored."""
        due = (min(state.stored_upto) + 1) * self.chunk_tokens
        if state.tail_key is not None and not state.tail_done:
            due = min(due, state.tail_end)
        return due

    # ---- completions -----------------------------------------------------------------------

    def on_report(self, report: WorkerReport) -> None:
        """Count the ranks that finished each job; a job every rank finished is completed.

        Loads complete before stores: a store whose KV came from a failed synchronous load must
        be known as such when it completes (``failed_loads.py``)."""
        done = self._reported  # completed by this report, not yet handled
        for job_id, outcome in report.jobs.items():
            job = self.jobs.report(job_id, outcome)
            if job is not None:
                done[job_id] = job
        for job_id in sorted(done, key=lambda job_id: done[job_id].store):  # loads first
            self._complete(job_id, done.pop(job_id))

    def _complete(self, job_id: int, job: Job) -> None:
        if job.kind is JobKind.STORE:
            self.job_log.finished(job, None)
            self._complete_stores(job_id, job)
            return
        self.job_log.finished(job, self.requests.get(job.req_id))
        if job.kind is JobKind.TIER_WRITE:
            self._writes[job.tier].complete(job)
            if self.prefixes is not None:
                self.prefixes.written(job.tier, job.keys, self._tiers[job.tier].holds)
            return
        state = self.requests[job.req_id]
        self._complete_load(job)
        state.load_jobs.discard(job_id)
        if state.finished and state.idle:
            del self.requests[job.req_id]

    def _complete_stores(self, job_id: int, job: Job) -> None:
        """Every rank finished a step's store job: its parts' chunks are loadable, and dirty
        for each lower tier, unless it failed; a part whose KV may come from a failed
        synchronous load (``untrusted``) fails alone, its chunks never stored."""
        cpu, outcome = self.stats.cpu, job.outcome
        stored: list[ChunkKey] = []  # loadable now
        below: list[ChunkKey] = []  # and to write to the lower tiers (not prompt tails)
        ok = [not outcome.failed] * len(job.parts)
        for i, part in enumerate(job.parts):
            untrusted = bool(self._untrusted) and (job_id, part.req_id) in self._untrusted
            if outcome.failed or untrusted:
                ok[i] = False
                self.manager.complete_store({}, part.keys)
                cpu.failed_stores += 1
                cpu.untrusted_stores += untrusted * len(part.keys)
                if part.keys:  # the workers' host copies name no chunk (a shutdown flush skips)
                    self._plan.forget += part.keys
            else:
                stored += part.keys
                if not part.host_only:
                    below += part.keys
        if stored:
            self.manager.complete_store(dict.fromkeys(stored, 0))
            cpu.stored_chunks += len(stored)
            cpu.stored_bytes += outcome.bytes * len(stored) // max(1, len(job.keys))
            cpu.store_seconds += outcome.seconds
            for writes in self._writes.values():
                writes.stored(below)
        for part, described in zip(job.parts, ok, strict=True):
            if self.prefixes is not None and part.runs and described:
                self.prefixes.describe(self.requests[part.req_id], part.runs)
        for req_id in dict.fromkeys(part.req_id for part in job.parts):  # a request's parts
            if self._untrusted:
                self._untrusted.discard((job_id, req_id))
            state = self.requests[req_id]
            state.store_jobs.discard(job_id)
            if state.finished and state.idle:
                del self.requests[req_id]

    def _complete_load(self, job: Job) -> None:
        outcome = job.outcome
        if job.kind is JobKind.SOURCE_LOAD:
            self.sources.complete(job, self.requests.get(job.req_id))
            return
        lower = self._tiers.get(job.tier) if job.kind is JobKind.TIER_LOAD else None
        stats = self.stats.tiers[job.tier if lower is not None else "cpu"]
        # a failed load drops what it read (all, or the chunks found bad): the engine's retry
        # must miss them, not fail again
        bad = [job.keys[i] for i in outcome.bad] if outcome.bad else job.keys
        if lower is not None:
            dropped = bad if outcome.failed else []
            lower.complete_load(job.keys, dropped)  # every bad chunk, every rank's copy
            stats.bad_chunks += len(outcome.bad)
            # a dropped chunk's copy already in the host tier (another request computed it) is
            # dirty again; one stored later is dirty as it completes (the tier no longer holds it)
            self._writes[job.tier].stored([key for key in dropped if self.manager.is_ready(key)])
        else:
            if job.pinned:
                self.manager.complete_load(job.keys)
            if outcome.failed:
                removed = self.manager.remove(bad)
                for writes in self._writes.values():
                    writes.removed(removed)  # type: ignore[arg-type]
        if outcome.failed:
            stats.failed_loads += 1
            if job.sync:
                self._distrust(job)
            return
        if lower is None:
            self.manager.touch(job.keys)
        if self.costs is not None:
            self.costs.loaded(job.tier if lower is not None else "cpu", job.tokens, outcome.seconds)
        stats.loaded_chunks += len(job.keys)
        stats.loaded_bytes += outcome.bytes
        stats.load_seconds += outcome.seconds

    def _distrust(self, load: Job) -> None:
        """``load`` ran before its step's forward and failed: the stores in flight that may
        hold KV computed from its blocks fail as they complete, and their chunks are offered
        again once the engine recomputed them (``failed_loads.py``)."""
        for job_id, state in untrusted_stores(load, self.requests):
            self._untrusted.add((job_id, state.req_id))
            job = self.jobs.get(job_id) or self._reported[job_id]
            for part in job.parts_of(state.req_id):
                offer_again(state, part)
            self._slack = 0  # offered again: looked at in its next step

    def request_finished(self, req_id: str) -> bool:
        """The request ended. True: keep its blocks until the workers release them: its stores
        are done, and a request source holding them released them (a decode engine pulled
        them, or stopped being waited for; the source is told first).

        Its provenance is gone after this call: ask ``provenance`` before.
        """
        self.job_log.forget(req_id)
        offered = self.sources.holds(req_id)
        state = self.requests.get(req_id)
        storing = state is not None and bool(state.store_jobs)
        if offered or storing:
            self._plan.held.append(req_id)
        if state is not None:
            if self.costs is not None and not state.finished:
                self.costs.ended()
            state.finished = True
            if state.idle:
                del self.requests[req_id]
        return offered or storing

    def provenance(self, req_id: str, prompt_tokens: int) -> Provenance | None:
        """Where the KV of ``req_id``'s ``prompt_tokens`` came from (None: never looked up)."""
        state = self.requests.get(req_id)
        if state is None:
            return None
        return provenance(state, self.job_log.loads(req_id), prompt_tokens, tuple(self.stats.tiers))

    def drop_host_chunks(self) -> bool:
        """Forget every host-tier chunk no transfer uses (the engine's connector-cache reset).

        Chunks pinned by a load or a tier write, and stores in flight, stay. The chain's tiers are
        kept: they persist across restarts and may be shared by other engines. Chunks not yet
        written to them are lost. True when no loadable host chunk is left.
        """
        removed = self.manager.remove(list(self.manager.stored()))
        for writes in self._writes.values():
            writes.removed(removed, reset=True)  # type: ignore[arg-type]
        return not self.manager.stored()

    @property
    def has_jobs_in_flight(self) -> bool:
        return bool(self.jobs)

    @property
    def has_pending_work(self) -> bool:
        """Transfers in flight, chunks to write to a tier once the engine is idle, or finished
        requests a request source holds."""
        writes = any(writes.pending for writes in self._writes.values())
        return bool(self.jobs) or writes or self.sources.pending

    def take_events(self) -> list[PrefixEvent]:
        """The prefixes each tier started or stopped holding since the last call, in the
        engine's block hashes (``prefix_events.py``; none unless ``prefix_events``)."""
        self._tier_events()
        return self.prefixes.take() if self.prefixes is not None else []

    def _tier_events(self) -> None:
        """Hand what the tiers stored and removed to ``prefixes`` (read every step, so that
        nothing piles up when no router is told). A chunk stored into host memory is told in
        the lower tiers that hold it too: only one written before (this step plans none yet)."""
        prefixes = self.prefixes
        for event in self.manager.take_events():
            if prefixes is not None:
                keys: list[ChunkKey] = event.keys  # type: ignore[assignment]
                if event.kind is EventKind.STORED:
                    prefixes.stored(HOST, keys)
                else:
                    prefixes.removed(HOST, keys)
        for tier in self.lower:
            removed = tier.take_removed()
            if removed and prefixes is not None:
                prefixes.removed(tier.name, removed)

    def check_integrity(self) -> None:
        self.manager.check_integrity()
        pinned = sum(len(job.keys) for job in self.jobs if job.pinned)
        assert self.manager.num_pinned == pinned, (self.manager.num_pinned, pinned)
        for tier in self.lower:
            tier.check_integrity()

"""The scheduler half: which chunks a request can load, which it stores, and when a job is done.

Engine-independent: the vLLM adapter turns its calls into these, with plain data. Each call
hands its work to a part: ``lookups.py`` (a request's hit), ``load_planner.py`` and
``sources.py`` (its load), ``step_plans.py`` (a step's plan: its stores, ``store_planner.py``,
``tail_store.py``, and writes to the chain, ``tier_writes.py``), ``completions.py`` (jobs done).

    lookup(req, block_hashes, num_computed_tokens) -> int | None   tokens loadable beyond the hit
    loads_async(req) / may_load_async(hashes, num_tokens) -> bool   it waits for its load / may
    on_alloc(req, block_ids, num_external_tokens)                  pin the hit, plan its load
    build_plan(scheduled, preempted, ...)       -> StepPlan         this step's loads and stores
    on_report(report)                                               count ranks; finish jobs
    request_finished(req)                       -> bool             True: hold blocks for stores
    add_source(source)                                              a request source
    provenance(req, prompt_tokens)              -> Provenance|None  where its prompt's KV came from
    drop_host_chunks()                          -> bool             forget the host tier's chunks

A job is done only when every worker rank reported it (``num_workers`` reports). Loads finish
before the request runs (the engine waits for them); stores run after the step's forward, and an
earlier store whose engine blocks are handed to someone else is flushed before the next forward.

Below host memory is a chain of tiers (``tiers/base/index.py``, built from the tiers' specs in
the order of ``tiers/registry.py``). A hit is one run of chunks across host memory and the
chain: one load job per tier. Chunks loaded from a lower tier are stored in the host tier again
(they are hot). Request sources (``tiers/base/source.py``: a prefill engine's KV) are asked for
the requests they claim, outside the chain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kvtier.config import KVTierConfig
from kvtier.counters import KVTierStats, TierStats
from kvtier.keys import ChunkKeyMaker
from kvtier.scheduler.completions import Completions
from kvtier.scheduler.costs import HitCosts
from kvtier.scheduler.hit import GroupSpec
from kvtier.scheduler.hit_policy import HitPolicy
from kvtier.scheduler.job_table import JobTable
from kvtier.scheduler.load_planner import LoadPlanner
from kvtier.scheduler.lookups import Lookups
from kvtier.scheduler.prefix_events import PrefixEvent, PrefixEvents, tell_tier_events
from kvtier.scheduler.provenance import JobLog, Provenance, provenance
from kvtier.scheduler.request import RequestState
from kvtier.scheduler.scheduled import ScheduledRequest, StepRequests
from kvtier.scheduler.sources import Sources
from kvtier.scheduler.step_plans import StepPlans
from kvtier.scheduler.step_visits import StepVisits
from kvtier.scheduler.store_planner import StorePlanner
from kvtier.scheduler.tail_store import TailStore
from kvtier.scheduler.tier_writes import TierWrites, drop_host_chunks
from kvtier.step_plan import StepPlan, WorkerReport
from kvtier.tiers.base.index import TierIndex
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
        chain_before_forward: bool = True,
    ) -> None:
        """``lower``: the tier chain below host memory, in order. ``prefix_events``: tell a
        router which prefixes each tier holds (``take_events``). ``clock`` (seconds, monotonic):
        what the engine's steps are timed with, so that a hit is decided by its measured costs
        (``costs/``); None: the rules decide. ``chunk_bytes``: a host chunk's bytes, all ranks.
        ``chain_before_forward``: a chain tier's short read may run before the forward."""
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
        self._stores = StorePlanner(self.manager, self.jobs, self.keys, self.block_tokens,
                                    self.stats.cpu)  # fmt: skip
        self._tails = TailStore(self.keys, self.block_tokens)
        self.lower = tuple(lower)
        self._loads = LoadPlanner(
            self.groups, self.keys, self.block_tokens, self.manager, self.lower, self.jobs,
            self.stats, chain_before_forward,
        )  # fmt: skip
        self.sources = Sources(self.stats, self.jobs, self.chunk_tokens)
        self._writes: dict[str, TierWrites] = {}  # per lower tier, by name
        for tier in self.lower:
            if tier.name in self.stats.tiers:
                raise ValueError(f"kvtier: two tiers named {tier.name!r}")
            stats = self.stats.tiers[tier.name] = TierStats()
            self._writes[tier.name] = TierWrites(tier, self.manager, self.jobs, stats)
        self._tiers = {tier.name: tier for tier in self.lower}
        self.prefixes = (PrefixEvents(self.block_tokens, self.factor,
                                      [(t.name, t.holds) for t in self.lower])
                         if prefix_events else None)  # fmt: skip
        self._lookups = Lookups(
            self.manager, self._loads, self._tails, self._policy, self.costs, len(self.groups),
            counted=config.store_threshold > 1,
        )  # fmt: skip
        windows = [group.sliding_window for group in self.groups]
        self._visits = StepVisits(self.requests, self.jobs, windows, self.block_tokens,
                                  self.chunk_tokens)  # fmt: skip
        self._steps = StepPlans(
            self.requests, self.jobs, self.stats, self.manager, self.lower,
            (self._stores, self._tails, self._visits), self._writes, self.sources, self.costs,
            self.prefixes,
        )  # fmt: skip
        self._completions = Completions(
            self.manager, self.jobs, self.job_log, self.requests, self.stats, self._tiers,
            self._writes, self.sources, self.prefixes, self.costs,
        )  # fmt: skip

    def add_source(self, source: RequestSource) -> None:
        """A request source (``tiers/base/source.py``), counted under its name in the stats."""
        self.sources.add(source)

    def source_lookup(
        self, name: str, req_id: str, block_hashes: Sequence[bytes],
        params: Mapping[str, Any] | None, num_prompt_tokens: int, num_computed_tokens: int,
        key_salt: bytes = b"",
    ) -> int:  # fmt: skip
        """Tokens request source ``name`` loads for ``req_id`` (a decode's pull), beyond
        ``num_computed_tokens``, asynchronously (0: not its request); planned by ``on_alloc``.
        ``key_salt`` names the chunks it stores later, as ``lookup``'s."""
        tokens = self.sources.by_name[name].lookup(params, num_prompt_tokens, num_computed_tokens)
        if tokens == 0 or params is None:
            return 0
        state = self.state(req_id, block_hashes)
        state.key_salt = key_salt
        self.sources.claim(name, state, params, num_computed_tokens)
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
        block_tags: Callable[[int, int], object] | None = None,
        key_salt: bytes = b"",
    ) -> int | None:
        """Tokens beyond ``num_computed_tokens`` worth loading from kvtier; None asks the engine
        to try again next step (the next chunk's store is in flight, and worth waiting for).
        ``num_tokens`` is the request's length and ``tail_tokens`` its tokens after its last full
        block (None: the tokens do not name the KV, e.g. multimodal input: no tail); ``block_tags``
        and ``key_salt`` as ``RequestState``'s. Which hit is worth loading, and whether
        synchronously (``loads_async``): ``hit_policy.py``."""
        state = self.state(req_id, block_hashes, token_ids)
        state.block_tags, state.key_salt = block_tags, key_salt
        state.due = 0  # its tail may be new: looked at in its next step
        self._steps.look_again()
        return self._lookups.lookup(state, num_computed_tokens, num_tokens, tail_tokens)

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

    def may_load_async(
        self, block_hashes: Sequence[bytes], num_tokens: int, key_salt: bytes = b""
    ) -> bool:
        """Whether a request may wait for its load, before its lookup (``lookups.py``)."""
        return self._lookups.may_wait(block_hashes, num_tokens, key_salt)

    def on_alloc(
        self, req_id: str, block_ids: Sequence[Sequence[int]], num_external_tokens: int
    ) -> None:
        """The engine allocated ``block_ids`` (per group, whole request): plan the hit's load."""
        state = self.requests[req_id]
        state.block_ids = [list(ids) for ids in block_ids]
        state.table_set = True
        state.due = 0  # its next step reads its whole table
        self._steps.look_again()
        load = self.sources.plan(state, num_external_tokens)
        if load is not None:
            self._steps.next.loads.append(load)
            return
        self._steps.next.loads += self._loads.plan(state, num_external_tokens)

    # ---- each step -------------------------------------------------------------------------

    def build_plan(
        self,
        scheduled: StepRequests | Iterable[ScheduledRequest],
        preempted: Iterable[str] = (),
        forward: bool = True,
        rewritten: Sequence[int] = (),
    ) -> StepPlan:
        """This step's loads (from ``on_alloc``), stores of the chunks it completes, flushes
        (``step_plans.py``). ``rewritten``: blocks the engine writes before its flushes."""
        if rewritten and self._completions.distrust_reading(rewritten):
            self._steps.look_again()  # their chunks offered again
        return self._steps.build(scheduled, preempted, forward)

    # ---- completions -----------------------------------------------------------------------

    def on_report(self, report: WorkerReport) -> None:
        """Count the ranks that finished each job; complete each job every rank finished
        (``completions.py``)."""
        completed = self._completions.report(report)
        self._steps.next.forget += completed.forget
        if completed.offered_again:
            self._steps.look_again()  # offered again: looked at in its next step

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
            self._steps.next.held.append(req_id)
        if state is not None:
            if self.costs is not None and not state.finished:
                self.costs.ended()
            state.finished = True
            if state.idle:
                del self.requests[req_id]
        return offered or storing

    def provenance(self, req_id: str, prompt_tokens: int) -> Provenance | None:
        """Where the KV of ``req_id``'s ``prompt_tokens`` came from (None: never looked up)."""
        if (state := self.requests.get(req_id)) is None:
            return None
        return provenance(state, self.job_log.loads(req_id), prompt_tokens, tuple(self.stats.tiers))

    def drop_host_chunks(self) -> bool:
        """The engine's connector-cache reset (``tier_writes.drop_host_chunks``)."""
        return drop_host_chunks(self.manager, self._writes.values())

    @property
    def has_jobs_in_flight(self) -> bool:
        return bool(self.jobs)

    @property
    def has_pending_work(self) -> bool:
        """Transfers in flight, chunks to write to a tier once idle, or offers a source holds."""
        writes = any(writes.pending for writes in self._writes.values())
        return bool(self.jobs) or writes or self.sources.pending

    def take_events(self) -> list[PrefixEvent]:
        """What each tier started or stopped holding since the last call (``prefix_events.py``)."""
        tell_tier_events(self.prefixes, self.manager, self.lower)
        return self.prefixes.take() if self.prefixes is not None else []

    def check_integrity(self) -> None:
        self.manager.check_integrity()
        pinned = sum(len(job.keys) for job in self.jobs if job.pinned)
        assert self.manager.num_pinned == pinned, (self.manager.num_pinned, pinned)
        for tier in self.lower:
            tier.check_integrity()

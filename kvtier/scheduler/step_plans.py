"""A step's plan, built once per engine step: its loads (planned as requests were allocated),
the stores of the chunks it completes, tier writes, flushes, and what the workers must hold or
forget (``step_plan.StepPlan``).

    StepPlans(...).next                 the plan being filled until ``build``
    .look_again()                       every running request is looked at next step
    .build(scheduled, preempted, forward) -> StepPlan

Costs what changed this step (the requests' new blocks, the chunks they complete), never the
requests' whole tables (``scheduled.py``); a running request with no new block and nothing to
store (``RequestState.due``) costs no Python step at all (``step_visits.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvtier.counters import KVTierStats
from kvtier.scheduler.costs import HitCosts
from kvtier.scheduler.job_table import JobTable
from kvtier.scheduler.prefix_events import PrefixEvents, tell_tier_events
from kvtier.scheduler.request import RequestState
from kvtier.scheduler.scheduled import ScheduledRequest, StepRequests, forget_blocks
from kvtier.scheduler.sources import Sources
from kvtier.scheduler.step_visits import StepVisits
from kvtier.scheduler.store_planner import StorePlanner
from kvtier.scheduler.tail_store import TailStore
from kvtier.scheduler.tier_writes import TierWrites
from kvtier.step_plan import StepPlan
from kvtier.tiers.base.index import TierIndex
from kvtier.tiers.host.index import ChunkManager


class StepPlans:
    def __init__(
        self,
        requests: dict[str, RequestState],
        jobs: JobTable,
        stats: KVTierStats,
        manager: ChunkManager,
        lower: Sequence[TierIndex],
        parts: tuple[StorePlanner, TailStore, StepVisits],
        writes: dict[str, TierWrites],
        sources: Sources,
        costs: HitCosts | None,
        prefixes: PrefixEvents | None,
    ) -> None:
        """``parts``: what plans the stores (full chunks, prompt tails) and which requests a
        step looks at."""
        self.requests, self.jobs, self.stats, self.manager = requests, jobs, stats, manager
        self.lower = tuple(lower)
        self._stores, self._tails, self._visits = parts
        self._writes, self.sources, self.costs, self.prefixes = writes, sources, costs, prefixes
        self.next = StepPlan(num_chunks=manager.capacity)
        # every running request is at least this many tokens from its ``due`` (0: look)
        self.slack = 0
        self.computed = 0  # at most the tokens a running request computed by the last step

    def look_again(self) -> None:
        self.slack = 0

    def build(
        self,
        scheduled: StepRequests | Iterable[ScheduledRequest],
        preempted: Iterable[str] = (),
        forward: bool = True,
    ) -> StepPlan:
        """This step's loads (added to ``next`` as requests were allocated), stores of the
        chunks it completes, flushes."""
        step = scheduled if isinstance(scheduled, StepRequests) else StepRequests.of(scheduled)
        if self.costs is not None:  # a step whose forward waits for a load times no compute
            tokens = sum(step.num_new_tokens.values()) if forward else 0
            sync = any(load.sync for load in self.next.loads)
            self.costs.step(tokens, len(step) if forward else 0, timed=not sync)
        tell_tier_events(
            self.prefixes, self.manager, self.lower
        )  # before this step's writes: a chunk is told in a tier once written
        flush: set[int] = set()
        for req_id in preempted:  # its blocks went back to the pool: finish what reads them
            state = self.requests.get(req_id)
            self.stats.preemptions += 1
            if state is not None:
                flush.update(state.store_jobs)
                forget_blocks(state)
        # a store still reading a block the engine writes this step (a block newly handed to a
        # request, or a load's destination) must finish before the forward
        for load in self.next.loads:
            flush.update(self.jobs.reading(load.dst.block_ids.tolist()))
        visits = self._visits.visit(step, self.slack, self.computed)
        flush |= visits.flush
        tracked, slack = visits.tracked, visits.slack
        offers = [self._stores.offer(state, computed) for state, computed in tracked]
        tails = [self._tails.offer(state, computed) for state, computed in tracked]
        self.next.stores += self._stores.plan(
            [offer for offer in offers if offer is not None],
            [tail for tail in tails if tail is not None],
        )
        for state, computed in tracked:
            state.due = self._visits.due(state)
            slack = min(slack, state.due - computed)
        self.slack, self.computed = slack, step.computed_after()
        evicted = self._stores.take_evicted()
        for writes in self._writes.values():
            writes.evicted(evicted)
            writes.flush(idle=not self.requests)
            self.next.tier_writes += writes.take_plan()
        plan, self.next = self.next, StepPlan(num_chunks=self.manager.capacity)
        plan.flush = sorted(flush)
        plan.forward = forward
        rooms = {tier.name: tier.usage().room for tier in self.lower}
        plan.tier_room = {name: room for name, room in rooms.items() if room is not None}
        plan.messages.update(self.sources.messages())
        return plan

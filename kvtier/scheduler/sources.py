"""The request sources of a scheduler half (``tiers/base/source.py``) and what their loads mean
for the requests, the job table and the counts.

    Sources(stats, jobs, chunk_tokens)
    .add(source)                                 counted under its name
    .claim(name, state, params, computed)        a request a source's ``lookup`` answered
    .plan(state, tokens)       -> LoadJob | None the claimed request's load, once allocated
    .complete(job)                               every rank finished a source's load
    .holds(req_id) / .pending / .messages()      what the sources keep and tell their workers
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtier.counters import KVTierStats, TierStats
from kvtier.scheduler.job_table import Job, JobKind, JobTable
from kvtier.scheduler.request import RequestState
from kvtier.step_plan import LoadJob
from kvtier.tiers.base.source import RequestSource, SourceRequest


class Sources:
    def __init__(self, stats: KVTierStats, jobs: JobTable, chunk_tokens: int) -> None:
        self.stats, self.jobs, self.chunk_tokens = stats, jobs, chunk_tokens
        self.by_name: dict[str, RequestSource] = {}

    def add(self, source: RequestSource) -> None:
        if source.name in self.stats.tiers or source.name in self.by_name:
            raise ValueError(f"kvtier: two tiers named {source.name!r}")
        self.stats.tiers[source.name] = TierStats()
        self.by_name[source.name] = source

    def claim(
        self,
        name: str,
        state: RequestState,
        params: Mapping[str, Any],
        num_computed_tokens: int,
    ) -> None:
        """Source ``name``'s ``lookup`` answered tokens for ``state``'s request: they load
        asynchronously, planned by ``plan`` once the engine allocated the request's blocks."""
        state.num_computed_tokens = num_computed_tokens
        state.source, state.source_params = name, params
        state.load_async = True
        self.stats.lookups += 1

    def plan(self, state: RequestState, num_external_tokens: int) -> LoadJob | None:
        """The load of a request a source claimed (one per request), or None."""
        if state.source is None or state.source_params is None:
            return None
        name, params = state.source, state.source_params
        state.source = state.source_params = None  # one load per request
        request = SourceRequest(state.req_id, params, state.block_ids, state.num_computed_tokens)
        load = self.by_name[name].plan_load(request, num_external_tokens)
        if load is None or num_external_tokens == 0:  # the engine took none of it: no load
            return None
        job_id = self.jobs.add(Job(state.req_id, [], JobKind.SOURCE_LOAD, tier=name))
        state.load_jobs.add(job_id)
        state.loaded_tokens = {name: num_external_tokens}
        if load.kept:  # not stored in this engine's tiers (a store on the request's first step
            # would also delay its first token by a copy of the whole prompt)
            loaded = (state.num_computed_tokens + num_external_tokens) // self.chunk_tokens
            state.stored_upto = [max(upto, loaded) for upto in state.stored_upto]
            state.tail_done = True
        return LoadJob(job_id, state.req_id, load.src, load.dst)

    def complete(self, job: Job, state: RequestState | None) -> None:
        """Every rank finished a source's load; counted in chunks of its tokens (the last maybe
        partial)."""
        stats, outcome = self.stats.tiers[job.tier], job.outcome
        if outcome.failed:
            stats.failed_loads += 1
            return
        tokens = state.loaded_tokens.get(job.tier, 0) if state else 0
        chunks = -(-tokens // self.chunk_tokens)
        stats.hit_chunks += chunks
        stats.loaded_chunks += chunks
        stats.loaded_bytes += outcome.bytes
        stats.load_seconds += outcome.seconds

    def holds(self, req_id: str) -> bool:
        return any(source.holds(req_id) for source in self.by_name.values())

    @property
    def pending(self) -> bool:
        return any(source.pending for source in self.by_name.values())

    def messages(self) -> dict[str, list[object]]:
        found = {}
        for source in self.by_name.values():
            messages = source.take_messages()
            if messages:
                found[source.name] = messages
        return found

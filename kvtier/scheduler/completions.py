"""What a job every worker rank finished means for the scheduler half: its completion.

    Completions(...).report(report) -> Completed   count the ranks; complete each job all ranks
                                                   finished, loads before stores

A load completes into its tier's index (pins released, bad chunks dropped), the counts and the
measured costs; a store makes its chunks loadable in host memory and dirty for the chain's
tiers, unless it may hold KV computed from a failed synchronous load (``failed_loads.py``:
then it fails, its chunks are offered again and the workers forget their copies); a tier write
completes into its ``TierWrites``. State carried between reports: the store parts to fail
(``untrusted``) and the jobs a report completed but not handled yet.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from kvtier.counters import KVTierStats
from kvtier.keys import ChunkKey
from kvtier.scheduler.costs import HitCosts
from kvtier.scheduler.failed_loads import offer_again, untrusted_stores
from kvtier.scheduler.job_table import Job, JobKind, JobTable
from kvtier.scheduler.prefix_events import PrefixEvents
from kvtier.scheduler.provenance import JobLog
from kvtier.scheduler.request import RequestState
from kvtier.scheduler.sources import Sources
from kvtier.scheduler.tier_writes import TierWrites
from kvtier.step_plan import WorkerReport
from kvtier.tiers.base.index import TierIndex
from kvtier.tiers.host.index import ChunkManager


class Completed(NamedTuple):
    """What a report changed for the next step: host copies the workers must forget (stores
    that failed), and whether a request was offered its chunks again (look at it)."""

    forget: list[ChunkKey]
    offered_again: bool


class Completions:
    def __init__(
        self,
        manager: ChunkManager,
        jobs: JobTable,
        job_log: JobLog,
        requests: dict[str, RequestState],
        stats: KVTierStats,
        tiers: dict[str, TierIndex],
        writes: dict[str, TierWrites],
        sources: Sources,
        prefixes: PrefixEvents | None,
        costs: HitCosts | None,
    ) -> None:
        self.manager, self.jobs, self.job_log, self.requests = manager, jobs, job_log, requests
        self.stats, self._tiers, self._writes, self.sources = stats, tiers, writes, sources
        self.prefixes, self.costs = prefixes, costs
        self._untrusted: set[tuple[int, str]] = set()  # store parts (job, request) to fail
        self._reported: dict[int, Job] = {}  # jobs the report being handled completed
        self._forget: list[ChunkKey] = []
        self._offered_again = False

    def report(self, report: WorkerReport) -> Completed:
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
        completed = Completed(self._forget, self._offered_again)
        self._forget, self._offered_again = [], False
        return completed

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
                    self._forget += part.keys
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
                self.prefixes.describe(self.requests[part.req_id], part.runs, part.keys)
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
            self._fail_parts(job_id, state)
            self._offered_again = True  # looked at in its next step

    def distrust_reading(self, blocks: Iterable[int]) -> bool:
        """The engine writes ``blocks`` before it waits for the stores still reading them
        (vLLM's Model Runner V2 zeroes new blocks and fills copy-on-write ones before the
        connector's ``handle_preemptions``): those stores fail as they complete, every part,
        and their chunks are offered again (``failed_loads.py``). Whether one was found."""
        found = False
        for job_id in self.jobs.reading(blocks):
            job = self.jobs.get(job_id)
            if job is None or job.kind is not JobKind.STORE:
                continue
            for req_id in dict.fromkeys(part.req_id for part in job.parts):
                self._fail_parts(job_id, self.requests[req_id])
                found = True
        return found

    def _fail_parts(self, job_id: int, state: RequestState) -> None:
        """``state``'s parts of store ``job_id`` fail as it completes, offered again now."""
        self._untrusted.add((job_id, state.req_id))
        job = self.jobs.get(job_id) or self._reported[job_id]
        for part in job.parts_of(state.req_id):
            offer_again(state, part)

"""Transfers in flight, as the scheduler half tracks them until every rank has reported.

add(job)                 -> int         a new job id; a store's engine blocks are indexed
get(job_id)              -> Job | None  a job in flight
reading(blocks)          -> set[int]    the stores in flight that read any of these blocks
report(job_id, outcome)  -> Job | None  counts one report; the job once all ranks finished it
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from kvtier.keys import ChunkKey
from kvtier.step_plan import JobOutcome

logger = logging.getLogger(__name__)


class JobKind(Enum):
    LOAD = "load"  # host tier -> engine
    STORE = "store"  # engine -> host tier
    TIER_LOAD = "tier load"  # a tier of the chain (``Job.tier``) -> engine
    TIER_WRITE = "tier write"  # host tier -> a lower tier (no request; host chunks pinned/staged)
    SOURCE_LOAD = "source load"  # a request source (``Job.tier``, ``request_source.py``) -> engine


class StorePart(NamedTuple):
    """One request's part of a store job: its chunks (``runs``: ``(group, first, end)``, the
    first from ``first_chunk`` on), or its prompt's tail (``host_only``: never written to a
    lower tier)."""

    req_id: str
    keys: list[ChunkKey]
    first_chunk: int = 0
    runs: tuple[tuple[int, int, int], ...] = ()
    host_only: bool = False


@dataclass(slots=True)
class Job:
    req_id: str  # "" for a tier write and a store (its parts name their requests)
    keys: list[ChunkKey]
    kind: JobKind
    blocks: list[int] = field(default_factory=list)  # engine blocks a store reads
    writes: list[int] = field(default_factory=list)  # engine blocks a load writes
    outcome: JobOutcome = field(default_factory=JobOutcome)  # summed over the ranks so far
    pinned: bool = False  # holds pins on its host chunks (an asynchronous load, a disk write)
    tier: str = ""  # the tier (or source) a TIER_LOAD or SOURCE_LOAD reads, a TIER_WRITE writes
    sync: bool = False  # a load read before its step's forward (that step's stores follow it)
    parts: list[StorePart] = field(default_factory=list)  # a store's, in its keys' order
    tokens: int = 0  # a load's tokens (its request's, from its tier): what its seconds cost

    def parts_of(self, req_id: str) -> list[StorePart]:
        """A store's parts of request ``req_id``."""
        return [part for part in self.parts if part.req_id == req_id]

    @property
    def store(self) -> bool:
        return self.kind is JobKind.STORE


class JobTable:
    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._jobs: dict[int, Job] = {}
        self._readers: dict[int, set[int]] = {}  # engine block -> stores in flight reading it
        self._next_id = 1

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self._jobs.values())

    def add(self, job: Job) -> int:
        job_id, self._next_id = self._next_id, self._next_id + 1
        self._jobs[job_id] = job
        for block in job.blocks:
            self._readers.setdefault(block, set()).add(job_id)
        return job_id

    def get(self, job_id: int) -> Job | None:
        return self._jobs.get(job_id)

    def reading(self, blocks: Iterable[int]) -> set[int]:
        return {job for block in blocks for job in self._readers.get(block, ())}

    def report(self, job_id: int, outcome: JobOutcome) -> Job | None:
        """Add one report; return the job, now forgotten, once ``num_workers`` ranks finished it."""
        job = self._jobs.get(job_id)
        if job is None:
            logger.warning("kvtier: report for unknown transfer job %d", job_id)
            return None
        job.outcome.add(outcome)
        if job.outcome.ranks < self.num_workers:
            return None
        del self._jobs[job_id]
        for block in set(job.blocks):  # block ids are unique per group only: they may repeat
            readers = self._readers[block]
            readers.discard(job_id)
            if not readers:
                del self._readers[block]
        return job

"""The jobs one worker rank has in flight, by kind, and what each one's end means.

    Jobs.submitted(job_id, job, ok)   a job handed to its handler (or refused: done, failed)
    Jobs.stores_started(parts)        a step's store parts: their slots hold no key until done
    Jobs.finished(result)             a handler reported the job: count it, free its requests
    Jobs.requests_done(held)       -> (sending, receiving, failed receiving) request ids
    Jobs.take_outcomes()           -> this rank's outcomes since the last report
    Jobs.take_failed_blocks()      -> engine blocks whose load failed (the engine recomputes)

A load's request is done when all its loads here are (it may load from several tiers); a held
(finished) request is released once its stores here are done. The keys each host slot holds, as
far as this rank knows, are kept for the shutdown flush (``slot_keys``, oldest first).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from kvtier.addresses import EngineBlocks
from kvtier.keys import ChunkKey
from kvtier.step_plan import JobOutcome, StoreJob
from kvtier.tiers.base.handler import TransferResult
from kvtier.worker.rank_counters import RankCounters


class JobKind(Enum):
    LOAD = "load"  # into a request's engine blocks; the request waits for it
    SYNC_LOAD = "sync_load"  # before the step's forward; its request is running, never waiting
    STORE = "store"  # a step's stores: engine blocks -> host slots
    TIER_WRITE = "tier_write"  # host slots -> a tier of the chain


@dataclass(frozen=True)
class InFlight:
    kind: JobKind
    req_id: str = ""  # a load's request
    engine: EngineBlocks | None = None  # a load's blocks: recomputed when it fails
    chunks: int = 0  # a tier write's chunks
    requests: tuple[str, ...] = ()  # a store's requests (its parts')

    @property
    def loads(self) -> bool:
        return self.kind in (JobKind.LOAD, JobKind.SYNC_LOAD)


class Jobs:
    def __init__(self, counters: RankCounters) -> None:
        self.counters = counters
        self.in_flight: dict[int, InFlight] = {}
        self.slot_keys: dict[int, ChunkKey] = {}  # host slot -> key it holds, oldest first
        self._req_loads: dict[str, tuple[set[int], bool]] = {}  # request -> (loads, all ok)
        self._req_stores: dict[str, set[int]] = {}  # request -> its store jobs in flight
        self._finished_loads: list[tuple[str, bool]] = []  # (request, ok) since last taken
        self._failed_blocks: set[int] = set()
        self._outcomes: dict[int, JobOutcome] = {}
        self._store_keys: dict[int, tuple[np.ndarray, tuple[ChunkKey, ...]]] = {}

    @property
    def storing(self) -> bool:
        """A request waits for a store of this rank."""
        return bool(self._req_stores)

    @property
    def loading(self) -> bool:
        """A request waits for a load of this rank."""
        return bool(self._req_loads)

    def load_started(self, job_id: int, req_id: str) -> None:
        """An asynchronous load of ``req_id``: the request is done when all its loads are."""
        self._req_loads.setdefault(req_id, (set(), True))[0].add(job_id)

    def stores_started(self, job_id: int, parts: Sequence[StoreJob]) -> None:
        """Job ``job_id``'s parts overwrite their slots: no key there until it is done."""
        if self.slot_keys:
            for slot in np.concatenate([part.dst.slots for part in parts]).tolist():
                self.slot_keys.pop(slot, None)
        named = [part for part in parts if part.keys]
        if named:
            self._store_keys[job_id] = (
                np.concatenate([part.dst.slots for part in named]),
                tuple(key for part in named for key in part.keys),
            )

    def forget(self, keys: Iterable[ChunkKey]) -> None:
        """Host copies the scheduler failed (KV from a failed load): never flushed."""
        forget = set(keys)
        self.slot_keys = {s: k for s, k in self.slot_keys.items() if k not in forget}

    def submitted(self, job_id: int, job: InFlight, ok: bool) -> None:
        if not ok:  # done here, and failed: a load is recomputed, a store is dropped
            self._record(job_id, job, TransferResult(job_id, False, 0, 0.0))
            return
        self.in_flight[job_id] = job
        for req_id in job.requests:  # a store's
            self._req_stores.setdefault(req_id, set()).add(job_id)

    def finished(self, result: TransferResult) -> None:
        job = self.in_flight.pop(result.job_id)
        for req_id in job.requests:  # a store's
            jobs = self._req_stores[req_id]
            jobs.discard(result.job_id)
            if not jobs:
                del self._req_stores[req_id]
        self._record(result.job_id, job, result)

    def _record(self, job_id: int, job: InFlight, result: TransferResult) -> None:
        ok, bad = result.success, result.bad
        self._outcomes[job_id] = JobOutcome(1, 0 if ok else 1, result.bytes, result.seconds,
                                            list(bad))  # fmt: skip
        counters = self.counters
        if job.kind is JobKind.STORE:
            slots, keys = self._store_keys.pop(job_id, (None, ()))
            if ok and slots is not None:
                self.slot_keys.update(zip(slots.tolist(), keys))
            counters.stores += ok
            counters.failed_stores += not ok
            counters.stored_bytes += result.bytes
        elif job.kind is JobKind.TIER_WRITE:
            failed = len(bad) if bad or ok else job.chunks
            counters.tier_writes += job.chunks - failed
            counters.tier_write_errors += failed
        else:
            self._record_load(job_id, job, result)

    def _record_load(self, job_id: int, job: InFlight, result: TransferResult) -> None:
        counters, ok = self.counters, result.success
        counters.loads += ok
        counters.failed_loads += not ok
        counters.loaded_bytes += result.bytes
        counters.bad_chunks += len(result.bad)
        if not ok and job.engine is not None:
            self._failed_blocks.update(job.engine.block_ids.tolist())
        if job.kind is JobKind.SYNC_LOAD:
            return
        jobs, all_ok = self._req_loads.get(job.req_id, ({job_id}, True))
        jobs.discard(job_id)
        if jobs:
            self._req_loads[job.req_id] = (jobs, all_ok and ok)
        else:
            self._req_loads.pop(job.req_id, None)
            self._finished_loads.append((job.req_id, all_ok and ok))

    def requests_done(
        self, held: set[str], offered: set[str]
    ) -> tuple[set[str], set[str], set[str]]:
        """(sending: held requests whose stores here are done and that no tier still offers,
        receiving: requests whose loads finished, failed receiving: those of them that failed).
        The sending ones are taken out of ``held``."""
        sending = {req for req in held if req not in self._req_stores and req not in offered}
        held -= sending
        recving = {req for req, _ in self._finished_loads}
        failed = {req for req, ok in self._finished_loads if not ok}
        self._finished_loads = []
        return sending, recving, failed

    def take_outcomes(self) -> dict[int, JobOutcome]:
        outcomes, self._outcomes = self._outcomes, {}
        return outcomes

    def take_failed_blocks(self) -> set[int]:
        blocks, self._failed_blocks = self._failed_blocks, set()
        return blocks

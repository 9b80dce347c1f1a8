"""Engine <-> host copies for CUDA engine tensors: one ``PageMover`` job per transfer, on a stream.

A job's pages (every view of every block it moves, ``HostTier.page_grid``) go to the direction's
``PageMover`` (``kvtier/pages``): one gather or scatter on the device per batch of up to 64 MiB,
and one device <-> host copy per run of adjacent host bytes (a chunk's record, or several in
consecutive slots), cut where the tier's separately pinned pieces meet (CUDA refuses a copy
over two). Nothing runs per page or per view in Python.

Streams and events. One stream per direction. A job first waits for the engine's stream as it
was at submission (a store reads blocks the step just wrote; a load fills blocks the engine may
still read), then runs on the direction's stream, and ends with an event. Nothing blocks the
engine's thread: ``transfer_async`` queues the work and returns; ``get_finished`` reports the
jobs whose events completed, with their time on the device; ``fence`` makes the engine's
stream wait for a job's event (a synchronous load: the step's forward waits for that load, not
for the device), and ``wait`` blocks until the jobs are done (tests, shutdown).

A job touching a slot the tier has not pinned yet (``pinning.py``) is queued by a thread of its
own, on a stream and ``PageMover`` of its own: CUDA copies pageable memory synchronously, a
store's after the engine's work before it (the step in flight), which would hold the engine's
thread for a step and the copy. Its events are recorded once that thread queued it; ``fence``
waits for that much.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import NamedTuple

import torch

from kvtier.layout import KVLayout
from kvtier.pages import PageMover
from kvtier.pages.grid import PageGrid
from kvtier.pages.mechanism import Mechanism, Mechanisms
from kvtier.pages.mover import STAGE_BYTES
from kvtier.pages.streams import on_stream
from kvtier.tiers.base.chunk_plan import GroupCopy
from kvtier.tiers.base.handler import TransferResult
from kvtier.tiers.base.job_thread import bind_thread
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.io.engine_host import EngineHostHandler

logger = logging.getLogger(__name__)


class _Lane(NamedTuple):
    """Where a job is queued: a stream and the mover whose staging area runs in its order."""

    stream: torch.cuda.Stream
    mover: PageMover


class _Events(NamedTuple):
    """A job's events, made once and reused by later jobs once it is reported."""

    ready: torch.cuda.Event  # on the engine's stream, at submission
    started: torch.cuda.Event  # on the job's stream, once the engine's work before it is done
    done: torch.cuda.Event


class _Job(NamedTuple):
    job_id: int
    events: _Events
    nbytes: int
    queued: Future[None] | None  # the pageable lane's: its events are recorded once it is done


class CudaCopyHandler(EngineHostHandler):
    def __init__(
        self,
        layout: KVLayout,
        host: HostTier,
        store: bool,
        stage_bytes: int = STAGE_BYTES,
        mechanism: Mechanism | Mechanisms | None = None,
    ) -> None:
        super().__init__(layout, host, store)

        def lane() -> _Lane:  # no copy over two pinned pieces of the tier: CUDA refuses it
            mover = PageMover(layout.views, stage_bytes, mechanism, host_piece=host.pin_piece_bytes)
            return _Lane(torch.cuda.Stream(device=self.device), mover)  # type: ignore[no-untyped-call]

        self._lane = lane()
        self._index = self._lane.stream.device_index  # the engine's device, the quickest lookup
        self._pageable = lane()  # jobs touching slots not pinned yet, queued by _queuer
        self._queuer = ThreadPoolExecutor(1, "kvtier-pageable", bind_thread, (self.device,))
        self._memory = host.memory.view(-1)  # (num_chunks * record_bytes,) bytes
        self._jobs: list[_Job] = []  # in submission order
        self._spare: list[_Events] = []  # reported jobs' events

    def _submit(self, job_id: int, plan: list[GroupCopy], nbytes: int) -> None:
        pages = self.host.page_grids(plan)
        events = self._spare.pop() if self._spare else _new_events()
        events.ready.record(torch.cuda.current_stream(self._index))  # the engine's work so far
        queued = None
        if self.host.pinned_below(_slot_end(plan, self.host.block_size_factor)):
            self._queue(self._lane, pages, True, events)
        else:  # the kernel reads host memory only where it is pinned: the copy engine, queued
            queued = self._queuer.submit(self._queue, self._pageable, pages, False, events)
        self._jobs.append(_Job(job_id, events, nbytes, queued))

    def _queue(self, lane: _Lane, pages: list[PageGrid], pinned: bool, events: _Events) -> None:
        ready, started, done = events
        with on_stream(lane.stream):
            lane.stream.wait_event(ready)
            started.record(lane.stream)
            try:
                if self.store:
                    lane.mover.store(pages, self._memory, pinned)
                else:
                    lane.mover.load(pages, self._memory, pinned)
            except Exception:  # the job fails once what it queued is done: none lands later
                lane.stream.synchronize()
                raise
            done.record(lane.stream)

    def get_finished(self) -> list[TransferResult]:
        finished, self._jobs = _split(self._jobs)
        results = [_result(job) for job in finished]
        self._spare += [job.events for job in finished]  # nothing waits for them any more
        return results

    def fence(self, job_ids: Collection[int]) -> None:
        engine = torch.cuda.current_stream(self._index)
        for job in self._jobs:
            if job.job_id in job_ids and _queued(job):
                engine.wait_event(job.events.done)

    def wait(self, job_ids: Collection[int]) -> None:
        for job in list(self._jobs):
            if job.job_id in job_ids and _queued(job):
                job.events.done.synchronize()

    def wait_any(self, timeout: float) -> None:
        """Until a job finished, at most ``timeout`` (polled: an event has no timed wait, and
        blocking on one holds the engine's thread past the timeout)."""
        deadline = time.monotonic() + timeout
        while self._jobs and not any(map(_done, self._jobs)) and time.monotonic() < deadline:
            time.sleep(0.0005)

    def shutdown(self) -> None:
        self._queuer.shutdown(wait=True)
        self._lane.stream.synchronize()
        self._pageable.stream.synchronize()


def _new_events() -> _Events:
    timed = [torch.cuda.Event(enable_timing=True) for _ in range(2)]  # type: ignore[no-untyped-call]
    return _Events(torch.cuda.Event(), *timed)  # type: ignore[no-untyped-call]


def _slot_end(plan: list[GroupCopy], factor: int) -> int:
    """One past the highest host slot ``plan`` touches."""
    rows = [int(copy.host_rows.max()) for copy in plan if len(copy.host_rows)]
    return max(rows, default=-1) // factor + 1


def _queued(job: _Job) -> bool:
    """Wait until ``job``'s copies are queued; whether they were (False: queuing them failed)."""
    if job.queued is not None:
        wait_futures([job.queued])
        return job.queued.exception() is None
    return True


def _done(job: _Job) -> bool:
    if job.queued is not None and not job.queued.done():
        return False  # its events not recorded yet (an event never recorded reads as done)
    return bool(job.events.done.query())  # type: ignore[no-untyped-call]


def _split(jobs: list[_Job]) -> tuple[list[_Job], list[_Job]]:
    """``jobs`` done, and the others, each in submission order."""
    done = [_done(job) for job in jobs]
    return [j for j, d in zip(jobs, done) if d], [j for j, d in zip(jobs, done) if not d]


def _result(job: _Job) -> TransferResult:
    """A finished job's result: failed, with no time, where queuing its copies raised."""
    error = None if job.queued is None else job.queued.exception()
    if error is not None:
        logger.error("kvtier: transfer job %d failed", job.job_id, exc_info=error)
        return TransferResult(job.job_id, False, 0, 0.0)
    seconds = job.events.started.elapsed_time(job.events.done) / 1e3
    return TransferResult(job.job_id, True, job.nbytes, seconds)

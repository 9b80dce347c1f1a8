"""Engine <-> host copies for CUDA engine tensors: one ``PageMover`` job per transfer, on a stream.

A job's pages (every view of every block it moves, ``HostTier.page_grid``) go to the direction's
``PageMover`` (``kvtier/pages``): one gather or scatter on the device per batch of up to 64 MiB,
and one device <-> host copy per run of adjacent host bytes (a chunk's record, or several in
consecutive slots), cut where the tier's separately pinned pieces meet (CUDA refuses a copy
over two). Nothing runs per page or per view in Python.

Streams and events. One stream per direction. A job first waits for the engine's stream as it
was at submission (a store reads blocks the step just wrote; a load fills blocks the engine may
still read), then runs on the direction's stream, and ends with an event. Nothing blocks the
engine's thread (but a copy to a part of the tier not pinned yet: CUDA copies pageable memory
synchronously, ``pinning.py``): ``transfer_async`` queues the work and returns; ``get_finished``
reports the jobs whose events completed, in submission order, with their time on the device;
``fence`` makes the engine's stream wait for a job's event (a synchronous load: the step's
forward waits for that load, not for the device), and ``wait`` blocks until the jobs are done
(tests, shutdown).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Collection
from typing import NamedTuple

import torch

from kvtier.layout import KVLayout
from kvtier.pages import PageMover
from kvtier.pages.mechanism import Mechanism, Mechanisms
from kvtier.pages.mover import STAGE_BYTES
from kvtier.tiers.base.chunk_plan import GroupCopy
from kvtier.tiers.base.handler import TransferResult
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.io.engine_host import EngineHostHandler


class _Job(NamedTuple):
    job_id: int
    started: torch.cuda.Event  # on the stream, once the engine's work before it is done
    done: torch.cuda.Event
    nbytes: int


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
        self._stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        # no copy over two pinned pieces of the tier: CUDA refuses it
        self._mover = PageMover(
            layout.views, stage_bytes, mechanism, host_piece=host.pin_piece_bytes
        )
        self._memory = host.memory.view(-1)  # (num_chunks * record_bytes,) bytes
        self._jobs: deque[_Job] = deque()  # in submission order, so in completion order

    def _submit(self, job_id: int, plan: list[GroupCopy], nbytes: int) -> None:
        host = self.host
        pages = self.page_grids(plan)
        # the kernel reads host memory only where it is pinned: the job's slots, not all of them
        pinned = host.pinned_below(_slot_end(plan, host.block_size_factor))
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record(torch.cuda.current_stream(self.device))  # the engine's work so far
        started = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        done = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(ready)
            started.record(self._stream)
            if self.store:
                self._mover.store(pages, self._memory, pinned)
            else:
                self._mover.load(pages, self._memory, pinned)
            done.record(self._stream)
        self._jobs.append(_Job(job_id, started, done, nbytes))

    def get_finished(self) -> list[TransferResult]:
        finished = []
        while self._jobs and _done(self._jobs[0]):
            job = self._jobs.popleft()
            seconds = job.started.elapsed_time(job.done) / 1e3
            finished.append(TransferResult(job.job_id, True, job.nbytes, seconds))
        return finished

    def fence(self, job_ids: Collection[int]) -> None:
        engine = torch.cuda.current_stream(self.device)
        for job in self._jobs:
            if job.job_id in job_ids:
                engine.wait_event(job.done)

    def wait(self, job_ids: Collection[int]) -> None:
        for job in list(self._jobs):
            if job.job_id in job_ids:
                job.done.synchronize()

    def wait_any(self, timeout: float) -> None:
        """Until the oldest job finished, at most ``timeout`` (polled: an event has no timed
        wait, and blocking on one holds the engine's thread past the timeout)."""
        deadline = time.monotonic() + timeout
        while self._jobs and not _done(self._jobs[0]) and time.monotonic() < deadline:
            time.sleep(0.0005)

    def shutdown(self) -> None:
        self._stream.synchronize()


def _slot_end(plan: list[GroupCopy], factor: int) -> int:
    """One past the highest host slot ``plan`` touches."""
    rows = [int(copy.host_rows.max()) for copy in plan if len(copy.host_rows)]
    return max(rows, default=-1) // factor + 1


def _done(job: _Job) -> bool:
    return bool(job.done.query())  # type: ignore[no-untyped-call]

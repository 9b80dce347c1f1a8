"""Engine <-> host copies for CUDA engine tensors, on one stream per direction.

Host buffers are pinned, so each run is an asynchronous copy: a store gathers the run's engine
blocks on the device and copies them to the host; a load copies the host run to the device and
scatters it into the engine blocks. A job ends with an event; ``get_finished`` polls events, so jobs
of one direction finish in submission order (one stream). Stores wait for the compute stream first.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import NamedTuple

import torch

from kvtier.layout import KVLayout
from kvtier.tiers.cpu import HostTier
from kvtier.worker.base import TransferResult
from kvtier.worker.engine_host import EngineHostHandler
from kvtier.worker.plan import GroupCopy


class _InFlight(NamedTuple):
    job_id: int
    event: torch.cuda.Event
    nbytes: int
    started: float


class CudaCopyHandler(EngineHostHandler):
    def __init__(self, layout: KVLayout, host: HostTier, store: bool) -> None:
        super().__init__(layout, host, store)
        self._stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        self._in_flight: list[_InFlight] = []  # submission order

    def _submit(self, job_id: int, plan: list[GroupCopy], nbytes: int) -> None:
        if any(job.job_id == job_id for job in self._in_flight):
            raise ValueError(f"kvtier: transfer job {job_id} is already in flight")
        started = time.perf_counter()
        if self.store:  # the blocks must be written by the step before we read them
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            for copy in plan:
                ids = torch.from_numpy(copy.block_ids).to(self.device, non_blocking=True)
                for view in self.layout.groups[copy.group]:
                    self._copy_view(copy, ids, view)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self._stream)
        self._in_flight.append(_InFlight(job_id, event, nbytes, started))

    def _copy_view(self, copy: GroupCopy, ids: torch.Tensor, view: int) -> None:
        """Enqueue one view's copies: gather/scatter on the device, one host transfer per run."""
        engine = self.layout.views[view]  # (num_blocks, page_words), on the device
        rows = self.host.page_rows(view)  # (num_chunks * factor, page_words), pinned
        for first, start, end in self._runs(copy):
            host_run = rows[first : first + end - start]
            if self.store:
                host_run.copy_(engine.index_select(0, ids[start:end]), non_blocking=True)
            else:
                staged = host_run.to(engine.device, non_blocking=True)
                engine.index_copy_(0, ids[start:end], staged)

    def get_finished(self) -> list[TransferResult]:
        finished = []
        while self._in_flight and self._in_flight[0].event.query():  # type: ignore[no-untyped-call]
            job = self._in_flight.pop(0)
            seconds = time.perf_counter() - job.started
            finished.append(TransferResult(job.job_id, True, job.nbytes, seconds))
        return finished

    def wait(self, job_ids: Collection[int]) -> None:
        for job in self._in_flight:
            if job.job_id in job_ids:
                job.event.synchronize()

    def shutdown(self) -> None:
        self._stream.synchronize()

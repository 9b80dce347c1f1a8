"""Engine <-> host copies for CPU engine tensors.

Stores run on their own thread, in submission order, so they never delay the engine's step; the
thread binds the device once, in the pool's initializer. Loads run inline, on the caller's thread:
vLLM starts async loads after the step's forward, and a request waiting for its load makes the
engine spin through empty steps that hold the GIL, so a load thread waited up to the GIL switch
interval (5 ms) before each of its copies while the copy itself took 0.1 ms.

The copies are numpy's, which release the GIL and never enter OpenMP: vLLM's CPU worker binds
OpenMP threads to cores, and a torch copy starting its own OpenMP team on one of our threads was
seen to hang there once an engine had been re-created in the same process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection

import numpy as np

from kvtier.layout import KVLayout
from kvtier.tiers.cpu import HostTier
from kvtier.worker.base import TransferResult
from kvtier.worker.engine_host import EngineHostHandler
from kvtier.worker.job_thread import JobThread
from kvtier.worker.plan import GroupCopy

logger = logging.getLogger(__name__)


class CpuCopyHandler(EngineHostHandler):
    """``inline``: copy in ``transfer_async`` itself instead of on the handler's thread."""

    def __init__(self, layout: KVLayout, host: HostTier, store: bool, inline: bool) -> None:
        super().__init__(layout, host, store)
        # numpy views sharing the tensors' memory
        self._engine = [view.numpy() for view in layout.views]
        self._rows = [host.page_rows(i).numpy() for i in range(len(layout.views))]
        name = "kvtier-store" if store else "kvtier-load"
        self._thread = None if inline else JobThread(name, self.device)
        self._inline_finished: list[TransferResult] = []  # the caller's thread only

    def _submit(self, job_id: int, plan: list[GroupCopy], nbytes: int) -> None:
        if self._thread is not None:
            self._thread.submit(job_id, lambda: self._run(job_id, plan, nbytes))
            return
        try:
            result = self._run(job_id, plan, nbytes)
        except Exception:
            logger.exception("kvtier: transfer job %d failed", job_id)
            result = TransferResult(job_id, False, 0, 0.0)
        self._inline_finished.append(result)

    def _run(self, job_id: int, plan: list[GroupCopy], nbytes: int) -> TransferResult:
        started = time.perf_counter()
        self._copy(plan)
        return TransferResult(job_id, True, nbytes, time.perf_counter() - started)

    def _copy(self, plan: list[GroupCopy]) -> None:
        for copy in plan:
            for view in self.layout.groups[copy.group]:
                engine = self._engine[view]  # (num_blocks, page_words)
                rows = self._rows[view]  # (num_chunks * factor, page_words)
                for first, start, end in self._runs(copy):
                    host_run = rows[first : first + end - start]
                    ids = copy.block_ids[start:end]
                    if self.store:  # indices were range-checked when the job was planned
                        np.take(engine, ids, axis=0, out=host_run, mode="clip")
                    else:
                        engine[ids] = host_run

    def get_finished(self) -> list[TransferResult]:
        finished, self._inline_finished = self._inline_finished, []
        return finished + (self._thread.get_finished() if self._thread is not None else [])

    def wait(self, job_ids: Collection[int]) -> None:
        if self._thread is not None:
            self._thread.wait(job_ids)

    def shutdown(self) -> None:
        if self._thread is not None:
            self._thread.shutdown()

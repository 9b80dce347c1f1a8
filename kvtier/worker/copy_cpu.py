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
import threading
import time
from collections.abc import Collection
from concurrent.futures import Future, ThreadPoolExecutor, wait

import numpy as np

from kvtier.layout import KVLayout
from kvtier.tiers.cpu import HostTier
from kvtier.worker.base import TransferResult
from kvtier.worker.engine_host import EngineHostHandler
from kvtier.worker.job_thread import bind_thread
from kvtier.worker.plan import GroupCopy

logger = logging.getLogger(__name__)


class CpuCopyHandler(EngineHostHandler):
    """``inline``: copy in ``transfer_async`` itself instead of on the handler's thread."""

    def __init__(self, layout: KVLayout, host: HostTier, store: bool, inline: bool) -> None:
        super().__init__(layout, host, store)
        # numpy views sharing the tensors' memory
        self._engine = [view.numpy() for view in layout.views]
        self._rows = [host.page_rows(i).numpy() for i in range(len(layout.views))]
        self._jobs = None if inline else ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="kvtier-store" if store else "kvtier-load",
            initializer=bind_thread,
            initargs=(self.device,),
        )  # fmt: skip
        self._lock = threading.Lock()
        self._pending: dict[int, Future[None]] = {}  # guarded by _lock
        self._finished: list[TransferResult] = []  # guarded by _lock

    def _submit(self, job_id: int, plan: list[GroupCopy], nbytes: int) -> None:
        if self._jobs is None:
            self._run(job_id, plan, nbytes)
            return
        with self._lock:
            if job_id in self._pending:
                raise ValueError(f"kvtier: transfer job {job_id} is already in flight")
            self._pending[job_id] = self._jobs.submit(self._run, job_id, plan, nbytes)

    def _run(self, job_id: int, plan: list[GroupCopy], nbytes: int) -> None:
        started = time.perf_counter()
        success = True
        try:
            self._copy(plan)
        except Exception:
            logger.exception("kvtier: transfer job %d failed", job_id)
            success, nbytes = False, 0
        result = TransferResult(job_id, success, nbytes, time.perf_counter() - started)
        # recorded before the future completes, so wait() then get_finished() sees it
        with self._lock:
            self._pending.pop(job_id, None)
            self._finished.append(result)

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
        with self._lock:
            finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: Collection[int]) -> None:
        with self._lock:
            futures = [self._pending[j] for j in job_ids if j in self._pending]
        wait(futures)

    def shutdown(self) -> None:
        if self._jobs is not None:
            self._jobs.shutdown(wait=True)

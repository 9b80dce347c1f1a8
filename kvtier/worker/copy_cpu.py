"""Engine <-> host copies for CPU engine tensors, off the engine's step thread.

Each direction has one job thread, which keeps its jobs in submission order. A job's copies are
split by view across ``num_threads`` copy threads (shared by both directions), so several cores move
bytes while one thread pays Python's per-call cost. Threads bind the device once, in the pools'
initializer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection
from concurrent.futures import Future, ThreadPoolExecutor, wait

import torch

from kvtier.layout import KVLayout
from kvtier.tiers.cpu import HostTier
from kvtier.worker.base import TransferResult
from kvtier.worker.engine_host import EngineHostHandler, bind_thread
from kvtier.worker.plan import GroupCopy

logger = logging.getLogger(__name__)


class CopyLanes:
    """The copy threads shared by a store and a load handler; shut down when both released it."""

    def __init__(self, num_threads: int, device: torch.device) -> None:
        if num_threads < 1:
            raise ValueError(f"kvtier: num_copy_threads must be >= 1, got {num_threads}")
        self.num_threads = num_threads
        self.pool = ThreadPoolExecutor(
            num_threads, "kvtier-copy", initializer=bind_thread, initargs=(device,)
        )
        self._users = 0
        self._lock = threading.Lock()

    def acquire(self) -> CopyLanes:
        with self._lock:
            self._users += 1
        return self

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self.pool.shutdown(wait=True)


class CpuCopyHandler(EngineHostHandler):
    def __init__(self, layout: KVLayout, host: HostTier, store: bool, lanes: CopyLanes) -> None:
        super().__init__(layout, host, store)
        self._lanes = lanes.acquire()
        self._jobs = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="kvtier-store" if store else "kvtier-load",
            initializer=bind_thread,
            initargs=(self.device,),
        )
        self._lock = threading.Lock()
        self._pending: dict[int, Future[None]] = {}  # guarded by _lock
        self._finished: list[TransferResult] = []  # guarded by _lock

    def _submit(self, job_id: int, plan: list[GroupCopy], nbytes: int) -> None:
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
            del self._pending[job_id]
            self._finished.append(result)

    def _copy(self, plan: list[GroupCopy]) -> None:
        tasks = [
            (copy, torch.from_numpy(copy.block_ids), view)
            for copy in plan
            for view in self.layout.groups[copy.group]
        ]
        lanes = min(self._lanes.num_threads, len(tasks))
        futures = [
            self._lanes.pool.submit(self._copy_lane, tasks[lane::lanes]) for lane in range(lanes)
        ]
        wait(futures)
        for future in futures:
            future.result()  # re-raises a copy's error, once every lane stopped

    def _copy_lane(self, tasks: list[tuple[GroupCopy, torch.Tensor, int]]) -> None:
        for copy, block_ids, view in tasks:
            self._copy_view(copy, block_ids, view)

    def get_finished(self) -> list[TransferResult]:
        with self._lock:
            finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: Collection[int]) -> None:
        with self._lock:
            futures = [self._pending[j] for j in job_ids if j in self._pending]
        wait(futures)

    def shutdown(self) -> None:
        self._jobs.shutdown(wait=True)
        self._lanes.release()

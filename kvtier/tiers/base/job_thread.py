"""One thread that runs a handler's jobs in submission order and collects their results.

submit(job_id, run)   run() -> TransferResult, on the thread; an exception fails the job
get_finished()        results since the last call, each once
wait(job_ids)         block until those jobs finished
wait_any(timeout)     block until a job finished (or none is queued), at most ``timeout``
shutdown()            finish what is queued, stop the thread

``lanes > 1``: one thread per ``key`` of ``submit`` (up to ``lanes`` keys, ``KeyedThreads``);
jobs of one key run in submission order, jobs of different keys side by side.

engine_ready(device)  on CUDA, an event of the engine's stream as it is at submission, which a
                      job's writes into engine blocks wait for (None elsewhere)
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Hashable
from concurrent.futures import Future, wait

import torch

from kvtier.tiers.base.handler import TransferHandler, TransferResult
from kvtier.tiers.base.keyed_threads import KeyedThreads

logger = logging.getLogger(__name__)


BACKGROUND_NICE = 19  # the lowest CPU priority: a background copy takes what compute leaves


def bind_thread(device: torch.device, background: bool = False) -> None:
    """Thread-pool initializer: bind the worker's device once per thread (vLLM PR #39548).

    ``background``: this thread's copies never hold up the engine (threaded host-tier stores):
    on the CPU it runs at the lowest priority, taking the cycles the engine's compute threads
    leave; it still runs at once on an idle core, as when the engine waits for it. Not for a
    thread whose jobs hold pins others wait on (disk writes: a slow one blocks eviction).
    """
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif background:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        except OSError as error:  # not permitted here: a copy competes, nothing breaks
            logger.debug("kvtier: could not lower a copy thread's priority: %s", error)


def engine_ready(device: torch.device) -> torch.cuda.Event | None:
    """On CUDA, an event of the engine's current stream now: its work queued so far (a step
    still in flight) may still use blocks a job is about to fill, so the job's copies wait for
    it, not for the device. None off CUDA (a CPU engine's step is done when the next begins)."""
    if device.type != "cuda":
        return None
    ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
    ready.record(torch.cuda.current_stream(device))
    return ready


class JobThread:
    def __init__(
        self, name: str, device: torch.device, background: bool = False, lanes: int = 1
    ) -> None:
        self._pool = KeyedThreads(name, lanes, self._start, (device, background))
        self._idents: set[int] = set()  # the pool's threads, once started
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)  # notified as each job finishes
        self._pending: dict[int, Future[None]] = {}  # guarded by _lock
        self._finished: list[TransferResult] = []  # guarded by _lock

    def _start(self, device: torch.device, background: bool) -> None:
        bind_thread(device, background)
        self._idents.add(threading.get_ident())

    def submit(self, job_id: int, run: Callable[[], TransferResult], key: Hashable = None) -> None:
        with self._lock:
            if job_id in self._pending:
                raise ValueError(f"kvtier: transfer job {job_id} is already in flight")
            self._pending[job_id] = self._pool.submit(key, lambda: self._run(job_id, run))

    def _run(self, job_id: int, run: Callable[[], TransferResult]) -> None:
        started = time.perf_counter()
        try:
            result = run()
        except Exception:
            logger.exception("kvtier: transfer job %d failed", job_id)
            result = TransferResult(job_id, False, 0, time.perf_counter() - started)
        # recorded before the future completes, so wait() then get_finished() sees it
        with self._lock:
            self._pending.pop(job_id, None)
            self._finished.append(result)
            self._done.notify_all()

    def get_finished(self) -> list[TransferResult]:
        with self._lock:
            finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: Collection[int]) -> None:
        with self._lock:
            futures = [self._pending[j] for j in job_ids if j in self._pending]
        wait(futures)

    def wait_any(self, timeout: float) -> None:
        with self._done:
            self._done.wait_for(lambda: self._finished or not self._pending, timeout)

    def shutdown(self) -> None:
        """Finish the queued jobs and stop the threads; from a job thread itself (a finalizer
        the garbage collector ran there), stop them without waiting for itself."""
        self._pool.shutdown(wait=threading.get_ident() not in self._idents)


class ThreadedHandler(TransferHandler):
    """A handler whose jobs run on its ``JobThread`` (set ``self._thread`` in ``__init__``)."""

    _thread: JobThread

    def get_finished(self) -> list[TransferResult]:
        return self._thread.get_finished()

    def wait(self, job_ids: Collection[int]) -> None:
        self._thread.wait(job_ids)

    def wait_any(self, timeout: float) -> None:
        self._thread.wait_any(timeout)

    def shutdown(self) -> None:
        self._thread.shutdown()

"""Copy lanes: helper threads that take pieces of one job beside the thread that runs it.

    CopyLanes(name, helpers, device, background)  start ``helpers`` threads; each binds
                                       ``device`` once (``bind_thread``)
    run(pieces)                        run every piece on the calling thread and the helpers;
                                       returns once all finished, re-raising the first error
    shutdown()                         stop the helpers; ``run`` then works on the caller alone

Pieces are claimed one at a time from a shared cursor, by whichever lane is free first; the
calling thread is a lane too. It never waits for a piece nobody started: once the cursor is
exhausted it waits only for pieces a helper is running (each a copy that releases the GIL, so
bounded). A helper that is late, starved of a core or of the GIL, or already shut down, makes a job
slower, never stuck. Helpers block on a condition between jobs, with no timeout and no polling.

One ``run`` at a time per ``CopyLanes``: each handler (one direction) owns its lanes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch

from kvtier.tiers.base.job_thread import bind_thread

Piece = Callable[[], None]


class _Job:
    """One ``run``: its pieces and who holds which. Guarded by the lanes' lock."""

    def __init__(self, pieces: Sequence[Piece]) -> None:
        self.pieces = pieces
        self.next = 0  # the next piece nobody claimed yet
        self.running = 0  # pieces claimed and not finished
        self.error: BaseException | None = None

    def exhausted(self) -> bool:
        return self.next >= len(self.pieces) or self.error is not None


class CopyLanes:
    def __init__(
        self, name: str, helpers: int, device: torch.device, background: bool = False
    ) -> None:
        if helpers < 0:
            raise ValueError(f"kvtier: copy lanes need >= 0 helpers, got {helpers}")
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # helpers: a job was posted, or shutdown
        self._idle = threading.Condition(self._lock)  # the runner: a claimed piece finished
        self._job: _Job | None = None  # the job helpers may claim pieces of
        self._closed = False
        self._threads = [
            threading.Thread(
                target=self._helper,
                args=(device, background),
                name=f"{name}-lane{i + 1}",
                daemon=True,
            )
            for i in range(helpers)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def lanes(self) -> int:
        """Threads that copy a job's pieces: the caller, and the helpers until shutdown."""
        return 1 if self._closed else 1 + len(self._threads)

    def run(self, pieces: Sequence[Piece]) -> None:
        """Run ``pieces`` (in any order, on any lane); return when all finished.

        The first error stops the claiming of further pieces and is raised here, once no lane
        runs a piece of this job any more.
        """
        job = _Job(pieces)
        post = len(pieces) > 1 and bool(self._threads)
        if post:
            with self._lock:
                if self._job is not None:
                    raise RuntimeError("kvtier: copy lanes run one job at a time")
                self._job = job
                self._work.notify_all()
        try:
            self._drain(job)
        finally:
            with self._lock:
                if post:
                    self._job = None  # helpers claim nothing more of it
                while job.running:  # pieces helpers started: copies in progress
                    self._idle.wait()
        if job.error is not None:
            raise job.error

    def _drain(self, job: _Job) -> None:
        """Claim and run ``job``'s pieces until none is left unclaimed (or one failed)."""
        while True:
            with self._lock:
                if job.exhausted():
                    return
                piece = job.pieces[job.next]
                job.next += 1
                job.running += 1
            error: BaseException | None = None
            try:
                piece()
            except BaseException as raised:  # re-raised by run(), on the job's own thread
                error = raised
            with self._lock:
                job.running -= 1
                if error is not None and job.error is None:
                    job.error = error
                if not job.running:
                    self._idle.notify_all()

    def _helper(self, device: torch.device, background: bool) -> None:
        bind_thread(device, background)
        while True:
            with self._lock:
                while not self._closed and (self._job is None or self._job.exhausted()):
                    self._work.wait()
                if self._closed:
                    return
                job = self._job
            assert job is not None
            self._drain(job)

    def shutdown(self) -> None:
        """Stop the helpers (after the piece each may be running); ``run`` keeps working."""
        with self._lock:
            self._closed = True
            self._work.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()

"""Pinning the host tier for CUDA copies while the engine already serves.

    Pinning(memory, device, start=True)
                              registers ``memory`` with CUDA, a piece at a time, on a thread
    .start()                  begin, if not begun (``start=False``: the engine's first step)
    .begun                    whether it has
    .piece_bytes              bytes per registration: a CUDA copy must not cross a multiple of
                              it from the start of ``memory`` (``pages/plan.py`` cuts there)
    .pinned_bytes             bytes registered so far, from the start of ``memory``
    .wait(timeout) -> bool    whether all of it is registered (blocks up to ``timeout``)
    .rate()                   bytes per second registered (None: not started)
    .stop()                   no piece registered after the one under way (returns at once)
    .close()                  stop, then unregister what was registered

Allocating the tier pinned (``cudaHostAlloc``) holds the engine's start for as long as the driver
takes to pin every page (seconds per GiB: minutes for a large tier). Instead the tier is plain
memory, and ``cudaHostRegister`` pins it piece by piece, from slot 0 up (the order the scheduler
hands slots out in). A copy into a piece not yet pinned is still correct: CUDA stages pageable
memory itself, slower (and synchronously: ``copy_cuda.py`` queues such a job off the engine's
thread). A driver without the call, or one that refuses a piece, leaves the rest pageable, with
a warning.

The driver holds a lock of its own while it registers, which the engine's CUDA calls wait for:
measured on an H200, a probe of the engine's (a tiny kernel and a synchronize) took 37-117 ms
while 256 MiB pieces were registered, 0.04 ms before, so the engine barely ran while its tier
was pinned. PyTorch's pinned allocator faults pages in from threads before it registers them, to
keep its time under that lock short; so does this: each batch of pieces is faulted in first, on
threads of the lowest priority (``commit.Populator``: ``MADV_POPULATE_WRITE``, which writes no
byte, as stores may already be using the slots), then registered a piece at a time, and pieces
are small (``PIECE_BYTES``): the engine waits at most one short registration. The driver's lock
is not fair, though: released and taken again at once, it went from one registration to the
next while the engine's launch waited out eight of them (5 ms on an H200). So the pinning thread
pauses ``YIELD_S`` after each, for a waiting thread to take the lock first. (``bench gpu``'s
``pinning_engine_held_s`` measures what the engine waits.)
"""

from __future__ import annotations

import errno
import logging
import threading
import time

import torch

from kvtier.tiers.host.commit import Madvise, Populator
from kvtier.tiers.host.pin_driver import CudaDriver, Driver

logger = logging.getLogger(__name__)

PIECE_BYTES = 32 << 20  # registered per driver call: what the engine's CUDA calls may wait for
YIELD_S = 100e-6  # after each registration: the driver's lock to a thread waiting for it
BATCH_PIECES = 8  # pieces faulted in together, on threads, before they are registered
OS_PAGE = 4096  # pieces share no page of memory: CUDA registers whole pages


class Pinning:
    def __init__(
        self,
        memory: torch.Tensor,
        device: torch.device,
        piece_bytes: int = PIECE_BYTES,
        driver: Driver | None = None,
        madvise: Madvise | None = None,
        start: bool = True,
    ) -> None:
        """``driver``: ``CudaDriver(device)`` when None (tests give their own where there is no
        GPU); ``madvise``: libc's when None; ``start``: begin now (else at ``start()``)."""
        if piece_bytes <= 0 or piece_bytes % OS_PAGE:
            raise ValueError(f"kvtier: pinning piece_bytes must be a positive multiple of "
                             f"{OS_PAGE}, got {piece_bytes}")  # fmt: skip
        self.total_bytes = memory.numel() * memory.element_size()
        self.piece_bytes = piece_bytes
        self._base = memory.data_ptr()
        self._driver = driver
        self._madvise = madvise
        self._registered: list[int] = []  # addresses of registered pieces, in order
        self._pinned = 0
        self._stop = threading.Event()
        self._done = threading.Event()
        self._started: float | None = None
        self._finished: float | None = None
        self._thread = threading.Thread(
            target=self._run, args=(device,), name="kvtier-pin", daemon=True
        )
        self._lock = threading.Lock()  # a start and a close, one at a time
        self._begun = False
        if start:
            self.start()

    def start(self) -> None:
        """Begin pinning, once: later calls (and one after ``stop``) do nothing."""
        if self._begun:  # the worker asks every step: no lock once begun
            return
        with self._lock:
            if not self._begun and not self._stop.is_set():
                self._begun = True
                self._thread.start()

    @property
    def begun(self) -> bool:
        return self._begun

    @property
    def pinned_bytes(self) -> int:
        return self._pinned

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def rate(self) -> float | None:
        """Bytes per second pinned, over the pieces done so far."""
        if self._started is None or not self._pinned:
            return None
        end = self._finished if self._finished is not None else time.perf_counter()
        return self._pinned / max(end - self._started, 1e-9)

    def _run(self, device: torch.device) -> None:
        populator = Populator(self._madvise, background=True)
        try:
            if self._driver is None:
                self._driver = CudaDriver(device)
            self._started = time.perf_counter()
            batch = self.piece_bytes * BATCH_PIECES
            for first in range(0, self.total_bytes, batch):
                end = min(first + batch, self.total_bytes)
                if self._stop.is_set() or not self._fault_in(populator, first, end):
                    return
                if not self._register(first, end):
                    return
            self._finished = time.perf_counter()
            logger.info("kvtier: host tier of %.2f GiB pinned in %.1f s",
                        self.total_bytes / 2**30, self._finished - self._started)  # fmt: skip
        except Exception:  # never let pinning break the engine: copies work unpinned
            logger.exception("kvtier: pinning the host tier failed; it stays pageable")
        finally:
            populator.close()
            self._done.set()

    def _fault_in(self, populator: Populator, first: int, end: int) -> bool:
        """Fault ``[first, end)`` in, a piece a thread; False: the memory is not there (the
        rest stays pageable). A kernel that cannot leaves it to the registration."""
        codes = populator.populate(self._base + first, end - first, self.piece_bytes) or []
        if errno.ENOMEM in codes:
            logger.warning("kvtier: the host tier's memory past %.2f of %.2f GiB is not there: "
                           "it stays pageable (configure less cpu_bytes_to_use)",
                           first / 2**30, self.total_bytes / 2**30)  # fmt: skip
            return False
        return True

    def _register(self, first: int, end: int) -> bool:
        """Register ``[first, end)`` a piece at a time; False: stopped, or refused."""
        assert self._driver is not None
        for at in range(first, end, self.piece_bytes):
            if self._stop.is_set():
                return False
            size = min(self.piece_bytes, end - at)
            code = self._driver.register(self._base + at, size)
            if code != 0:
                gib = (at / 2**30, self.total_bytes / 2**30)
                logger.warning("kvtier: cudaHostRegister refused the host tier at %.2f of "
                               "%.2f GiB (error %s): the rest stays pageable (slower "
                               "copies)", *gib, code)  # fmt: skip
                return False
            self._registered.append(self._base + at)
            self._pinned = at + size
            time.sleep(YIELD_S)
        return True

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """Stop pinning, and unregister every piece (the memory must outlive this call)."""
        with self._lock:
            self.stop()
            begun = self._begun
        if begun:
            self._thread.join()
        if self._driver is None:
            return
        for address in reversed(self._registered):
            self._driver.unregister(address)
        self._registered = []

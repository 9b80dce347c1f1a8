"""Committing the host tier's memory ahead of its stores, on a thread that runs only on idle cores.

    Prefault(regions, row_bytes, rows, window_rows)   start the thread (commits the first window)
    ahead_of(rows)        stores have reached row ``rows``: keep the window after it committed
    committed_rows        rows committed so far (each region up to there)
    close()               stop the thread (the memory stays)

On the CPU the host tier's pages are left to the kernel until first written, so a host tier the
engine never fills costs nothing. But the first store into a page then pays its fault and zeroing
in the step's store copy, and on a virtual machine whose host backs guest memory only when the
guest first touches it (this one), far more: about 2-4.5 ms per MiB against 0.2 ms per MiB into
memory already touched, which made the host tier's first fill cost 10-15 % of the throughput of
512 concurrent never-seen prompts (``kvtier bench concurrency``).

So a thread commits the rows just after the highest one a store has reached, a window ahead
(``madvise(MADV_POPULATE_WRITE)``, Linux 5.14: faults the pages in, writable, without touching
their bytes, so it never races a store writing the same page), in 2 MiB pieces, each call with the
GIL released. It runs under ``SCHED_IDLE``: only when a core would otherwise be idle (the engine's
serial Python between forwards), preempted at once when the engine wants the core. Memory
committed follows what stores reach plus the window, never the whole configured size at start.
A kernel without ``MADV_POPULATE_WRITE`` leaves the pages to the first store, as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import cast

logger = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14)
PIECE_BYTES = 2 << 20  # one transparent huge page per call
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Prefault:
    def __init__(
        self, regions: Sequence[tuple[int, int]], row_bytes: Sequence[int], rows: int,
        window_rows: int,
    ) -> None:  # fmt: skip
        """``regions``: (address, bytes) of each buffer, of ``rows`` rows of ``row_bytes[i]``
        bytes; the first ``window_rows`` are committed at once (in the background)."""
        self._regions = [(address, size, row) for (address, size), row in
                         zip(regions, row_bytes, strict=True)]  # fmt: skip
        self._rows = rows
        self._window = window_rows
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._target = min(rows, window_rows)  # rows to commit; guarded by _lock
        self._done = 0  # rows committed; guarded by _lock
        self._closed = False
        self._madvise = _madvise()
        self._thread: threading.Thread | None = None
        if self._madvise is not None and rows and self._regions:
            self._thread = threading.Thread(target=self._run, name="kvtier-prefault", daemon=True)
            self._thread.start()

    @property
    def committed_rows(self) -> int:
        with self._lock:
            return self._done

    def ahead_of(self, rows: int) -> None:
        """Stores have written rows below ``rows``: commit up to ``rows`` plus the window."""
        target = min(self._rows, rows + self._window)
        if target <= self._target:  # most steps: one comparison, no lock
            return
        with self._lock:
            if target > self._target:
                self._target = target
                self._wake.notify()

    def wait(self, timeout: float) -> bool:
        """Block until every row asked for is committed (tests); False on timeout."""
        with self._lock:
            return self._wake.wait_for(
                lambda: self._closed or self._done >= self._target or self._thread is None,
                timeout,
            )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        _idle_priority()
        while True:
            with self._lock:
                while not self._closed and self._done >= self._target:
                    self._wake.wait()
                if self._closed:
                    return
                start, end = self._done, self._target
            # a piece of about PIECE_BYTES of the widest region at a time, every region alike
            widest = max(row for _, _, row in self._regions)
            step = max(1, PIECE_BYTES // widest)
            for first in range(start, end, step):
                last = min(end, first + step)
                if not self._commit(first, last):
                    with self._lock:  # cannot commit here: leave the rest to the stores
                        self._done = self._target = self._rows
                        self._wake.notify_all()
                    return
                with self._lock:
                    self._done = last
                    if self._closed:
                        return
            with self._lock:
                self._wake.notify_all()

    def _commit(self, first: int, last: int) -> bool:
        assert self._madvise is not None
        for address, size, row in self._regions:
            begin = address + first * row
            length = min(size, last * row) - first * row
            aligned = begin - begin % PAGE
            if length > 0 and self._madvise(aligned, length + begin - aligned, MADV_POPULATE_WRITE):
                error = ctypes.get_errno()
                logger.info("kvtier: host tier memory left to the first stores (madvise: %s)",
                            os.strerror(error))  # fmt: skip
                return False
        return True


def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise``, called with the GIL released (None: not on this platform)."""
    name = ctypes.util.find_library("c")
    if name is None or not hasattr(os, "SCHED_IDLE"):
        return None
    try:
        function = ctypes.CDLL(name, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return cast(Callable[[int, int, int], int], function)


def _idle_priority() -> None:
    """This thread runs only when a core has nothing else to run (Linux: per thread)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError) as error:
        logger.debug("kvtier: prefault thread at normal priority: %s", error)

"""Pinning the host tier for CUDA copies while the engine already serves.

    Pinning(memory, device)   registers ``memory`` with CUDA, a piece at a time, on a thread
    .piece_bytes              bytes per registration: a CUDA copy must not cross a multiple of
                              it from the start of ``memory`` (``pages/plan.py`` cuts there)
    .pinned_bytes             bytes registered so far, from the start of ``memory``
    .wait(timeout) -> bool    whether all of it is registered (blocks up to ``timeout``)
    .rate()                   bytes per second registered (None: not started)
    .close()                  stop, then unregister what was registered

Allocating the tier pinned (``cudaHostAlloc``) holds the engine's start for as long as the driver
takes to pin every page (seconds per GiB: minutes for a large tier). Instead the tier is plain
memory, and ``cudaHostRegister`` pins it piece by piece, from slot 0 up (the order the scheduler
hands slots out in). A copy into a piece not yet pinned is still correct: CUDA stages pageable
memory itself, slower (and synchronously: ``copy_cuda.py`` queues such a job off the engine's
thread). A driver without the call, or one that refuses a piece, leaves the rest pageable, with
a warning.
"""

from __future__ import annotations

import logging
import threading
import time

import torch

logger = logging.getLogger(__name__)

PIECE_BYTES = 256 << 20  # registered per driver call
OS_PAGE = 4096  # pieces share no page of memory: CUDA registers whole pages


class Pinning:
    def __init__(
        self, memory: torch.Tensor, device: torch.device, piece_bytes: int = PIECE_BYTES
    ) -> None:
        if piece_bytes <= 0 or piece_bytes % OS_PAGE:
            raise ValueError(f"kvtier: pinning piece_bytes must be a positive multiple of "
                             f"{OS_PAGE}, got {piece_bytes}")  # fmt: skip
        self.total_bytes = memory.numel() * memory.element_size()
        self.piece_bytes = piece_bytes
        self._base = memory.data_ptr()
        self._registered: list[int] = []  # addresses of registered pieces, in order
        self._pinned = 0
        self._stop = threading.Event()
        self._done = threading.Event()
        self._started: float | None = None
        self._finished: float | None = None
        self._thread = threading.Thread(
            target=self._run, args=(device,), name="kvtier-pin", daemon=True
        )
        self._thread.start()

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
        try:
            torch.cuda.set_device(device)
            cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
            self._started = time.perf_counter()
            for at in range(0, self.total_bytes, self.piece_bytes):
                if self._stop.is_set():
                    return
                size = min(self.piece_bytes, self.total_bytes - at)
                code = cudart.cudaHostRegister(self._base + at, size, 0)
                if int(code) != 0:
                    gib = (at / 2**30, self.total_bytes / 2**30)
                    logger.warning("kvtier: cudaHostRegister refused the host tier at %.2f of "
                                   "%.2f GiB (error %s): the rest stays pageable (slower "
                                   "copies)", *gib, code)  # fmt: skip
                    return
                self._registered.append(self._base + at)
                self._pinned = at + size
            self._finished = time.perf_counter()
            logger.info("kvtier: host tier of %.2f GiB pinned in %.1f s",
                        self.total_bytes / 2**30, self._finished - self._started)  # fmt: skip
        except Exception:  # never let pinning break the engine: copies work unpinned
            logger.exception("kvtier: pinning the host tier failed; it stays pageable")
        finally:
            self._done.set()

    def close(self) -> None:
        """Stop pinning, and unregister every piece (the memory must outlive this call)."""
        self._stop.set()
        self._thread.join()
        if not self._registered:
            return
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        for address in reversed(self._registered):
            cudart.cudaHostUnregister(address)
        self._registered = []

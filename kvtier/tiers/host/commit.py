"""Committing the host tier's memory when it is built, before the engine serves a request.

    commit(buffers)  every page of ``buffers`` (contiguous CPU tensors) faulted in, writable;
                     ``ValueError`` naming ``cpu_bytes_to_use`` when the machine has not the memory
    Populator        the faulting itself, for a range (``pinning.py`` faults each piece of a GPU's
                     tier in before it registers it)

A page left to the kernel until a store first writes it is paid for by that store (its fault and
zeroing, much dearer on a virtual machine whose host backs guest memory only when first touched),
so by the requests of that step. Committed when built, the tier pays it once, at start-up, as
pinned memory on a GPU and vLLM's own CPU offloading (``torch.zeros``) do; and a machine without
the configured memory fails at start-up, naming the setting, instead of being killed for memory
when the tier fills.

How: ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14) faults the pages in without writing their bytes,
in pieces of ``PIECE_BYTES`` from up to ``WORKERS`` threads (each call releases the GIL), on
the cores this thread may run on (one, in vLLM's multi-process ranks). A kernel without it: one
byte written per page, which commits the same pages.

In the background (a GPU's tier pinned while the engine serves) each thread faults its piece in
``BACKGROUND_STEP`` at a time: a call holds the process's memory map (``mmap_lock``) for as long
as it faults, and the engine's threads wait behind it as soon as one of them changes the map (an
allocation): measured on an H200, a probe of the engine's (a tiny kernel, then a synchronize)
took up to 11-22 ms beside 32 MiB calls, 5 ms beside 2 MiB ones.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import torch

from kvtier.tiers.base.job_thread import bind_thread

logger = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14)
PIECE_BYTES = 64 << 20
BACKGROUND_STEP = 2 << 20  # bytes a call faults in, in the background
WORKERS = 8
PAGE = mmap.PAGESIZE

Madvise = Callable[[int, int, int], int]


class Populator:
    """Faults memory in without writing it (``MADV_POPULATE_WRITE``), ``PIECE_BYTES`` (or
    ``piece_bytes``) a thread, on up to ``WORKERS`` threads; ``populate`` returns each piece's
    errno (0: done; ``EINVAL``: a kernel before 5.14; ``ENOMEM``: the memory is not there), or
    None where there is no ``madvise`` (not Linux)."""

    def __init__(self, madvise: Madvise | None = None, background: bool = False) -> None:
        """``background``: its threads at the lowest CPU priority, each call faulting
        ``BACKGROUND_STEP`` bytes (the engine already serves)."""
        self._call = madvise or _libc_madvise()
        self._step = BACKGROUND_STEP if background else None
        self._pool = ThreadPoolExecutor(min(WORKERS, _cores()), "kvtier-populate", bind_thread,
                                        (torch.device("cpu"), background))  # fmt: skip

    def populate(self, address: int, size: int, piece_bytes: int = PIECE_BYTES) -> list[int] | None:
        call = self._call
        if call is None:
            return None
        pieces = _pieces(address, size, piece_bytes)
        step = self._step
        return list(self._pool.map(lambda p: _populate(call, p[0], p[1], step), pieces))

    def close(self) -> None:
        self._pool.shutdown()


def commit(buffers: Sequence[torch.Tensor], madvise: Madvise | None = None) -> float:
    """Fault every page of ``buffers`` in; the seconds it took. ``madvise``: libc's (found when
    None; a platform without it writes a byte per page instead)."""
    buffers = [buffer for buffer in buffers if buffer.numel()]
    total = sum(_size(buffer) for buffer in buffers)
    if not total:
        return 0.0
    started = time.perf_counter()
    logger.info("kvtier: committing the host tier's %.2f GiB of memory", total / 2**30)
    populator = Populator(madvise)
    try:
        found = [populator.populate(buffer.data_ptr(), _size(buffer)) for buffer in buffers]
    finally:
        populator.close()
    touch = [i for i, codes in enumerate(found) if codes is None or any(codes)]  # by writing
    if any(errno.ENOMEM in (codes or ()) for codes in found):
        raise ValueError(
            f"kvtier: cpu_bytes_to_use: the host tier's {total / 2**30:.2f} GiB could not be "
            f"committed ({os.strerror(errno.ENOMEM)}); configure less host memory"
        )
    for i in touch:  # (EINVAL: a kernel before 5.14)
        buffers[i].view(-1).view(torch.uint8)[::PAGE].zero_()
    seconds = time.perf_counter() - started
    logger.info("kvtier: host tier committed in %.1f s", seconds)
    return seconds


def _size(buffer: torch.Tensor) -> int:
    return buffer.numel() * buffer.element_size()


def _pieces(address: int, size: int, piece_bytes: int) -> list[tuple[int, int]]:
    """(address, bytes) pieces covering ``[address, address + size)``, the first from the start
    of its page."""
    start, end = address - address % PAGE, address + size
    return [(at, min(piece_bytes, end - at)) for at in range(start, end, piece_bytes)]


def _populate(call: Madvise, address: int, size: int, step: int | None = None) -> int:
    """0, or the errno of ``madvise`` on the piece (``step`` bytes a call: all at once if
    None)."""
    for at in range(address, address + size, step or size):
        if call(at, min(step or size, address + size - at), MADV_POPULATE_WRITE) != 0:
            return ctypes.get_errno()
    return 0


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _libc_madvise() -> Madvise | None:
    """libc's ``madvise``, called with the GIL released (None: not Linux, whose advice this is)."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return cast(Madvise, function)

"""Committing the host tier's memory when it is built, before the engine serves a request.

    commit(buffers)  every page of ``buffers`` (contiguous CPU tensors) faulted in, writable;
                     ``ValueError`` naming ``cpu_bytes_to_use`` when the machine has not the memory

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

logger = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14)
PIECE_BYTES = 64 << 20
WORKERS = 8
PAGE = mmap.PAGESIZE

Madvise = Callable[[int, int, int], int]


def commit(buffers: Sequence[torch.Tensor], madvise: Madvise | None = None) -> float:
    """Fault every page of ``buffers`` in; the seconds it took. ``madvise``: libc's (found when
    None; a platform without it writes a byte per page instead)."""
    buffers = [buffer for buffer in buffers if buffer.numel()]
    total = sum(_size(buffer) for buffer in buffers)
    if not total:
        return 0.0
    started = time.perf_counter()
    logger.info("kvtier: committing the host tier's %.2f GiB of memory", total / 2**30)
    call = madvise or _libc_madvise()
    touch = list(range(len(buffers)))  # the buffers to commit by writing
    if call is not None:
        pieces = [(i, at, size) for i, buffer in enumerate(buffers)
                  for at, size in _pieces(buffer.data_ptr(), _size(buffer))]  # fmt: skip
        with ThreadPoolExecutor(min(WORKERS, _cores(), len(pieces))) as pool:
            codes = list(pool.map(lambda piece: _populate(call, piece[1], piece[2]), pieces))
        if errno.ENOMEM in codes:
            raise ValueError(
                f"kvtier: cpu_bytes_to_use: the host tier's {total / 2**30:.2f} GiB could not be "
                f"committed ({os.strerror(errno.ENOMEM)}); configure less host memory"
            )
        touch = sorted({i for (i, _, _), code in zip(pieces, codes, strict=True) if code})
    for i in touch:  # (EINVAL: a kernel before 5.14)
        buffers[i].view(-1).view(torch.uint8)[::PAGE].zero_()
    seconds = time.perf_counter() - started
    logger.info("kvtier: host tier committed in %.1f s", seconds)
    return seconds


def _size(buffer: torch.Tensor) -> int:
    return buffer.numel() * buffer.element_size()


def _pieces(address: int, size: int) -> list[tuple[int, int]]:
    """(address, bytes) pieces covering ``[address, address + size)``, the first from the start
    of its page."""
    start, end = address - address % PAGE, address + size
    return [(at, min(PIECE_BYTES, end - at)) for at in range(start, end, PIECE_BYTES)]


def _populate(call: Madvise, address: int, size: int) -> int:
    """0, or the errno of ``madvise`` on the piece."""
    return 0 if call(address, size, MADV_POPULATE_WRITE) == 0 else ctypes.get_errno()


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

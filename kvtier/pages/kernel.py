"""Two Triton kernels, over copy descriptors and over page grids, with a bounded number of programs
(defined in ``triton_kernels.py``, imported only where Triton is).

    available() -> bool                    Triton imports, a CUDA device is there, and both
                                           kernels compile for it and load on it (at the
                                           engine's start, not in its first job)
    reaches_host(device) -> bool           ``device`` addresses registered host memory at its
                                           host addresses (else no kernel touches host memory)
    fits(src, dst, size) -> bool           every address and size is a multiple of 8 bytes
    copy(descriptors, n, programs)         every ``(src, dst, size)`` copied, on the current
                                           stream; ``descriptors`` is ``(3, n)`` int64, on the
                                           device
    grid_copy(tables, span, host, store, launch)
                                           one grid of pages (``grid.py``) between the engine
                                           and host memory at address ``host``, each page's
                                           addresses computed on the device from ``V + K``
                                           table entries, not uploaded per page, as ``launch``
                                           says
    Launch(pages, block, warps, programs)  how the grid kernel moves pages of one size: pages a
                                           step per program, 8-byte words a step, warps per
                                           program, programs per launch; ``.word``: what every
                                           address and size must be a multiple of
    launch_for(page_bytes) -> Launch       the launch for pages of that size (or fewer bytes)
    warm(launch, device) -> bool           the grid kernel compiled and loaded for ``launch``,
                                           both ways, on ``device`` (``available``: the launch of
                                           large pages); False if it cannot be

Each program takes descriptors ``pid, pid + programs, ...`` and moves each in vectors of 8-byte
words. A program's step waits for its loads before it stores: a program has one step's bytes in
flight at a time, so one small page a step (4 KiB: a 70B-class model's tensor-parallel rank)
moves a page per bus round trip; the grid kernel moves several small pages a step. A bounded
grid keeps the copy from taking every SM while the engine computes (``kvtier bench gpu``
measures it beside a matmul loop). Addresses may be device memory or pinned host memory
(unified addressing: the kernel then reads or writes host memory over PCIe, without the copy
engine).

``launch_for`` is measured, on an H200 against one contiguous copy of the same bytes over the
copy engine, a job's time on the device (``bench/results/gpu.md``): pages of 32 KiB and more,
one a step of 32 KiB by 8 warps, 32 programs (0.94 of the copy storing, 0.92 loading; 16
programs of 16 KiB steps, the first setting: 0.93 and 0.90); 16 KiB pages, two a step, 64
programs; smaller pages, 16 KiB of them a step by 4 warps, 256 programs, in 16-byte vectors
(4 KiB pages: 0.90 and 0.87; 16 programs in words: 0.81 and 0.76). More programs than that
gained nothing, and brought a matmul beside the copies near 1.05 x.
"""

from __future__ import annotations

import ctypes
import logging
from functools import cache
from typing import Any, NamedTuple

import numpy as np
import torch

logger = logging.getLogger(__name__)

PROGRAMS = 16  # the copy kernel's programs per launch: a share of the SMs, not all of them
BLOCK_WORDS = 2048  # 8-byte words the copy kernel's programs move per step
MAX_PAGES = 16  # the grid kernel's pages a step, at most
LARGE_PAGE = 32 << 10  # bytes: pages this large or larger go one a step
HOST_POINTERS = 91  # CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM


class Launch(NamedTuple):
    pages: int  # pages a step per program (several: ``triton_kernels._grid_pages``)
    block: int  # 8-byte words a program moves per step, all its pages'
    warps: int  # per program
    programs: int  # per launch

    @property
    def word(self) -> int:
        """What every address and page size must be a multiple of: several pages a step move
        16-byte vectors."""
        return 16 if self.pages > 1 else 8


def launch_for(page_bytes: int) -> Launch:
    """How the grid kernel moves pages of ``page_bytes`` (or fewer), as measured (above)."""
    if page_bytes >= LARGE_PAGE // 2:
        pages = max(1, LARGE_PAGE // max(page_bytes, 1))  # 2 of 16 KiB, else 1
        return Launch(pages, LARGE_PAGE // 8, 8, 32 * pages)
    fit = LARGE_PAGE // 2 // max(page_bytes, 1)
    return Launch(min(MAX_PAGES, 1 << (fit.bit_length() - 1)), LARGE_PAGE // 16, 4, 256)


LARGE = launch_for(LARGE_PAGE)  # compiled by ``available``


@cache
def _kernel() -> Any:
    from kvtier.pages.triton_kernels import copy_kernel

    return copy_kernel


@cache
def _grid_kernel() -> Any:
    from kvtier.pages.triton_kernels import grid_kernel

    return grid_kernel


@cache
def available() -> bool:
    """Whether the kernels move pages here (else torch's index ops gather). Each kernel is
    compiled for the current device as its launches type it (int64 tables, 32-bit counts, a
    64-bit host address), and loaded there (``_load``): a Triton that cannot compile them, or a
    GPU that cannot load them, is found now, not in a job."""
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    try:
        _kernel().warmup(torch.int64, 1, BLOCK=BLOCK_WORDS, grid=(1,))
        _compile_grid(LARGE)
        _load(LARGE, torch.device("cuda"))  # the current device
    except Exception:
        logger.warning("kvtier: Triton cannot compile the copy kernels; torch moves the pages",
                       exc_info=True)  # fmt: skip
        return False
    return True


def warm(launch: Launch, device: torch.device) -> bool:
    """Whether the grid kernel compiles for ``launch`` on CUDA ``device``, both ways; compiled
    once, at a mover's start (large pages' by ``available``), not in its first job."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _warm(launch, index)


@cache
def _warm(launch: Launch, index: int) -> bool:
    try:
        with torch.cuda.device(index):
            _compile_grid(launch)
            _load(launch, torch.device("cuda", index))
    except Exception:
        logger.warning("kvtier: Triton cannot compile the grid kernel for %s; it moves pages as "
                       "large ones", launch, exc_info=True)  # fmt: skip
        return False
    return True


def _load(launch: Launch, device: torch.device) -> None:
    """The grid kernel of ``launch`` both ways (and, for large pages', the copy kernel)
    launched on ``device`` with nothing to move, and waited for. Triton loads a kernel onto the
    GPU at its first launch, not at its compile, and two threads' first launches of one kernel
    race there (one may launch it before it is loaded): the engine's thread, the pageable lane,
    the disk and peer threads all launch these. So each is loaded here, before any job."""
    table = torch.zeros(4, dtype=torch.int64, device=device)
    if launch == LARGE:
        _kernel()[(1,)](table, 0, BLOCK=BLOCK_WORDS)
    for store in (True, False):
        _grid_kernel()[(1,)](table, table, 0, 0, 1 << 40, STORE=store, BLOCK=launch.block,
                             PAGES=launch.pages, num_warps=launch.warps)  # fmt: skip
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _compile_grid(launch: Launch) -> None:
    """The grid kernel compiled both ways for the current device, as its launches type it."""
    for store in (True, False):
        _grid_kernel().warmup(torch.int64, torch.int64, 1, 1, 1 << 40, STORE=store,
                              BLOCK=launch.block, PAGES=launch.pages, num_warps=launch.warps,
                              grid=(1,))  # fmt: skip


def reaches_host(device: torch.device) -> bool:
    """Whether CUDA ``device`` reads and writes registered host memory at its host addresses, as
    the kernels do (the driver's CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: true on Linux with
    unified addressing, not under WSL). False where it cannot be asked: then the copy engine
    moves host memory."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _reaches_host(index)


@cache
def _reaches_host(index: int) -> bool:
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        device, value = ctypes.c_int(), ctypes.c_int()
        failed = (
            driver.cuInit(0)
            or driver.cuDeviceGet(ctypes.byref(device), index)
            or driver.cuDeviceGetAttribute(ctypes.byref(value), HOST_POINTERS, device)
        )
    except (OSError, AttributeError):  # no driver library, or not this one
        failed = True
    if failed or value.value != 1:
        logger.warning("kvtier: CUDA device %d cannot use host pointers to registered memory; "
                       "its pages move by the copy engine", index)  # fmt: skip
        return False
    return True


def fits(src: np.ndarray, dst: np.ndarray, size: np.ndarray) -> bool:
    """Whether the kernel can move these copies (8-byte words throughout)."""
    if not len(size):
        return True
    combined = np.bitwise_or.reduce(np.concatenate([src, dst, size]))
    return not int(combined) % 8


def copy(descriptors: torch.Tensor, n: int, programs: int = PROGRAMS) -> None:
    """Queue the ``n`` copies of ``descriptors`` (``(3, n)`` int64 on the device: sources,
    destinations, sizes) on the current stream."""
    if n:
        _kernel()[(min(programs, n),)](descriptors, n, BLOCK=BLOCK_WORDS)


def grid_copy(
    tables: torch.Tensor, span: tuple[int, int, int, int], host: int, store: bool, launch: Launch
) -> None:
    """Queue one grid's pages on the current stream: ``tables`` is ``grid.Tables.flat`` on the
    device (checked for ``launch.word``), ``span`` the grid's ``(per-view at, V, per-block at,
    K)`` in it; engine -> host memory at address ``host`` when ``store``; ``launch``
    ``warm``ed."""
    view_at, views, block_at, blocks = span
    if views and blocks:
        grid = (min(launch.programs, -(-views * blocks // launch.pages)),)
        _grid_kernel()[grid](tables[view_at:], tables[block_at:], views, blocks, host,
                             STORE=store, BLOCK=launch.block, PAGES=launch.pages,
                             num_warps=launch.warps)  # fmt: skip

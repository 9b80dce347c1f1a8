"""Two Triton kernels, over copy descriptors and over page grids, with a bounded number of programs.

    available() -> bool                    Triton imports and a CUDA device is there
    fits(src, dst, size) -> bool           every address and size is a multiple of 8 bytes
    copy(descriptors, n, programs)         every ``(src, dst, size)`` copied, on the current
                                           stream; ``descriptors`` is ``(3, n)`` int64, on the
                                           device
    grid_copy(tables, span, host, store, programs)
                                           one grid of pages (``grid.py``) between the engine
                                           and host memory at address ``host``, each page's
                                           addresses computed on the device from ``V + K``
                                           table entries, not uploaded per page

Each program takes descriptors ``pid, pid + programs, ...`` and moves each in vectors of 8-byte
words. A bounded grid keeps the copy from taking every SM while the engine computes (``kvtier bench
gpu`` measures it beside a matmul loop). Addresses may be device memory or pinned host memory
(unified addressing: the kernel then reads or writes host memory over PCIe, without the copy
engine).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import torch

PROGRAMS = 16  # programs per launch: a share of the SMs, not all of them
BLOCK_WORDS = 2048  # 8-byte words each program moves per step


@cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n"])  # type: ignore[untyped-decorator]
    def copy_kernel(table, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: N803
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        offsets = tl.arange(0, BLOCK)
        job = pid
        while job < n:
            src = tl.load(table + job).to(tl.pointer_type(tl.int64))
            dst = tl.load(table + n + job).to(tl.pointer_type(tl.int64))
            words = tl.load(table + 2 * n + job) // 8
            for start in range(0, words, BLOCK):
                index = start + offsets
                mask = index < words
                tl.store(dst + index, tl.load(src + index, mask=mask), mask=mask)
            job += programs

    return copy_kernel


@cache
def _grid_kernel() -> Any:
    import triton
    import triton.language as tl

    # sizes and addresses vary per job: one compiled kernel for all (no value specialization)
    @triton.jit(do_not_specialize=["V", "K", "host"])  # type: ignore[untyped-decorator]
    def grid_kernel(per_view, per_block, V, K, host, STORE: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: N803
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        offsets = tl.arange(0, BLOCK)
        item = pid
        while item < V * K:  # views outer, blocks inner: grid.addresses' order
            v = item // K
            k = item - v * K
            base = tl.load(per_view + v)
            stride = tl.load(per_view + V + v)
            page = tl.load(per_view + 2 * V + v)
            within = tl.load(per_view + 3 * V + v)
            block = tl.load(per_block + k)
            at = tl.load(per_block + K + k)
            sub = tl.load(per_block + 2 * K + k)
            engine = (base + block * stride).to(tl.pointer_type(tl.int64))
            hosted = (host + at + within + sub * page).to(tl.pointer_type(tl.int64))
            words = page // 8
            for start in range(0, words, BLOCK):
                index = start + offsets
                mask = index < words
                if STORE:
                    tl.store(hosted + index, tl.load(engine + index, mask=mask), mask=mask)
                else:
                    tl.store(engine + index, tl.load(hosted + index, mask=mask), mask=mask)
            item += programs

    return grid_kernel


@cache
def available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        _kernel()
        _grid_kernel()
    except Exception:  # Triton absent or unusable: the torch path moves the pages
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
    tables: torch.Tensor,
    span: tuple[int, int, int, int],
    host: int,
    store: bool,
    programs: int = PROGRAMS,
) -> None:
    """Queue one grid's pages on the current stream: ``tables`` is ``grid.Tables.flat`` on the
    device, ``span`` the grid's ``(per-view at, V, per-block at, K)`` in it; engine -> host
    memory at address ``host`` when ``store``."""
    view_at, views, block_at, blocks = span
    if views and blocks:
        grid = (min(programs, views * blocks),)
        _grid_kernel()[grid](tables[view_at:], tables[block_at:], views, blocks, host,
                             STORE=store, BLOCK=BLOCK_WORDS)  # fmt: skip

"""kvtier's two Triton kernels, defined where Triton is imported: ``kernel.py`` imports this
module only once it knows Triton is there (kvtier runs without it).

    copy_kernel(table, n, BLOCK)           the ``n`` copies ``(src, dst, bytes)`` of ``table``
    grid_kernel(per_view, per_block, V, K, host, STORE, BLOCK, PAGES)
                                           one grid of pages between the engine and host memory,
                                           ``PAGES`` pages a step per program (several: every
                                           address and page size a multiple of 16 bytes)

Triton reads a kernel's source and resolves its names, annotations included, in this module's
globals: ``tl`` must be one (Triton before 3.4 fails with "tl is not defined" otherwise).
"""

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


# sizes and addresses vary per job: one compiled kernel for all (no value specialization)
@triton.jit(do_not_specialize=["V", "K", "host"])  # type: ignore[untyped-decorator]
def grid_kernel(per_view, per_block, V, K, host, STORE: tl.constexpr, BLOCK: tl.constexpr,  # type: ignore[no-untyped-def]  # noqa: N803
                PAGES: tl.constexpr):  # fmt: skip  # noqa: N803
    if PAGES > 1:
        _grid_pages(per_view, per_block, V, K, host, STORE, BLOCK // PAGES, PAGES)
    else:
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        offsets = tl.arange(0, BLOCK)
        item = pid
        while item < V * K:  # views outer, blocks inner: grid.addresses' order
            v = item // K
            engine, hosted, words = _page(per_view, per_block, V, K, host, v, item - v * K)
            engine = engine.to(tl.pointer_type(tl.int64))
            hosted = hosted.to(tl.pointer_type(tl.int64))
            for start in range(0, words, BLOCK):
                index = start + offsets
                mask = index < words
                if STORE:
                    tl.store(hosted + index, tl.load(engine + index, mask=mask), mask=mask)
                else:
                    tl.store(engine + index, tl.load(hosted + index, mask=mask), mask=mask)
            item += programs


@triton.jit  # type: ignore[untyped-decorator]
def _grid_pages(per_view, per_block, V, K, host, STORE: tl.constexpr, WIDTH: tl.constexpr,  # type: ignore[no-untyped-def]  # noqa: N803
                PAGES: tl.constexpr):  # fmt: skip  # noqa: N803
    """``grid_kernel`` for small pages: each step of a program moves ``PAGES`` consecutive items
    as the rows of one ``(PAGES, WIDTH)`` tile, so that as many bytes are in flight per program as
    a large page's step puts there (one small page at a time waits out a bus round trip each).
    Its addresses and sizes are multiples of 16 bytes (``grid.tables`` checks, for ``kernel.py``),
    which Triton is told, so that it moves 16-byte vectors: it cannot know that of addresses it
    reads from the tables, and moves single words otherwise (measured on an H200, 4 KiB pages:
    0.85-0.89 of one contiguous copy with vectors, 0.82-0.83 without)."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    rows = tl.arange(0, PAGES)
    offsets = tl.arange(0, WIDTH)
    first = pid * PAGES
    while first < V * K:
        item = first + rows
        live = item < V * K
        v, k = tl.where(live, item // K, 0), tl.where(live, item % K, 0)
        engine, hosted, words = _page(per_view, per_block, V, K, host, v, k)
        words = tl.multiple_of(tl.where(live, words, 0), 2)
        engine = tl.multiple_of(engine.to(tl.pointer_type(tl.int64)), 16)
        hosted = tl.multiple_of(hosted.to(tl.pointer_type(tl.int64)), 16)
        for start in range(0, tl.max(words, axis=0), WIDTH):
            index = start + offsets
            mask = index[None, :] < words[:, None]
            there = engine[:, None] + index[None, :]
            here = hosted[:, None] + index[None, :]
            if STORE:
                tl.store(here, tl.load(there, mask=mask), mask=mask)
            else:
                tl.store(there, tl.load(here, mask=mask), mask=mask)
        first += programs * PAGES


@triton.jit
def _page(per_view, per_block, V, K, host, v, k):  # type: ignore[no-untyped-def]  # noqa: N803
    """View ``v``'s page of the grid's block ``k`` (scalars, or vectors of them): its engine
    address, its host address and its 8-byte words, from the grid's tables."""
    base = tl.load(per_view + v)
    stride = tl.load(per_view + V + v)
    page = tl.load(per_view + 2 * V + v)
    within = tl.load(per_view + 3 * V + v)
    block = tl.load(per_block + k)
    at = tl.load(per_block + K + k)
    sub = tl.load(per_block + 2 * K + k)
    return base + block * stride, host + at + within + sub * page, page // 8

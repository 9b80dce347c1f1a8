"""kvtier's two Triton kernels, defined where Triton is imported: ``kernel.py`` imports this
module only once it knows Triton is there (kvtier runs without it).

    copy_kernel(table, n, BLOCK)           the ``n`` copies ``(src, dst, bytes)`` of ``table``
    grid_kernel(per_view, per_block, V, K, host, STORE, BLOCK)
                                           one grid of pages between the engine and host memory

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

"""One Triton kernel over copy descriptors, with a bounded number of programs.

    available() -> bool                    Triton imports and a CUDA device is there
    fits(src, dst, size) -> bool           every address and size is a multiple of 8 bytes
    copy(descriptors, n, programs)         every ``(src, dst, size)`` copied, on the current
                                           stream; ``descriptors`` is ``(3, n)`` int64, on the
                                           device

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

    @triton.jit  # type: ignore[untyped-decorator]
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
def available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        _kernel()
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

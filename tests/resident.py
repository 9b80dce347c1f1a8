"""Memory pages as the kernel holds them, for the host tier's tests: which are in memory
(Linux's ``mincore``), the NUMA policy of a mapping, and fresh memory no test touched before."""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import numpy as np
import torch

PAGE = mmap.PAGESIZE


def resident_bytes(address: int, size: int) -> int:
    """Bytes of the pages of ``[address, address + size)`` in memory (page by page: exactly that
    range, whatever mapping it lies in)."""
    first = address - address % PAGE
    end = address + size
    pages = -(-(end - first) // PAGE)
    found = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(first, end - first, found) == 0, ctypes.get_errno()
    return sum(page & 1 for page in found) * PAGE


def resident_kib(buffer: torch.Tensor) -> int:
    """KiB of ``buffer``'s pages in memory."""
    return resident_bytes(buffer.data_ptr(), buffer.numel() * buffer.element_size()) // 1024


def fresh(nbytes: int) -> torch.Tensor:
    """``nbytes`` of memory never touched: an anonymous mapping of its own (malloc could hand
    back memory a test before touched)."""
    return torch.from_numpy(np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8))


def numa_policy(address: int) -> str:
    """The policy ``/proc/self/numa_maps`` gives the mapping that starts at ``address``."""
    for line in Path("/proc/self/numa_maps").read_text().splitlines():
        start, policy, *_ = line.split()
        if int(start, 16) == address:
            return policy
    raise AssertionError(f"no mapping starts at {address:#x}")

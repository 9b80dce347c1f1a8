"""The host tier's buffers on the CPU: committed when built (no store pays a page fault), on huge
pages where the kernel offers them, aligned to them, and zero chunks."""

from __future__ import annotations

import ctypes
import errno
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from resident import PAGE, fresh, resident_kib

from kvtier.layout import build_layout
from kvtier.tiers.host.buffers import HUGE_PAGE, HostTier
from kvtier.tiers.host.commit import commit

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _huge(first: int, end: int) -> tuple[int, list[bool]]:
    """Of this process's mappings overlapping ``[first, end)`` (madvise splits an allocation's
    mapping at the 2 MiB boundaries inside it): their AnonHugePages (KiB) summed, and for each
    whether it is advised for huge pages (``hg`` in its VmFlags)."""
    total, advised, inside = 0, [], False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            start, stop = (int(part, 16) for part in fields[0].split("-"))
            inside = start < end and first < stop
        elif inside and fields[0] == "AnonHugePages:":
            total += int(fields[1])
        elif inside and fields[0] == "VmFlags:":
            advised.append("hg" in fields[1:])
    return total, advised


LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's mincore")


@LINUX
def test_a_host_tier_is_in_memory_when_built_before_any_store() -> None:
    caches = {"k": torch.zeros(4, 2048, dtype=torch.bfloat16)}  # 4 KiB pages
    host = HostTier(build_layout(caches, [["k"]], 4), num_chunks=4096, block_size_factor=2)
    assert host.nbytes == 32 << 20
    assert resident_kib(host.memory) == 32 << 10


def _failing(code: int) -> Callable[[int, int, int], int]:
    def madvise(address: int, size: int, advice: int) -> int:
        ctypes.set_errno(code)
        return -1

    return madvise


@LINUX
def test_a_kernel_without_populate_commits_by_writing_a_byte_per_page() -> None:
    buffer = fresh(16 << 20)
    assert resident_kib(buffer) == 0  # not yet
    commit([buffer], madvise=_failing(errno.EINVAL))  # as a kernel before 5.14 answers
    assert resident_kib(buffer) == 16 << 10


def test_memory_the_machine_cannot_commit_names_the_setting() -> None:
    with pytest.raises(ValueError, match="cpu_bytes_to_use"):
        commit([fresh(1 << 20)], madvise=_failing(errno.ENOMEM))


def _offers_huge_pages() -> bool:
    """Huge pages for memory advised so, allocated at fault time (compacting if need be)."""
    if not THP.exists() or "[never]" in THP.read_text():
        return False
    defrag = THP.with_name("defrag").read_text()
    return any(mode in defrag for mode in ("[always]", "[madvise]", "[defer+madvise]"))


@pytest.mark.skipif(not _offers_huge_pages(), reason="the kernel offers no huge pages at fault")
def test_a_host_tier_is_backed_by_huge_pages() -> None:
    caches = {"k": torch.zeros(4, 2048, dtype=torch.bfloat16)}  # 4 KiB pages
    host = HostTier(build_layout(caches, [["k"]], 4), num_chunks=8192, block_size_factor=2)
    buffer = host.memory
    assert host.nbytes == 8192 * 2 * 4096
    assert buffer.data_ptr() % HUGE_PAGE == 0  # rows on cache lines, pages on huge pages
    # advised for huge pages, every mapping it lies in, and committed when built: faulted in as
    # huge pages as far as the kernel has them (how many depends on how fragmented the host's
    # memory is: 30 of its 64 MiB on a machine busy with engines, all of it when idle)
    huge_kib, advised = _huge(buffer.data_ptr(), buffer.data_ptr() + host.nbytes)
    assert advised and all(advised)
    if huge_kib == 0 and _plain_huge_kib(host.nbytes) == 0:  # the bound, measured after it
        pytest.skip("the kernel had no free huge page now (memory fragmented), nor for a plain "
                    "allocation made after the host tier's")  # fmt: skip
    assert huge_kib >= HUGE_PAGE // 1024


def _plain_huge_kib(size: int) -> int:
    """KiB of huge pages the kernel gives a plain allocation of ``size`` bytes now (numpy advises
    one this large for huge pages), aligned and written a byte per page."""
    raw = np.empty(size + HUGE_PAGE, dtype=np.uint8)
    start = -raw.ctypes.data % HUGE_PAGE
    raw[start : start + size : PAGE] = 1
    return _huge(raw.ctypes.data + start, raw.ctypes.data + start + size)[0]


def test_a_host_tier_of_no_chunks_has_empty_memory() -> None:
    caches = {"k": torch.zeros(4, 16, dtype=torch.int64)}
    host = HostTier(build_layout(caches, [["k"]], 4), num_chunks=0, block_size_factor=1)
    assert host.memory.shape == (0, 128) and host.nbytes == 0

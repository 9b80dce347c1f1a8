"""The host tier's buffers on the CPU: huge pages where the kernel offers them (the first store
into a page pays one fault per 2 MiB, not per 4 KiB), aligned to them, and zero chunks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvtier.layout import build_layout
from kvtier.tiers.host.buffers import HUGE_PAGE, HostTier

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _huge_kib(first: int, end: int) -> int:
    """AnonHugePages (KiB) of this process's mappings overlapping ``[first, end)`` (madvise
    splits an allocation's mapping at the 2 MiB boundaries inside it)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            start, stop = (int(part, 16) for part in fields[0].split("-"))
            inside = start < end and first < stop
        elif inside and fields[0] == "AnonHugePages:":
            total += int(fields[1])
    return total


def _offers_huge_pages() -> bool:
    """Huge pages for memory advised so, allocated at fault time (compacting if need be)."""
    if not THP.exists() or "[never]" in THP.read_text():
        return False
    defrag = THP.with_name("defrag").read_text()
    return any(mode in defrag for mode in ("[always]", "[madvise]", "[defer+madvise]"))


@pytest.mark.skipif(not _offers_huge_pages(), reason="the kernel offers no huge pages at fault")
def test_a_filled_host_tier_is_backed_by_huge_pages() -> None:
    caches = {"k": torch.zeros(4, 2048, dtype=torch.bfloat16)}  # 4 KiB pages
    host = HostTier(build_layout(caches, [["k"]], 4), num_chunks=8192, block_size_factor=2)
    buffer = host.buffers[0]
    assert host.nbytes == 8192 * 2 * 4096
    assert buffer.data_ptr() % HUGE_PAGE == 0  # rows on cache lines, pages on huge pages
    buffer.fill_(1)  # 64 MiB written: the first stores' page faults
    assert _huge_kib(buffer.data_ptr(), buffer.data_ptr() + host.nbytes) >= 32 * 1024


def test_a_host_tier_of_no_chunks_has_empty_buffers() -> None:
    caches = {"k": torch.zeros(4, 16, dtype=torch.int64)}
    host = HostTier(build_layout(caches, [["k"]], 4), num_chunks=0, block_size_factor=1)
    assert host.buffers[0].shape == (0, 16) and host.nbytes == 0

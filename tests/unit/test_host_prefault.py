"""The host tier's memory is committed a window ahead of the highest slot a store reached, on an
idle-priority thread, without ever touching a byte a store wrote (``tiers/host/prefault.py``)."""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from kvtier.layout import build_layout
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.prefault import MADV_POPULATE_WRITE, Prefault, _madvise

ROW = 64 << 10  # bytes per row (slot)
ROWS = 256  # 16 MiB
WAIT_S = 30.0


def _populates() -> bool:
    """Whether this kernel has ``MADV_POPULATE_WRITE`` (Linux 5.14)."""
    madvise = _madvise()
    if madvise is None:
        return False
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(probe))
    ok = madvise(address, mmap.PAGESIZE, MADV_POPULATE_WRITE) == 0
    del address
    return ok


pytestmark = pytest.mark.skipif(not _populates(), reason="no MADV_POPULATE_WRITE here")


def _resident_kib(first: int, end: int) -> int:
    """Rss (KiB) of this process's mappings inside ``[first, end)``."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            start, stop = (int(part, 16) for part in fields[0].split("-"))
            inside = first <= start and stop <= end
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


@pytest.fixture
def region() -> Iterator[tuple[int, np.ndarray]]:
    """An anonymous mapping of its own (a shared one: never merged with a neighbour, so its
    resident size is its own), as rows; unmapped once nothing refers to it."""
    memory = mmap.mmap(-1, ROW * ROWS)
    rows = np.frombuffer(memory, dtype=np.uint8).reshape(ROWS, ROW)
    yield rows.ctypes.data, rows


def test_the_first_window_is_committed_then_a_window_past_each_frontier(
    region: tuple[int, np.ndarray],
) -> None:
    address, _ = region
    prefault = Prefault([(address, ROW * ROWS)], [ROW], ROWS, window_rows=32)
    try:
        assert prefault.wait(WAIT_S) and prefault.committed_rows == 32
        assert _resident_kib(address, address + ROW * ROWS) == 32 * ROW >> 10  # 2 MiB
        prefault.ahead_of(100)  # stores reached slot 100: commit to 132
        assert prefault.wait(WAIT_S) and prefault.committed_rows == 132
        assert _resident_kib(address, address + ROW * ROWS) == 132 * ROW >> 10
        prefault.ahead_of(50)  # behind what is committed: nothing more
        prefault.ahead_of(ROWS)  # capped at the buffer's end
        assert prefault.wait(WAIT_S) and prefault.committed_rows == ROWS
    finally:
        prefault.close()


def test_bytes_stores_wrote_are_never_touched(region: tuple[int, np.ndarray]) -> None:
    """A store may write a row the thread has not committed yet: committing it keeps them."""
    address, rows = region
    rows[40:60] = 7  # stores ahead of the committed window
    prefault = Prefault([(address, ROW * ROWS)], [ROW], ROWS, window_rows=8)
    try:
        prefault.ahead_of(ROWS)
        assert prefault.wait(WAIT_S) and prefault.committed_rows == ROWS
        assert (rows[40:60] == 7).all() and not rows[:40].any() and not rows[60:].any()
    finally:
        prefault.close()


def test_closed_it_commits_nothing_more(region: tuple[int, np.ndarray]) -> None:
    address, _ = region
    prefault = Prefault([(address, ROW * ROWS)], [ROW], ROWS, window_rows=16)
    assert prefault.wait(WAIT_S)
    prefault.close()
    prefault.ahead_of(ROWS)
    assert prefault.committed_rows == 16
    assert _resident_kib(address, address + ROW * ROWS) == 16 * ROW >> 10
    prefault.close()  # twice: harmless


def test_a_cpu_host_tier_commits_ahead_and_stops_when_closed() -> None:
    caches = {"k": torch.zeros(4, 1024, dtype=torch.float32)}  # 4 KiB pages
    host = HostTier(build_layout(caches, [["k"]], 4), num_chunks=64, block_size_factor=2)
    assert host.prefault is not None
    assert host.prefault.wait(WAIT_S) and host.prefault.committed_rows == 64  # 512 KiB < window
    host.buffers[0][3].fill_(1)
    written = host.buffers[0].clone()
    host.ahead_of(64)
    host.close()
    assert torch.equal(host.buffers[0], written)

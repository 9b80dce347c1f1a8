"""The host tier's memory is committed when it is built on the CPU (a first store into untouched
pages paid their fault and zeroing, about 3x the copy), so its pages count in the process's
resident memory from the start."""

from __future__ import annotations

import os

import torch

from kvtier.layout import build_layout
from kvtier.tiers.host.buffers import HostTier

NUM_BLOCKS = 16


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_cpu_host_tier_is_resident_once_built() -> None:
    caches = {"a.0": torch.zeros(NUM_BLOCKS, 8, 128), "a.1": torch.zeros(NUM_BLOCKS, 8, 128)}
    layout = build_layout(caches, [["a.0", "a.1"]], NUM_BLOCKS)
    num_chunks = (64 << 20) // (2 * layout.page_bytes[0] * 2)  # 64 MiB over two views, factor 2
    before = _resident_bytes()
    host = HostTier(layout, num_chunks, block_size_factor=2)
    grown = _resident_bytes() - before
    assert host.nbytes >= 60 << 20
    assert grown >= 0.9 * host.nbytes, (grown, host.nbytes)
    assert all(not bool(buffer.any()) for buffer in host.buffers)

"""The host-memory tier: one preallocated buffer per canonical engine view.

Buffer ``i`` is ``(num_chunks, page_words[i] * block_size_factor)`` in view ``i``'s word type: row
``s`` holds chunk slot ``s`` (its ``factor`` engine pages back to back). Slots are handed out by the
scheduler half's ``ChunkManager``; this class only owns the memory. Buffers are pinned when the
engine tensors live on CUDA, so copies can run asynchronously.

The memory is committed up front, as pinned memory is: on the CPU the buffers are written once
when built. Left untouched, the first store into each page pays the kernel's page fault and
zeroing, measured at about 3x the copy itself (8 MiB of 8 KiB rows: 7.1 ms into fresh pages,
2.5 ms into touched ones), for the whole first pass through the host tier; and a host tier too
large for the machine fails at start-up, not under load.
"""

from __future__ import annotations

import logging
import time

import torch

from kvtier.layout import KVLayout

logger = logging.getLogger(__name__)


class HostTier:
    def __init__(self, layout: KVLayout, num_chunks: int, block_size_factor: int) -> None:
        if block_size_factor < 1:
            raise ValueError(f"kvtier: block_size_factor must be >= 1, got {block_size_factor}")
        self.num_chunks = num_chunks
        self.block_size_factor = block_size_factor
        pin = layout.device.type == "cuda"
        # (num_chunks, page_words * factor) per view
        self.buffers: tuple[torch.Tensor, ...] = tuple(
            torch.empty(
                (num_chunks, view.shape[1] * block_size_factor), dtype=view.dtype, pin_memory=pin
            )
            for view in layout.views
        )
        if not pin:
            started = time.perf_counter()
            for buffer in self.buffers:
                buffer.zero_()  # commit the pages now, not on the first store into each
            logger.info(
                "kvtier: committed %.1f GiB of host memory in %.1f s",
                self.nbytes / 2**30, time.perf_counter() - started,
            )  # fmt: skip

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)

    def page_rows(self, view: int) -> torch.Tensor:
        """Buffer ``view`` as ``(num_chunks * factor, page_words)``: row ``s * factor + j`` is
        sub-block ``j`` of slot ``s``."""
        buffer = self.buffers[view]
        return buffer.view(self.num_chunks * self.block_size_factor, -1)

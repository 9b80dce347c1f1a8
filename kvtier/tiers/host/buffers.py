"""The host-memory tier: one preallocated buffer per canonical engine view.

Buffer ``i`` is ``(num_chunks, page_words[i] * block_size_factor)`` in view ``i``'s word type: row
``s`` holds chunk slot ``s`` (its ``factor`` engine pages back to back). Slots are handed out by the
scheduler half's ``ChunkManager``; this class only owns the memory. Buffers are pinned when the
engine tensors live on CUDA, so copies can run asynchronously.

On the CPU the pages are left to the kernel until a store first writes them. That first store pays
the page fault and zeroing, about 3x the copy itself (8 MiB of 8 KiB rows: 7.1 ms into fresh
pages, 2.5 ms into touched ones), once per page, during the host tier's first fill. Committing the
buffers when built moves that cost to start-up, but always pays it for the whole configured size:
on this machine (a VM) 1-2 s per GiB, for host tiers a short-lived engine never fills (the test
suite's bench engines: 16 s more in two files), so it is not done.
"""

from __future__ import annotations

import torch

from kvtier.layout import KVLayout


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

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)

    def page_rows(self, view: int) -> torch.Tensor:
        """Buffer ``view`` as ``(num_chunks * factor, page_words)``: row ``s * factor + j`` is
        sub-block ``j`` of slot ``s``."""
        buffer = self.buffers[view]
        return buffer.view(self.num_chunks * self.block_size_factor, -1)

"""The host-memory tier: one preallocated buffer per canonical engine view.

Buffer ``i`` is ``(num_chunks, page_words[i] * block_size_factor)`` in view ``i``'s word type: row
``s`` holds chunk slot ``s`` (its ``factor`` engine pages back to back). Slots are handed out by the
scheduler half's ``ChunkManager``; this class only owns the memory. Buffers are pinned when the
engine tensors live on CUDA, so copies can run asynchronously.

On the CPU the pages are left to the kernel until a store first writes them, so a host tier
the engine never fills costs nothing. The buffers are numpy's allocations, which numpy marks for
transparent huge pages (``madvise(MADV_HUGEPAGE)``, honoured when the kernel's mode is
``madvise`` or ``always``), started on a 2 MiB boundary: the first store into a page then pays
one fault per 2 MiB instead of one per 4 KiB. Measured on this machine, 8 MiB of 8 KiB rows
copied into pages never touched: 5.5 ms in torch's allocation (4 KiB faults), 1.6 ms in numpy's,
0.9 ms into pages already touched. On a virtual machine whose host backs guest memory only when
first touched (this one), memory never touched costs far more however it is faulted, about 4.5
ms per MiB (``kvtier bench concurrency``'s filled process tells that cost apart). Committing the
buffers when built would move it to start-up, and pay for the whole configured size at every
start, for host tiers a short-lived engine never fills; instead ``prefault.py`` commits them a
window ahead of the stores (``ahead_of``), on a thread that runs only on idle cores.
"""

from __future__ import annotations

import numpy as np
import torch

from kvtier.layout import KVLayout
from kvtier.tiers.host.prefault import Prefault

HUGE_PAGE = 2 << 20  # where the buffers start
PREFAULT_WINDOW_BYTES = 256 << 20  # committed ahead of the highest slot a store reached


class HostTier:
    def __init__(self, layout: KVLayout, num_chunks: int, block_size_factor: int) -> None:
        if block_size_factor < 1:
            raise ValueError(f"kvtier: block_size_factor must be >= 1, got {block_size_factor}")
        self.num_chunks = num_chunks
        self.block_size_factor = block_size_factor
        pin = layout.device.type == "cuda"
        # (num_chunks, page_words * factor) per view
        self.buffers: tuple[torch.Tensor, ...] = tuple(
            _allocate((num_chunks, view.shape[1] * block_size_factor), view.dtype, pin)
            for view in layout.views
        )
        self.prefault: Prefault | None = None
        if not pin and num_chunks:
            row_bytes = [b[0].numel() * b.element_size() for b in self.buffers]
            self.prefault = Prefault(
                [(b.data_ptr(), b.numel() * b.element_size()) for b in self.buffers],
                row_bytes, num_chunks, max(1, PREFAULT_WINDOW_BYTES // sum(row_bytes)),
            )  # fmt: skip

    def ahead_of(self, slots: int) -> None:
        """Stores have written slots below ``slots``: commit the memory after them (CPU)."""
        if self.prefault is not None:
            self.prefault.ahead_of(slots)

    def close(self) -> None:
        """Stop committing memory ahead (the buffers stay usable)."""
        if self.prefault is not None:
            self.prefault.close()

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)

    def page_rows(self, view: int) -> torch.Tensor:
        """Buffer ``view`` as ``(num_chunks * factor, page_words)``: row ``s * factor + j`` is
        sub-block ``j`` of slot ``s``."""
        buffer = self.buffers[view]
        return buffer.view(self.num_chunks * self.block_size_factor, -1)


def _allocate(shape: tuple[int, int], dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """An uninitialized buffer: pinned by torch for CUDA copies, else numpy's (huge pages),
    starting on a 2 MiB boundary: numpy's own start is only 16-byte aligned, which put rows
    across cache lines (CPU stores of 32-token chunks 5-10 % slower than into torch's memory)."""
    if pin or not shape[0]:
        return torch.empty(shape, dtype=dtype, pin_memory=pin)
    row_bytes = shape[1] * torch.empty((), dtype=dtype).element_size()
    raw = np.empty(shape[0] * row_bytes + HUGE_PAGE, dtype=np.uint8)
    start = -raw.ctypes.data % HUGE_PAGE
    rows = raw[start : start + shape[0] * row_bytes].reshape(shape[0], row_bytes)
    return torch.from_numpy(rows).view(dtype)

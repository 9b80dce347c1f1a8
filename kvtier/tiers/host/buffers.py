"""The host-memory tier: one preallocated buffer per canonical engine view.

Buffer ``i`` is ``(num_chunks, page_words[i] * block_size_factor)`` in view ``i``'s word type: row
``s`` holds chunk slot ``s`` (its ``factor`` engine pages back to back). Slots are handed out by the
scheduler half's ``ChunkManager``; this class only owns the memory. Buffers are pinned when the
engine tensors live on CUDA, so copies can run asynchronously.

On the CPU the buffers are numpy's allocations, which numpy marks for transparent huge pages
(``madvise(MADV_HUGEPAGE)``, honoured when the kernel's mode is ``madvise`` or ``always``),
started on a 2 MiB boundary, and committed when built (``commit.py``: every page faulted in
before the engine serves, as pinned memory is on CUDA), so no store pays a page fault. Measured
on this machine, 8 MiB of 8 KiB rows copied into pages never touched: 5.5 ms in torch's
allocation (4 KiB faults), 1.6 ms in numpy's (2 MiB faults), 0.9 ms into pages already touched;
and on a virtual machine that backs guest memory only when first touched, about 1.2-4.5 ms per
MiB however the pages are faulted: inside the stores, the 48 MiB a round of 512 never-seen prompts
stores took 116 ms against 24 ms into committed memory. Committing a window ahead of the stores
instead, on a ``SCHED_IDLE`` thread, was tried and measured worse (0%-hit throughput at 512
concurrent prompts 0.81 and 0.89 of the engine without kvtier, against 0.93 and 0.91 without
it): a core that commits a page stalls in the host for milliseconds, and the engine's compute
threads wait for it whatever the thread's priority. At start-up nothing waits on it.
"""

from __future__ import annotations

import numpy as np
import torch

from kvtier.layout import KVLayout
from kvtier.tiers.host.commit import commit

HUGE_PAGE = 2 << 20  # where the buffers start


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
        if not pin:  # (pinned memory is committed when allocated)
            commit(self.buffers)

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

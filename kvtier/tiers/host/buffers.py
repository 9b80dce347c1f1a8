"""The host-memory tier: one buffer of ``num_chunks`` slots, a chunk's record in each.

``memory`` is ``(num_chunks, record_bytes)`` bytes: slot ``s`` holds one chunk as its record
(``tiers/base/records.py``: the chunk's views one after the other, each its ``factor`` pages back
to back, the bytes of its disk file's or Redis record's payload). Slots are handed out by the
scheduler half's ``ChunkManager``; this class only owns the memory.

The memory is numpy's allocation, started on a 2 MiB boundary (numpy marks it for transparent
huge pages). For CPU engine tensors it is committed when built (``commit.py``: every page faulted
in before the engine serves, so no store pays a page fault). For CUDA engine tensors it prefers
the GPU's NUMA node (``numa.py``) and is pinned after the engine started, a piece at a time
(``pinning.py``), from the engine's first step on; copies are correct before that.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np
import torch

from kvtier.layout import KVLayout
from kvtier.pages import Pages
from kvtier.pages.grid import PageGrid, record_grid
from kvtier.tiers.base.chunk_plan import GroupCopy, join_by_group
from kvtier.tiers.base.records import RecordLayout
from kvtier.tiers.host.commit import commit
from kvtier.tiers.host.numa import place
from kvtier.tiers.host.pinning import PIECE_BYTES, Pinning

HUGE_PAGE = 2 << 20  # where the memory starts


class HostTier:
    def __init__(
        self,
        layout: KVLayout,
        num_chunks: int,
        block_size_factor: int,
        pin_piece_bytes: int = PIECE_BYTES,
        pin_now: bool = True,
    ) -> None:
        """``pin_now``: on a GPU, begin pinning now, else at ``start_pinning`` (the worker's
        first step: vLLM captures its CUDA graphs between the two, ``pinning.py``)."""
        self.records = RecordLayout.of(layout, block_size_factor)
        self.num_chunks = num_chunks
        self.block_size_factor = block_size_factor
        self.record_bytes = self.records.record_bytes
        self._page_bytes = np.array(self.records.page_bytes, dtype=np.int64)
        self._raw, self.memory = _allocate(num_chunks, self.record_bytes)  # (chunks, bytes)
        self.memory_np: np.ndarray = self.memory.numpy()
        self.pinning: Pinning | None = None
        self.node: int | None = None  # the NUMA node its pages prefer (``numa.py``)
        if layout.device.type == "cuda" and self.memory.numel():
            self.node = place(self.memory, layout.device)  # before a page is faulted in
            self.pinning = Pinning(self.memory, layout.device, pin_piece_bytes, start=pin_now)
            # unregistered before the memory is freed, however the tier is dropped
            self._release = weakref.finalize(self, _release, self.pinning, self._raw)
        elif self.memory.numel():
            commit([self.memory])

    def start_pinning(self) -> None:
        """Begin pinning, if not begun (nothing to pin on the CPU)."""
        if self.pinning is not None:
            self.pinning.start()

    @property
    def nbytes(self) -> int:
        return self.memory.numel()

    @property
    def pin_piece_bytes(self) -> int:
        """A CUDA copy must not cross a multiple of this from the memory's start (0: any may)."""
        return 0 if self.pinning is None else self.pinning.piece_bytes

    @property
    def pinned(self) -> bool:
        """Whether all of the memory is pinned for CUDA copies (False on the CPU)."""
        return self.pinned_below(self.num_chunks)

    def pinned_below(self, slot: int) -> bool:
        """Whether slots ``0 .. slot - 1`` are pinned for CUDA copies (False on the CPU): they
        are pinned lowest first, so a job whose slots are all below ``slot`` may take the
        ``KERNEL`` mechanism before the whole tier is pinned."""
        needed = slot * self.record_bytes
        return self.pinning is not None and self.pinning.pinned_bytes >= needed

    def record(self, slot: int, group: int) -> np.ndarray:
        """The bytes of slot ``slot`` that a chunk of ``group`` uses (a view, no copy)."""
        return self.memory_np[slot, : self.records.group_bytes(group)]

    def page(self, group: int, view: int, slot: int, sub: int) -> np.ndarray:
        """The bytes of sub-block ``sub`` of view ``view`` of a chunk of ``group`` in ``slot``."""
        index = self.records.groups[group].index(view)
        page = self.records.page_bytes[view]
        start = self.records.offsets(group)[index] + sub * page
        return self.memory_np[slot, start : start + page]

    def pages(self, group: int, index: int, dtype: np.dtype) -> np.ndarray:
        """``(num_chunks, factor, page_bytes // itemsize)`` view of the pages of the ``index``-th
        view of ``group`` in every slot, typed ``dtype`` (which must divide the page)."""
        view = self.records.groups[group][index]
        page = self.records.page_bytes[view]
        item = np.dtype(dtype).itemsize
        start = self.records.offsets(group)[index]
        if page % item or start % item or self.record_bytes % item:
            raise ValueError(f"kvtier: a {item}-byte word does not divide view {view}'s pages")
        typed = self.memory_np.view(dtype) if self.record_bytes else self.memory_np
        return np.lib.stride_tricks.as_strided(
            typed.reshape(-1)[start // item :],
            shape=(self.num_chunks, self.block_size_factor, page // item),
            strides=(self.record_bytes, page, item),
            writeable=True,
        )

    def page_map(self, group: int, block_ids: np.ndarray, rows: np.ndarray) -> Pages:
        """Engine blocks ``block_ids`` of ``group`` <-> host page rows ``rows`` (slot *
        factor + sub-block), as pages of every view of the group (``kvtier.pages``)."""
        return self.page_grid(group, block_ids, rows).pages(self._page_bytes)

    def page_grid(self, group: int, block_ids: np.ndarray, rows: np.ndarray) -> PageGrid:
        """``page_map``'s pages as a grid: the group's views times the blocks."""
        records = self.records
        return record_grid(records.groups[group], records.offsets(group), block_ids, rows,
                           self.block_size_factor, self.record_bytes)  # fmt: skip

    def page_grids(self, plan: Sequence[GroupCopy]) -> list[PageGrid]:
        """A job's pages as grids, one per group however many parts and requests the job has:
        the group's views times its blocks, the same work whatever the number of views (the
        ``kernel`` mechanism launches once per grid)."""
        return [self.page_grid(*copy) for copy in join_by_group(plan)]

    def close(self) -> None:
        """Stop pinning and unregister the memory (the engine's copies must be done)."""
        if self.pinning is not None:
            self._release()
            self.pinning = None


def _release(pinning: Pinning, raw: np.ndarray) -> None:
    """Unregister ``raw`` (kept alive until then) from CUDA."""
    del raw
    pinning.close()


def _allocate(num_chunks: int, record_bytes: int) -> tuple[np.ndarray, torch.Tensor]:
    """Uninitialized ``(num_chunks, record_bytes)`` bytes starting on a 2 MiB boundary (numpy's
    own start is only 16-byte aligned, which put rows across cache lines), and the raw
    allocation that owns them."""
    size = num_chunks * record_bytes
    raw = np.empty(size + HUGE_PAGE if size else 0, dtype=np.uint8)
    start = -raw.ctypes.data % HUGE_PAGE if size else 0
    rows = raw[start : start + size].reshape(num_chunks, record_bytes)
    return raw, torch.from_numpy(rows)

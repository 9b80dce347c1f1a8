"""``PageMover``: the one way kvtier moves engine pages to and from host memory.

    PageMover(views)              for a rank's block views (``layout.py``), on their device
    .store(pages, host)           engine pages -> ``host`` (bytes, CPU memory)
    .load(pages, host)            ``host`` -> engine pages

Each batch (``plan.py``) is one gather on the device into a staging area laid out as host memory
is, then one copy per run of adjacent host bytes (a store), or the mirror image (a load): a
4,096-token job of an 8B-class model (64 views of 32 KiB pages, 64-token chunks) is one gather
and one copy per chunk, where copying page by page took 16,384 copies. The large host copies run
on the copy engine (DMA); the gather and scatter stay on the device, where they cost a pass over
the bytes at the device's own bandwidth.

Work is queued on the caller's current stream and returns without waiting for it (CUDA); the
caller records an event to know when it is done. The staging area is reused in stream order. Host
memory must stay as it is (a load) or unread (a store) until then; it is fastest pinned, and
correct if not (CUDA stages pageable memory itself). With views on the CPU there is no staging:
each host copy is one numpy call straight between the engine's rows and host memory
(``direct.py``), in pieces that copy lanes run side by side (``pieces``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from kvtier.pages.direct import direct_pieces
from kvtier.pages.plan import Batch, Pages, plan_batches
from kvtier.pages.spaces import Spaces

STAGE_BYTES = 64 << 20  # the most one batch stages on the device


class PageMover:
    def __init__(self, views: Sequence[torch.Tensor], stage_bytes: int = STAGE_BYTES) -> None:
        if not views:
            raise ValueError("kvtier: PageMover needs at least one view")
        self.device = views[0].device
        self.spaces = Spaces.of(views)
        self.page_bytes = np.array([v.shape[1] * v.element_size() for v in views], dtype=np.int64)
        self.stage_bytes = max(stage_bytes, int(self.page_bytes.max()))
        self._stage = torch.empty(0, dtype=torch.uint8, device=self.device)
        self._word = self.spaces.tensors[0].dtype

    def batches(self, pages: Pages) -> list[Batch]:
        return plan_batches(pages, self.spaces, self.page_bytes, self.stage_bytes)

    def pieces(
        self, pages: Pages, host: torch.Tensor, store: bool, piece_bytes: int
    ) -> list[Callable[[], None]]:
        """Views on the CPU: the copies of ``pages`` straight between the engine and ``host``
        (1-D bytes, no staging), as pieces of about ``piece_bytes`` that copy lanes may run in
        any order and side by side (``direct.py``)."""
        if self.device.type != "cpu":
            raise ValueError(f"kvtier: direct copies need the engine on the CPU, not {self.device}")
        if not len(pages.views):
            return []
        (batch,) = plan_batches(pages, self.spaces, self.page_bytes, 1 << 62)
        return direct_pieces(batch, self.spaces, host, store, piece_bytes)

    def store(self, pages: Pages, host: torch.Tensor) -> int:
        """Queue the copies of ``pages`` into ``host`` (1-D bytes); the bytes moved."""
        if self.device.type == "cpu":
            return self._direct(pages, host, store=True)
        moved = 0
        for batch in self.batches(pages):
            stage, rows = self._area(batch.nbytes)
            for space, index, staged in batch.gathers:
                tensor = self.spaces.tensors[space]
                ids = self._upload(index)
                if staged is None:
                    torch.index_select(tensor, 0, ids, out=rows[: len(index)])
                else:
                    rows.index_copy_(0, self._upload(staged), tensor.index_select(0, ids))
            for at, offset, size in batch.copies.tolist():
                host[at : at + size].copy_(stage[offset : offset + size], non_blocking=True)
            moved += batch.nbytes
        return moved

    def load(self, pages: Pages, host: torch.Tensor) -> int:
        """Queue the copies of ``host`` (1-D bytes) into ``pages``; the bytes moved."""
        if self.device.type == "cpu":
            return self._direct(pages, host, store=False)
        moved = 0
        for batch in self.batches(pages):
            stage, rows = self._area(batch.nbytes)
            for at, offset, size in batch.copies.tolist():
                stage[offset : offset + size].copy_(host[at : at + size], non_blocking=True)
            for space, index, staged in batch.gathers:
                tensor = self.spaces.tensors[space]
                source = rows[: len(index)] if staged is None else rows[self._upload(staged)]
                tensor.index_copy_(0, self._upload(index), source)
            moved += batch.nbytes
        return moved

    def _direct(self, pages: Pages, host: torch.Tensor, store: bool) -> int:
        for piece in self.pieces(pages, host, store, 1 << 62):
            piece()
        return int(self.page_bytes[pages.views].sum())

    def _area(self, nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The staging area's first ``nbytes`` as bytes, and all of it as rows of the unit;
        grown (in stream order) when a batch needs more."""
        if self._stage.numel() < nbytes:
            self._stage = torch.empty(
                max(nbytes, min(self.stage_bytes, 2 * self._stage.numel())),
                dtype=torch.uint8,
                device=self.device,
            )
        unit = self.spaces.unit
        usable = self._stage.numel() // unit * unit
        rows = self._stage[:usable].view(self._word).view(usable // unit, -1)
        return self._stage[:nbytes], rows

    def _upload(self, index: np.ndarray) -> torch.Tensor:
        """``index`` on the device, through pinned memory (a pageable source would make the
        copy wait for the stream's earlier work)."""
        tensor = torch.from_numpy(np.ascontiguousarray(index, dtype=np.int64))
        if self.device.type != "cuda":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)

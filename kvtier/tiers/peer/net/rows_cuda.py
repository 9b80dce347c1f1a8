"""``CudaBlockRows``: engine rows on one CUDA device, staged through pinned host memory by
``kvtier.pages`` (one gather or scatter on the device and one host copy per transfer)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch

from kvtier.pages import PageMover, Pages
from kvtier.tiers.peer.net.base import row_bytes

STAGE_ALIGN = 1 << 20  # staging buffers grow in whole MiB
MOVER_STAGE_BYTES = 16 << 20  # each thread's staging area on the device


class CudaBlockRows:
    """``BlockRows`` over CUDA views shaped ``(num_blocks, page_words)``, all on one device.

    The device index is captured at construction; ``bind_thread`` makes it the current device of
    the calling thread (the server's and client's threads call it once when they start). Each
    thread has one pinned staging buffer per direction, grown to the largest transfer it served:
    ``read_rows`` gathers the rows device -> pinned and returns views of that buffer (valid until
    the thread's next ``read_rows``); ``write_rows`` returns views of the thread's receive buffer
    and ``commit`` of the same rows, on the same thread, scatters it pinned -> device. The rows
    lie back to back in the buffer, so a transfer is one gather (or scatter) on the device and
    one copy to (or from) the buffer, by the thread's own ``PageMover``, on a side stream of the
    thread; the copies are complete when the call returns.
    """

    def __init__(self, views: Sequence[torch.Tensor], groups: Sequence[Sequence[int]]) -> None:
        if not views:
            raise ValueError("CudaBlockRows needs at least one view")
        devices = {v.device for v in views}
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            raise ValueError(f"CudaBlockRows needs views on one CUDA device, got {devices}")
        for i, v in enumerate(views):
            if v.dim() != 2 or (v.shape[1] > 1 and v.stride(1) != 1):
                raise ValueError(f"view {i} must be (num_blocks, page_words) with contiguous rows")
        device = next(iter(devices))
        self.device_index = device.index if device.index is not None else 0
        self.views = tuple(views)
        self.groups = tuple(tuple(int(i) for i in group) for group in groups)
        for g, group in enumerate(self.groups):
            if any(not 0 <= i < len(views) for i in group):
                raise ValueError(f"group {g} names views {group}; there are {len(views)}")
        self.page_bytes = tuple(v.shape[1] * v.element_size() for v in views)
        self._num_blocks = np.array([v.shape[0] for v in views], dtype=np.int64)
        self._local = threading.local()  # per thread: stream, "read" and "write" buffers

    def bind_thread(self) -> None:
        torch.cuda.set_device(self.device_index)

    def read_rows(self, rows: Sequence[tuple[int, int]]) -> list[memoryview]:
        stage = self._stage("read", row_bytes(self.page_bytes, rows))
        with torch.cuda.device(self.device_index), torch.cuda.stream(self._stream()):
            self._mover().store(self._pages(rows), stage)
            self._stream().synchronize()
        return self._memoryviews(stage, rows)

    def write_rows(self, rows: Sequence[tuple[int, int]]) -> list[memoryview]:
        stage = self._stage("write", row_bytes(self.page_bytes, rows))
        return self._memoryviews(stage, rows)

    def commit(self, rows: Sequence[tuple[int, int]]) -> None:
        stage = self._local.write
        with torch.cuda.device(self.device_index), torch.cuda.stream(self._stream()):
            self._mover().load(self._pages(rows), stage)
            self._stream().synchronize()

    def _pages(self, rows: Sequence[tuple[int, int]]) -> Pages:
        """``rows`` as pages, back to back in a staging buffer, in order."""
        table = np.array(rows, dtype=np.int64).reshape(-1, 2)
        views, blocks = table[:, 0], table[:, 1]
        if len(table) and (  # never an index the device would fault on
            views.min() < 0 or views.max() >= len(self.views) or blocks.min() < 0
            or (blocks >= self._num_blocks[views]).any()
        ):  # fmt: skip
            raise ValueError(f"rows out of range: views {views.min()}..{views.max()}, "
                             f"blocks {blocks.min()}..{blocks.max()}")  # fmt: skip
        sizes = np.array(self.page_bytes, dtype=np.int64)[views]
        return Pages(table[:, 0], table[:, 1], np.cumsum(sizes) - sizes)

    def _mover(self) -> PageMover:
        mover: PageMover | None = getattr(self._local, "mover", None)
        if mover is None:
            mover = self._local.mover = PageMover(self.views, MOVER_STAGE_BYTES)
        return mover

    def _memoryviews(
        self, stage: torch.Tensor, rows: Sequence[tuple[int, int]]
    ) -> list[memoryview]:
        whole = memoryview(stage.numpy())  # type: ignore[arg-type]
        out, offset = [], 0
        for view, _ in rows:
            out.append(whole[offset : offset + self.page_bytes[view]])
            offset += self.page_bytes[view]
        return out

    def _stage(self, direction: str, nbytes: int) -> torch.Tensor:
        buf: torch.Tensor | None = getattr(self._local, direction, None)
        if buf is None or buf.numel() < nbytes:
            size = max(STAGE_ALIGN, -(-nbytes // STAGE_ALIGN) * STAGE_ALIGN)
            buf = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            setattr(self._local, direction, buf)
        return buf

    def _stream(self) -> torch.cuda.Stream:
        stream: torch.cuda.Stream | None = getattr(self._local, "stream", None)
        if stream is None:
            stream = torch.cuda.Stream(device=self.device_index)  # type: ignore[no-untyped-call]
            self._local.stream = stream
        return stream

"""``CudaBlockRows``: engine rows on one CUDA device, staged through pinned host memory."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from itertools import groupby

import torch

from kvtier.transfer.base import row_bytes

STAGE_ALIGN = 1 << 20  # staging buffers grow in whole MiB


class CudaBlockRows:
    """``BlockRows`` over CUDA views shaped ``(num_blocks, page_words)``, all on one device.

    The device index is captured at construction; ``bind_thread`` makes it the current device of
    the calling thread (the server's and client's threads call it once when they start). Each
    thread has one pinned staging buffer per direction, grown to the largest transfer it served:
    ``read_rows`` gathers the rows device -> pinned and returns views of that buffer (valid until
    the thread's next ``read_rows``); ``write_rows`` returns views of the thread's receive buffer
    and ``commit`` of the same rows, on the same thread, scatters it pinned -> device. Copies run
    on a side stream of the thread and are complete when the call returns.
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
        self._local = threading.local()  # per thread: stream, "read" and "write" buffers

    def bind_thread(self) -> None:
        torch.cuda.set_device(self.device_index)

    def read_rows(self, rows: Sequence[tuple[int, int]]) -> list[memoryview]:
        stage = self._stage("read", row_bytes(self.page_bytes, rows))
        stream = self._stream()
        with torch.cuda.device(self.device_index), torch.cuda.stream(stream):
            for view, blocks, lo, hi in self._runs(rows):
                src = self.views[view].index_select(0, blocks)  # (n, page_words), on the device
                stage[lo:hi].view(src.dtype).view(src.shape).copy_(src, non_blocking=True)
        stream.synchronize()
        return self._memoryviews(stage, rows)

    def write_rows(self, rows: Sequence[tuple[int, int]]) -> list[memoryview]:
        stage = self._stage("write", row_bytes(self.page_bytes, rows))
        return self._memoryviews(stage, rows)

    def commit(self, rows: Sequence[tuple[int, int]]) -> None:
        stage = self._local.write
        stream = self._stream()
        with torch.cuda.device(self.device_index), torch.cuda.stream(stream):
            for view, blocks, lo, hi in self._runs(rows):
                dst = self.views[view]
                src = stage[lo:hi].view(dst.dtype).view(-1, dst.shape[1])
                dst.index_copy_(0, blocks, src.to(dst.device, non_blocking=True))
        stream.synchronize()

    def _runs(
        self, rows: Sequence[tuple[int, int]]
    ) -> Iterator[tuple[int, torch.Tensor, int, int]]:
        """(view, block indices on the device, staging byte range) per run of one view's rows."""
        offset = 0
        device = torch.device("cuda", self.device_index)
        for view, run in groupby(rows, key=lambda row: row[0]):
            blocks = [block for _, block in run]
            size = len(blocks) * self.page_bytes[view]
            yield view, torch.tensor(blocks, device=device), offset, offset + size
            offset += size

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

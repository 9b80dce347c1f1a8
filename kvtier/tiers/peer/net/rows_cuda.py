"""``CudaBlockRows``: engine rows on one CUDA device, staged through pinned host memory by
``kvtier.pages``, a slice at a time, the device's half of one slice beside the socket's half of
the next."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvtier.pages import PageMover, Pages
from kvtier.tiers.peer.net.base import Rows, row_bytes, row_sizes

STAGE_ALIGN = 1 << 20  # staging buffers grow in whole MiB
MOVER_STAGE_BYTES = 16 << 20  # each thread's staging area on the device


@dataclass
class _Buffer:
    """A pinned staging buffer, the device's work on it not yet waited for, and the rows read
    ahead into it."""

    memory: torch.Tensor | None = None
    busy: torch.cuda.Event | None = None
    ahead: Rows | None = None

    def wait(self) -> None:
        if self.busy is not None:
            self.busy.synchronize()
            self.busy = None

    def at_least(self, nbytes: int) -> torch.Tensor:
        """The memory, grown to ``nbytes`` (whole MiB) if smaller; only once ``wait``ed."""
        if self.memory is None or self.memory.numel() < nbytes:
            size = max(STAGE_ALIGN, -(-nbytes // STAGE_ALIGN) * STAGE_ALIGN)
            self.memory = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        return self.memory


class _Thread(threading.local):
    """One thread's stream, mover and buffers: two for reads (one lent to the socket, one read
    ahead into) and two for writes (one receiving, one being committed)."""

    def __init__(self) -> None:
        self.stream: torch.cuda.Stream | None = None
        self.mover: PageMover | None = None
        self.reads = (_Buffer(), _Buffer())
        self.writes = (_Buffer(), _Buffer())
        self.lent = 0  # the read buffer whose views ``read_rows`` returned last
        self.writing = 0  # the write buffer ``write_rows`` returned last


class CudaBlockRows:
    """``BlockRows`` over CUDA views shaped ``(num_blocks, page_words)``, all on one device.

    The device index is captured at construction; ``bind_thread`` makes it the current device of
    the calling thread (the server's and client's threads call it once when they start). Each
    thread moves rows on a side stream of its own, with its own ``PageMover``, through pinned
    buffers of its own, grown to the largest slice it moved. The rows of a slice lie back to back
    in a buffer, so a slice is one ``PageMover`` move (by default the copy kernel, straight
    between the blocks and the pinned buffer) and one byte view for the socket.

    Serving: ``read_rows`` returns views of one read buffer, its rows gathered; ``read_ahead``
    starts the gather of the next slice into the other, so the device reads it while the socket
    sends the first. Pulling: ``write_rows`` returns views of one write buffer (once the commit
    that last used it is done); ``commit`` starts the scatter of it into the engine's blocks and
    returns, so the next slice arrives in the other buffer meanwhile; ``wait_for`` makes the
    thread's stream wait for an event (the engine's work before the pull) before any commit.
    ``flush`` waits for all the thread's device work.
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
        self._local = _Thread()

    def bind_thread(self) -> None:
        torch.cuda.set_device(self.device_index)

    def read_rows(self, rows: Rows) -> list[memoryview]:
        local = self._local
        spare = local.reads[1 - local.lent]
        spare.wait()  # read ahead (these rows, or others: then its buffer is reused)
        ahead = spare.ahead
        if ahead is None or (ahead is not rows and not np.array_equal(ahead, rows)):
            self._gather(rows, spare)
            spare.wait()
        spare.ahead = None
        local.lent = 1 - local.lent
        return self._memoryviews(spare, rows)

    def read_ahead(self, rows: Rows) -> None:
        spare = self._local.reads[1 - self._local.lent]
        spare.wait()
        self._gather(rows, spare)
        spare.ahead = rows

    def write_rows(self, rows: Rows) -> list[memoryview]:
        local = self._local
        local.writing = 1 - local.writing
        buffer = local.writes[local.writing]
        buffer.wait()  # its last commit
        buffer.at_least(row_bytes(self.page_bytes, rows))
        return self._memoryviews(buffer, rows)

    def commit(self, rows: Rows) -> None:
        buffer = self._local.writes[self._local.writing]
        assert buffer.memory is not None, "commit of rows never handed out by write_rows"
        with torch.cuda.device(self.device_index), torch.cuda.stream(self._stream()):
            self._mover().load(self._pages(rows), buffer.memory)
            buffer.busy = self._recorded()

    def wait_for(self, ready: torch.cuda.Event) -> None:
        self._stream().wait_event(ready)

    def flush(self) -> None:
        if self._local.stream is not None:
            self._local.stream.synchronize()
        for buffer in (*self._local.reads, *self._local.writes):
            buffer.busy = buffer.ahead = None

    def _gather(self, rows: Rows, buffer: _Buffer) -> None:
        """Start the gather of ``rows`` into ``buffer`` (``busy`` until done)."""
        memory = buffer.at_least(row_bytes(self.page_bytes, rows))
        with torch.cuda.device(self.device_index), torch.cuda.stream(self._stream()):
            self._mover().store(self._pages(rows), memory)
            buffer.busy = self._recorded()

    def _recorded(self) -> torch.cuda.Event:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(self._stream())
        return event

    def _pages(self, rows: Rows) -> Pages:
        """``rows`` as pages, back to back in a staging buffer, in order."""
        views, blocks = rows[:, 0], rows[:, 1]
        if len(rows) and (  # never an index the device would fault on
            views.min() < 0 or views.max() >= len(self.views) or blocks.min() < 0
            or (blocks >= self._num_blocks[views]).any()
        ):  # fmt: skip
            raise ValueError(f"rows out of range: views {views.min()}..{views.max()}, "
                             f"blocks {blocks.min()}..{blocks.max()}")  # fmt: skip
        sizes = row_sizes(self.page_bytes, rows)
        return Pages(views, blocks, np.cumsum(sizes) - sizes)

    def _mover(self) -> PageMover:
        if self._local.mover is None:
            self._local.mover = PageMover(self.views, MOVER_STAGE_BYTES, grids=False)  # rows
        return self._local.mover

    def _memoryviews(self, buffer: _Buffer, rows: Rows) -> list[memoryview]:
        """The rows' bytes in ``buffer``: one view, the rows back to back."""
        assert buffer.memory is not None
        whole = memoryview(buffer.memory.numpy())  # type: ignore[arg-type]
        return [whole[: row_bytes(self.page_bytes, rows)]]

    def _stream(self) -> torch.cuda.Stream:
        if self._local.stream is None:
            self._local.stream = torch.cuda.Stream(device=self.device_index)  # type: ignore[no-untyped-call]
        return self._local.stream

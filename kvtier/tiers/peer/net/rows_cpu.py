"""``CpuBlockRows``: engine rows on the CPU, handed to the sockets in place (no copies), rows
that lie back to back as one byte view."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvtier.tiers.peer.net.base import Rows


class CpuBlockRows:
    """``BlockRows`` over CPU views shaped ``(num_blocks, page_words)`` (``KVLayout.views``).

    ``read_rows`` and ``write_rows`` return byte memoryviews straight on the views' memory, which
    stays owned by the engine, one per run of rows that lie back to back in a view (consecutive
    blocks of a view whose rows are packed); ``read_ahead``, ``commit``, ``flush`` and
    ``wait_for`` do nothing (the bytes are sent from, and land, in place). A row out of range is
    a ``ValueError``.
    """

    def __init__(
        self, views: Sequence[torch.Tensor | np.ndarray], groups: Sequence[Sequence[int]]
    ) -> None:
        tensors = [torch.from_numpy(v) if isinstance(v, np.ndarray) else v for v in views]
        self.groups = tuple(tuple(int(i) for i in group) for group in groups)
        for g, group in enumerate(self.groups):
            if any(not 0 <= i < len(tensors) for i in group):
                raise ValueError(f"group {g} names views {group}; there are {len(tensors)}")
        self._spans = [_byte_span(i, t) for i, t in enumerate(tensors)]  # row 0 to the last's end
        self.page_bytes = tuple(t.shape[1] * t.element_size() for t in tensors)
        self.num_blocks = tuple(int(t.shape[0]) for t in tensors)
        self._sizes = np.array(self.page_bytes, dtype=np.int64)
        self._counts = np.array(self.num_blocks, dtype=np.int64)
        self._strides = np.array([t.stride(0) * t.element_size() for t in tensors], np.int64)

    def read_rows(self, rows: Rows) -> list[memoryview]:
        return self._runs(rows)

    def read_ahead(self, rows: Rows) -> None:
        pass  # read in place when sent

    def write_rows(self, rows: Rows) -> list[memoryview]:
        return self._runs(rows)

    def commit(self, rows: Rows) -> None:
        pass  # received in place

    def flush(self) -> None:
        pass

    def bind_thread(self) -> None:
        pass

    def wait_for(self, ready: torch.cuda.Event) -> None:
        pass  # a CPU engine's step is done when the next begins

    def _runs(self, rows: Rows) -> list[memoryview]:
        """The rows' bytes in order, a view per run of rows back to back in one view."""
        if not len(rows):
            return []
        views, blocks = rows[:, 0], rows[:, 1]
        if views.min() < 0 or views.max() >= len(self._spans):
            raise ValueError(f"rows name views {views.min()}..{views.max()}; "
                             f"there are {len(self._spans)}")  # fmt: skip
        bad = np.flatnonzero((blocks < 0) | (blocks >= self._counts[views]))
        if len(bad):
            view, block = int(views[bad[0]]), int(blocks[bad[0]])
            raise ValueError(f"block {block} out of range for view {view} "
                             f"({self.num_blocks[view]})")  # fmt: skip
        starts = blocks * self._strides[views]
        stops = starts + self._sizes[views]
        first = np.flatnonzero(np.r_[True, (views[1:] != views[:-1]) | (starts[1:] != stops[:-1])])
        last = np.r_[first[1:] - 1, len(rows) - 1]
        spans = self._spans
        return [
            spans[view][start:stop]
            for view, start, stop in zip(
                views[first].tolist(), starts[first].tolist(), stops[last].tolist()
            )
        ]


def _byte_span(index: int, view: torch.Tensor) -> memoryview:
    """A writable byte memoryview from row 0's start to the last row's end (strides kept)."""
    if view.device.type != "cpu":
        raise ValueError(f"view {index} is on {view.device}; CpuBlockRows needs CPU memory")
    if view.dim() != 2 or (view.shape[1] > 1 and view.stride(1) != 1):
        raise ValueError(
            f"view {index} must be (num_blocks, page_words) with contiguous rows, "
            f"got shape {tuple(view.shape)} strides {view.stride()}"
        )
    if view.shape[0] > 1 and view.stride(0) < view.shape[1]:
        raise ValueError(f"view {index}'s rows overlap (strides {view.stride()})")
    words = (view.shape[0] - 1) * view.stride(0) + view.shape[1] if view.shape[0] else 0
    flat = torch.as_strided(view, (words,), (1,))
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]

"""``CpuBlockRows``: engine rows on the CPU, handed to the sockets in place (no copies)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class CpuBlockRows:
    """``BlockRows`` over CPU views shaped ``(num_blocks, page_words)`` (``KVLayout.views``).

    ``read_rows`` and ``write_rows`` return byte memoryviews straight on the views' memory, which
    stays owned by the engine; ``read_ahead``, ``commit`` and ``flush`` do nothing (the bytes are
    sent from, and land, in place).
    """

    def __init__(
        self, views: Sequence[torch.Tensor | np.ndarray], groups: Sequence[Sequence[int]]
    ) -> None:
        tensors = [torch.from_numpy(v) if isinstance(v, np.ndarray) else v for v in views]
        self.groups = tuple(tuple(int(i) for i in group) for group in groups)
        for g, group in enumerate(self.groups):
            if any(not 0 <= i < len(tensors) for i in group):
                raise ValueError(f"group {g} names views {group}; there are {len(tensors)}")
        spans = [_byte_span(i, t) for i, t in enumerate(tensors)]
        self.page_bytes = tuple(t.shape[1] * t.element_size() for t in tensors)
        self.num_blocks = tuple(int(t.shape[0]) for t in tensors)
        self._strides = tuple(t.stride(0) * t.element_size() for t in tensors)
        self._spans = spans  # (bytes from row 0 to the end of the last row,) per view

    def read_rows(self, rows: Sequence[tuple[int, int]]) -> list[memoryview]:
        return [self._row(view, block) for view, block in rows]

    def read_ahead(self, rows: Sequence[tuple[int, int]]) -> None:
        pass  # read in place when sent

    def write_rows(self, rows: Sequence[tuple[int, int]]) -> list[memoryview]:
        return [self._row(view, block) for view, block in rows]

    def commit(self, rows: Sequence[tuple[int, int]]) -> None:
        pass  # received in place

    def flush(self) -> None:
        pass

    def bind_thread(self) -> None:
        pass

    def _row(self, view: int, block: int) -> memoryview:
        if not 0 <= block < self.num_blocks[view]:
            raise ValueError(
                f"block {block} out of range for view {view} ({self.num_blocks[view]})"
            )
        start = block * self._strides[view]
        return self._spans[view][start : start + self.page_bytes[view]]


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

"""The engine's KV memory as rows of one size: what a single gather or scatter indexes.

    Spaces.of(views)          the storages behind ``views``, each as ``(rows, unit)`` words
    .unit                     bytes of a row: divides every page, view offset and block stride
    .rows_of(views, blocks)   (space, first row) of each page; a page is ``page // unit`` rows

Every view of a layout (``layout.py``: ``(num_blocks, page_words)``, one per layer and K/V) lies
in some storage; vLLM carves them all from one allocation, so a job's pages, whatever their
layers, K/V halves and blocks, are rows of one tensor: one ``index_select`` moves them all. A
layout whose views lie in several storages gets a space per storage, all with the same unit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

_WORDS = (torch.int64, torch.int32, torch.int16, torch.uint8)


@dataclass(frozen=True)
class Spaces:
    unit: int  # bytes per row
    tensors: tuple[torch.Tensor, ...]  # per storage: (rows, unit // word) in its word
    space: np.ndarray  # per view: the index of its storage's tensor
    first: np.ndarray  # per view: the row of block 0's page
    stride: np.ndarray  # per view: rows from one block's page to the next
    units: np.ndarray  # per view: rows per page

    @classmethod
    def of(cls, views: Sequence[torch.Tensor]) -> Spaces:
        storages: dict[int, torch.UntypedStorage] = {}
        placed = []  # per view: (storage pointer, byte offset, block stride, page bytes)
        for view in views:
            storage = view.untyped_storage()
            storages.setdefault(storage.data_ptr(), storage)
            item = view.element_size()
            offset = view.data_ptr() - storage.data_ptr()
            placed.append((storage.data_ptr(), offset, view.stride(0) * item, view.shape[1] * item))
        unit = math.gcd(*(n for _, offset, stride, page in placed for n in (offset, stride, page)))
        unit = unit or 1
        pointers = list(storages)
        word = next(w for w in _WORDS if not unit % _size(w)
                    and all(p % _size(w) == 0 for p in pointers))  # fmt: skip
        tensors = []
        for pointer in pointers:
            storage = storages[pointer]
            rows = storage.nbytes() // unit
            words = unit // _size(word)
            tensors.append(
                torch.tensor([], dtype=word, device=storage.device).set_(
                    storage, 0, (rows, words), (words, 1)
                )
            )
        index = {pointer: i for i, pointer in enumerate(pointers)}
        return cls(
            unit=unit,
            tensors=tuple(tensors),
            space=np.array([index[p] for p, _, _, _ in placed], dtype=np.int64),
            first=np.array([o // unit for _, o, _, _ in placed], dtype=np.int64),
            stride=np.array([s // unit for _, _, s, _ in placed], dtype=np.int64),
            units=np.array([page // unit for _, _, _, page in placed], dtype=np.int64),
        )

    def rows_of(self, views: np.ndarray, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per page ``(views[k], blocks[k])``: its space and its first row there."""
        return self.space[views], self.first[views] + blocks * self.stride[views]


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()

"""A staged record's pages into engine blocks on the CPU: one numpy assignment per engine storage,
not one per view.

    RecordScatter(layout, records)
    (record, group, first, block_ids)   the record's pages of sub-blocks ``first, first + 1, ...``
                                        into blocks ``block_ids`` (range-checked by the caller)

A record (``records.py``) holds its group's views one after the other, each its ``factor`` pages
back to back; in the engine every view is rows of one storage (``pages/spaces.py``: vLLM carves
every layer from one allocation). So a chunk's pages are rows of the record (consecutive for each
view) going to rows of the storage (a page's rows consecutive, pages scattered): one fancy
assignment moves them all, the GIL released for the copying. Moved view by view, a 4,096-token
load of 160 views (a 70B-class tensor-parallel rank) was 10,240 numpy calls.

A group's views are split into parts, one per storage and page size (one part for a vLLM CPU
engine; one per layer where each layer has a tensor of its own, as in the benches' engines),
with all that does not depend on the blocks worked out once: per call a part costs one index
sum and one assignment, and a whole chunk's rows, consecutive in the record for most layouts,
are assigned from the record itself, not from a gathered copy of it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvtier.layout import KVLayout
from kvtier.pages.spaces import Spaces
from kvtier.tiers.base.records import RecordLayout


class _Part(NamedTuple):
    """A group's views of one storage and one page size, as rows, shaped (views, 1, units) so
    that blocks broadcast along the middle axis: each view's block 0 page rows and its block
    stride in the storage, its sub-block 0 page rows in a record; and a whole chunk's record rows
    in the order they go (a slice where they are consecutive)."""

    space: int
    units: int
    engine: np.ndarray  # first[v] + row
    stride: np.ndarray
    record: np.ndarray  # within[v] + row
    whole: np.ndarray | slice


class RecordScatter:
    def __init__(self, layout: KVLayout, records: RecordLayout) -> None:
        spaces = Spaces.of(layout.views)
        self.unit = spaces.unit
        self.factor = records.factor
        self._engine = [t.numpy() for t in spaces.tensors]  # (rows, unit words) each
        self._word = self._engine[0].dtype
        self._groups: list[list[_Part]] = []
        for group, views in enumerate(records.groups):
            index = np.array(views, dtype=np.int64)
            within = np.array(records.offsets(group), dtype=np.int64) // self.unit
            space, units = spaces.space[index], spaces.units[index]
            parts = []
            for s, u in sorted(set(zip(space.tolist(), units.tolist(), strict=True))):
                mine = (space == s) & (units == u)
                parts.append(self._part(s, u, spaces, index[mine], within[mine]))
            self._groups.append(parts)

    def _part(
        self, space: int, units: int, spaces: Spaces, views: np.ndarray, within: np.ndarray
    ) -> _Part:
        row = np.arange(units, dtype=np.int64)[None, None, :]
        record = within[:, None, None] + row
        pages = np.arange(self.factor, dtype=np.int64)[None, :, None] * units
        rows = (record + pages).ravel()
        start, end = int(rows[0]), int(rows[0]) + rows.size
        whole = slice(start, end) if np.array_equal(rows, np.arange(start, end)) else rows
        engine = spaces.first[views][:, None, None] + row
        return _Part(space, units, engine, spaces.stride[views][:, None, None], record, whole)

    def __call__(self, record: np.ndarray, group: int, first: int, block_ids: np.ndarray) -> None:
        """``record``: the record's bytes (1-D uint8, from its start)."""
        blocks = np.asarray(block_ids, dtype=np.int64)[None, :, None]
        if not blocks.size:
            return
        rows = record[: record.size // self.unit * self.unit].view(self._word)
        rows = rows.reshape(-1, self.unit // self._word.itemsize)
        whole = first == 0 and blocks.size == self.factor
        pages = np.arange(first, first + blocks.size, dtype=np.int64)[None, :, None]
        for part in self._groups[group]:
            engine = (part.engine + blocks * part.stride).ravel()
            source = part.whole if whole else (part.record + pages * part.units).ravel()
            self._engine[part.space][engine] = rows[source]

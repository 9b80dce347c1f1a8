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
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvtier.layout import KVLayout
from kvtier.pages.spaces import Spaces
from kvtier.tiers.base.records import RecordLayout


class _Group(NamedTuple):
    """One group's views, as rows: per view its storage, its block 0's first row, its block
    stride, rows per page and where it starts in a record; and whether all of them are of one
    storage and one page size (a whole chunk's record rows are then in the order they go)."""

    space: np.ndarray
    first: np.ndarray
    stride: np.ndarray
    units: np.ndarray
    within: np.ndarray
    plain: bool


class RecordScatter:
    def __init__(self, layout: KVLayout, records: RecordLayout) -> None:
        spaces = Spaces.of(layout.views)
        self.unit = spaces.unit
        self.factor = records.factor
        self._engine = [t.numpy() for t in spaces.tensors]  # (rows, unit words) each
        self._word = self._engine[0].dtype
        self._groups = []
        for group, views in enumerate(records.groups):
            index = np.array(views, dtype=np.int64)
            space, units = spaces.space[index], spaces.units[index]
            plain = len(set(space.tolist())) == 1 and len(set(units.tolist())) == 1
            within = np.array(records.offsets(group), dtype=np.int64) // self.unit
            self._groups.append(_Group(space, spaces.first[index], spaces.stride[index], units,
                                       within, plain))  # fmt: skip

    def __call__(self, record: np.ndarray, group: int, first: int, block_ids: np.ndarray) -> None:
        """``record``: the record's bytes (1-D uint8, from its start)."""
        g = self._groups[group]
        blocks = np.asarray(block_ids, dtype=np.int64)
        if not len(g.space) or not len(blocks):
            return
        units = int(g.units.max())
        unit = np.arange(units, dtype=np.int64)
        # per view, per block, per row of a page: the engine's row, the record's row
        engine = g.first[:, None, None] + blocks[None, :, None] * g.stride[:, None, None] + unit
        rows = record[: record.size // self.unit * self.unit].view(self._word)
        rows = rows.reshape(-1, self.unit // self._word.itemsize)
        if g.plain and first == 0 and len(blocks) == self.factor:  # the record, rows in order
            self._engine[int(g.space[0])][engine.ravel()] = rows[: engine.size]
            return
        page = np.arange(first, first + len(blocks), dtype=np.int64)
        source = g.within[:, None, None] + page[None, :, None] * g.units[:, None, None] + unit
        keep = unit[None, None, :] < g.units[:, None, None]  # a page's rows, no further
        for s in np.unique(g.space).tolist():
            mine = np.broadcast_to(keep & (g.space == s)[:, None, None], engine.shape)
            self._engine[s][engine[mine]] = rows[source[mine]]

"""Grids through a staging area on the device: the ``dma`` mechanism without a page table.

    staged_batches(grids, page_bytes, stage_bytes, host_piece=0) -> [StagedBatch]

A batch stages some of a job's host records on the device, each page at the same place relative
to its record's start as in host memory. The grid kernel (``kernel.py``) moves the pages between
the engine and the staging area, each page's addresses computed on the device from the grid's
``V + K`` table entries (its blocks' record offsets made staging offsets: ``StagedBatch.grids``),
and the copy engine moves the bytes between the staging area and host memory: one copy per view
per run of a record's consecutive sub-blocks, joined where both sides continue one another, so a
whole chunk's record is one copy. Planning a job is ``O(K + V * R)`` for ``K`` blocks and ``R``
runs (about one a chunk: a 4,096-token job of 160 views is ~10,000 numbers), never per page.

A copy never crosses a multiple of ``host_piece`` bytes of host memory (``plan.cut``). Only the
pages of a grid are copied to host memory: the rest of a partial chunk's record is left as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from kvtier.pages.grid import PageGrid
from kvtier.pages.plan import cut, joined


class StagedBatch(NamedTuple):
    grids: list[PageGrid]  # a part of the job's grids each, ``at``: staging offsets
    copies: np.ndarray  # (n, 3) int64: host offset, staging offset, bytes
    nbytes: int  # the staging area it fills


def staged_batches(
    grids: Sequence[PageGrid], page_bytes: np.ndarray, stage_bytes: int, host_piece: int = 0
) -> list[StagedBatch]:
    """``grids`` in batches staging at most ``stage_bytes`` (at least one record each)."""
    parts: list[list[PageGrid]] = []
    nbytes: list[int] = []
    copies: list[np.ndarray] = []  # per grid: (n, 4), its copies and each one's batch
    for grid in grids:
        if not len(grid.blocks):
            continue
        order = np.lexsort((grid.sub, grid.at))
        at, sub, blocks = grid.at[order], grid.sub[order], grid.blocks[order]
        starts = np.flatnonzero(np.concatenate([[True], at[1:] != at[:-1], [True]]))
        page = page_bytes[grid.views]
        extent = int((grid.within + page * (int(sub.max()) + 1)).max())  # a record's bytes
        last = (len(parts) - 1, nbytes[-1]) if parts else (0, 0)
        batch, offset = _pack(len(starts) - 1, extent, *last, stage_bytes)
        while len(parts) <= batch[-1]:
            parts.append([])
            nbytes.append(0)
        record = np.repeat(np.arange(len(starts) - 1), np.diff(starts))  # each block's record
        staged = offset[record]
        edges = np.flatnonzero(np.diff(batch)) + 1  # records where a batch starts
        for b, (begin, end) in zip(batch[np.concatenate([[0], edges])].tolist(),
                                   _spans(starts, edges)):  # fmt: skip
            parts[b].append(PageGrid(grid.views, blocks[begin:end], staged[begin:end],
                                     sub[begin:end], grid.within))  # fmt: skip
            nbytes[b] = max(nbytes[b], int(staged[end - 1]) + extent)
        copies.append(_copies(grid, at, sub, staged, batch[record], page))
    if not parts:
        return []
    copied = joined(np.concatenate(copies))  # never across batches: the fourth column
    bounds = np.searchsorted(copied[:, 3], np.arange(len(parts) + 1))
    return [StagedBatch(part, cut(copied[lo:hi, :3], host_piece), n)
            for part, n, lo, hi in zip(parts, nbytes, bounds[:-1], bounds[1:])]  # fmt: skip


def _pack(
    count: int, extent: int, batch: int, used: int, stage_bytes: int
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` records of ``extent`` bytes packed after the ``used`` bytes of batch ``batch``,
    at most ``stage_bytes`` a batch but at least one record: each one's batch and staging
    offset."""
    per = max(1, stage_bytes // extent)
    here = max(0, (stage_bytes - used) // extent) if used else per  # what ``batch`` still holds
    place = np.arange(count, dtype=np.int64) - here  # from the first record past it
    later = place >= 0
    which = np.where(later, batch + 1 + place // per, batch)
    offset = np.where(later, place % per * extent, used + (place + here) * extent)
    return which, offset


def _spans(starts: np.ndarray, edges: np.ndarray) -> list[tuple[int, int]]:
    """Blocks (``starts``: each record's first, then the count) of each run of records that
    ``edges`` (records) cuts."""
    cuts = starts[np.concatenate([[0], edges, [len(starts) - 1]])].tolist()
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def _copies(
    grid: PageGrid, at: np.ndarray, sub: np.ndarray, staged: np.ndarray, batch: np.ndarray,
    page: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """A copy per view per run of a record's consecutive sub-blocks (blocks in record order):
    ``(host offset, staging offset, bytes, batch)`` rows, views in their place in a record."""
    breaks = (at[1:] != at[:-1]) | (sub[1:] != sub[:-1] + 1)
    run = np.flatnonzero(np.concatenate([[True], breaks]))
    length = np.diff(np.append(run, len(at)))
    order = np.argsort(grid.within, kind="stable")
    within, page = grid.within[order], page[order]
    offset = within[None, :] + sub[run][:, None] * page[None, :]  # (runs, views)
    views = len(within)
    return np.stack([(at[run][:, None] + offset).ravel(), (staged[run][:, None] + offset).ravel(),
                     (length[:, None] * page[None, :]).ravel(), np.repeat(batch[run], views)],
                    axis=1)  # fmt: skip

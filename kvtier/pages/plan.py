"""A job's pages as batches of one gather (or scatter) and a few large host copies.

    Pages(views, blocks, host)                the pages to move: engine page ``(views[k],
                                              blocks[k])`` <-> host bytes at ``host[k]``
    plan_batches(pages, spaces, page_bytes, stage_bytes, host_piece=0) -> [Batch]
    iter_batches(...)                         the same, each planned as it is asked for

A batch's pages are staged in the order of their host offsets, packed, so that pages adjacent in
host memory (a chunk's record: every view of it, ``tiers/host/records.py``) are adjacent in the
staging area too, and one copy moves each run of them: a host-tier store of whole chunks in
consecutive slots is one device -> host copy, of scattered slots one copy per chunk. On the
device side a batch is one gather (a store) or scatter (a load) per engine storage, over rows of
``spaces.unit`` bytes (``spaces.py``): one for a vLLM engine, whatever its layers and groups.

A host copy never crosses a multiple of ``host_piece`` bytes (0: no such limit). The host tier is
pinned piece by piece (``tiers/host/pinning.py``), and CUDA refuses a copy whose host bytes span
two registrations, or a registered and an unregistered range ("invalid argument"): a run of
records over a piece's end is two copies.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from kvtier.pages.spaces import Spaces


class Pages(NamedTuple):
    views: np.ndarray  # int64, per page: its view
    blocks: np.ndarray  # int64, per page: its engine block
    host: np.ndarray  # int64, per page: its byte offset in the host memory

    @staticmethod
    def join(parts: Sequence[Pages]) -> Pages:
        if not parts:
            empty = np.empty(0, dtype=np.int64)
            return Pages(empty, empty, empty)
        return Pages(*(np.concatenate(column) for column in zip(*parts, strict=True)))


class Gather(NamedTuple):
    """The rows of one space a batch moves: ``rows[k]`` <-> staging row ``staged[k]`` (None:
    staging rows ``0..len(rows)``, in order)."""

    space: int
    rows: np.ndarray
    staged: np.ndarray | None


class Batch(NamedTuple):
    """Pages staged together: ``gathers`` on the device, then ``copies`` with host memory, each
    ``(host offset, staging offset, bytes)``; ``nbytes``: the staging area it fills."""

    gathers: list[Gather]
    copies: np.ndarray  # (n, 3) int64
    nbytes: int


def plan_batches(
    pages: Pages, spaces: Spaces, page_bytes: np.ndarray, stage_bytes: int, host_piece: int = 0
) -> list[Batch]:
    """``pages`` in batches staging at most ``stage_bytes`` (at least one page each), no host
    copy over a multiple of ``host_piece`` (0: none)."""
    return list(iter_batches(pages, spaces, page_bytes, stage_bytes, host_piece))


def iter_batches(
    pages: Pages, spaces: Spaces, page_bytes: np.ndarray, stage_bytes: int, host_piece: int = 0
) -> Iterator[Batch]:
    """``plan_batches``, each batch planned as it is asked for: a GPU copies the first while
    the next are planned."""
    if not len(pages.views):
        return
    order = np.argsort(pages.host, kind="stable")
    views, blocks, host = pages.views[order], pages.blocks[order], pages.host[order]
    sizes = page_bytes[views]
    ends = np.cumsum(sizes)
    start = 0
    while start < len(views):
        base = ends[start] - sizes[start]  # staging bytes before this batch
        stop = int(np.searchsorted(ends, base + stage_bytes, side="right"))
        stop = max(stop, start + 1)
        part = slice(start, stop)
        batch = _batch(views[part], blocks[part], host[part], sizes[part], spaces)
        yield batch._replace(copies=cut(batch.copies, host_piece))
        start = stop


def _batch(
    views: np.ndarray, blocks: np.ndarray, host: np.ndarray, sizes: np.ndarray, spaces: Spaces
) -> Batch:
    staged = np.cumsum(sizes) - sizes  # each page's offset in the staging area
    joined = np.flatnonzero(host[1:] != host[:-1] + sizes[:-1]) + 1  # where a copy starts
    starts = np.concatenate([[0], joined])
    stops = np.concatenate([joined, [len(host)]])
    copies = np.stack(
        [host[starts], staged[starts], staged[stops - 1] + sizes[stops - 1] - staged[starts]],
        axis=1,
    )
    space, first = spaces.rows_of(views, blocks)
    units = spaces.units[views]
    rows = _expand(first, units)
    gathers = []
    if (space == space[0]).all():
        gathers.append(Gather(int(space[0]), rows, None))
    else:
        staged_rows = _expand(staged // spaces.unit, units)
        page_space = np.repeat(space, units)
        for s in np.unique(space).tolist():
            mine = page_space == s
            gathers.append(Gather(s, rows[mine], staged_rows[mine]))
    return Batch(gathers, copies.astype(np.int64), int(sizes.sum()))


def cut(copies: np.ndarray, piece: int) -> np.ndarray:
    """``copies`` (``(host offset, staging offset, bytes)`` rows) cut where their host bytes cross
    a multiple of ``piece`` (0: as they are)."""
    if not piece or not len(copies):
        return copies
    at, staged, size = copies.T
    first, last = at // piece, (at + size - 1) // piece
    count = last - first + 1
    if (count == 1).all():
        return copies
    which = np.repeat(np.arange(len(at)), count)  # each part's copy
    part = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    begin = np.maximum(at[which], (first[which] + part) * piece)
    end = np.minimum(at[which] + size[which], (first[which] + part + 1) * piece)
    parts = np.stack([begin, staged[which] + begin - at[which], end - begin], axis=1)
    return parts.astype(np.int64)


def joined(copies: np.ndarray) -> np.ndarray:
    """Rows ``(first, second, bytes, *rest)`` ``i`` and ``i + 1`` of ``copies`` made one where
    both sides continue one another and the rest is the same."""
    if len(copies) < 2:
        return copies
    ahead, behind = copies[1:], copies[:-1]
    follows = (
        (ahead[:, 0] == behind[:, 0] + behind[:, 2])
        & (ahead[:, 1] == behind[:, 1] + behind[:, 2])
        & (ahead[:, 3:] == behind[:, 3:]).all(axis=1)
    )
    starts = np.flatnonzero(np.concatenate([[True], ~follows]))
    out = copies[starts]
    out[:, 2] = np.add.reduceat(copies[:, 2], starts)
    return out


def _expand(first: np.ndarray, units: np.ndarray) -> np.ndarray:
    """``first[k], first[k] + 1, ..., first[k] + units[k] - 1`` for each k, in order."""
    if (units == 1).all():
        return np.asarray(first, dtype=np.int64)
    total = int(units.sum())
    starts = np.repeat(np.cumsum(units) - units, units)
    expanded: np.ndarray = np.repeat(first, units) + (np.arange(total, dtype=np.int64) - starts)
    return expanded

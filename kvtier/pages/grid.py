"""A job's pages as a grid: every view of a group times the engine blocks it moves.

    PageGrid(views, blocks, at, sub, within)   page ``(v, k)``: engine page ``(views[v],
                                               blocks[k])`` <-> the host bytes at ``at[k] +
                                               within[v] + sub[k] * page_bytes[views[v]]``
    .pages(page_bytes) -> Pages                the same pages, one entry each (``plan.py``)
    record_grid(views, within, blocks, rows, factor, record_bytes) -> PageGrid
                                               blocks <-> page rows of memory holding a record
                                               a slot (host memory, a tier's staging area)
    view_table(views) -> (3, V) array          the engine's side of every view, made once
    tables(grids, view_table, host, word=WORD) -> Tables | None
                                               what the grid kernel reads (``kernel.py``)
    addresses(per_view, per_block, host) -> (src, dst, size)
                                               the copies those tables say, engine -> host

A host record holds a chunk's views one after the other, each its ``factor`` pages back to back
(``tiers/base/records.py``), so a job of ``K`` blocks over ``V`` views is ``V + K`` numbers, not
``V * K`` pages: the grid kernel computes each page's addresses on the device, and the engine's
thread builds and uploads ``O(K)`` values per job instead of planning ``V * K`` pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from kvtier.pages.plan import Pages

WORD = 8  # the grid kernel moves 8-byte words: every address and size must be a multiple


class PageGrid(NamedTuple):
    views: np.ndarray  # (V,) int64: the group's views
    blocks: np.ndarray  # (K,) int64: engine block ids
    at: np.ndarray  # (K,) int64: host byte offset of block k's record (slot * record bytes)
    sub: np.ndarray  # (K,) int64: block k's sub-block in its record
    within: np.ndarray  # (V,) int64: where view v's pages start in a record

    def pages(self, page_bytes: np.ndarray) -> Pages:
        """One entry per page, views outer, blocks inner."""
        page = page_bytes[self.views]
        host = self.within[:, None] + page[:, None] * self.sub[None, :] + self.at[None, :]
        blocks = len(self.blocks)
        return Pages(np.repeat(self.views, blocks), np.tile(self.blocks, len(self.views)),
                     host.ravel())  # fmt: skip


def record_grid(
    views: Sequence[int],
    within: Sequence[int],
    blocks: np.ndarray,
    rows: np.ndarray,
    factor: int,
    record_bytes: int,
) -> PageGrid:
    """Engine blocks ``blocks`` <-> page rows ``rows`` (slot * ``factor`` + sub-block) of memory
    holding one record of ``record_bytes`` per slot, whose views ``views`` start at ``within``
    in a record (``tiers/base/records.py``)."""
    slots, subs = np.divmod(np.asarray(rows, dtype=np.int64), factor)
    return PageGrid(np.array(views, dtype=np.int64), np.asarray(blocks, dtype=np.int64),
                    slots * record_bytes, subs, np.array(within, dtype=np.int64))  # fmt: skip


class Tables(NamedTuple):
    """The grid kernel's input for a job: one int64 array holding, per grid, its ``(4, V)``
    per-view table (engine address of block 0's page, block stride, page bytes, offset in a
    record) then its ``(3, K)`` per-block table (engine block, record offset, sub-block), each
    started on a 16-byte boundary (the kernel is compiled for aligned tables only)."""

    flat: np.ndarray
    grids: list[tuple[int, int, int, int]]  # per grid: (per-view at, V, per-block at, K)

    def of(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Grid ``index``'s (per view, per block) tables."""
        view_at, v, block_at, k = self.grids[index]
        per_view = self.flat[view_at : view_at + 4 * v].reshape(4, v)
        return per_view, self.flat[block_at : block_at + 3 * k].reshape(3, k)


def view_table(views: Sequence[torch.Tensor]) -> np.ndarray:
    """``(3, views)`` int64: each view's engine address of block 0's page, block stride and
    page bytes (fixed for an engine: made once, ``tables`` picks a grid's columns)."""
    return np.array([[v.data_ptr() for v in views],
                     [v.stride(0) * v.element_size() for v in views],
                     [v.shape[1] * v.element_size() for v in views]], dtype=np.int64)  # fmt: skip


def tables(
    grids: Sequence[PageGrid], engine: np.ndarray, host: int, word: int = WORD
) -> Tables | None:
    """The grid kernel's tables for ``grids`` over the engine's ``view_table`` and host memory
    at address ``host``; None where an address or size is not a multiple of ``word`` (a
    multiple of ``WORD``: the launch's, ``kernel.Launch.word``)."""
    parts: list[np.ndarray] = []
    spans = []
    at = 0
    for grid in grids:
        per_view = np.concatenate([engine[:, grid.views], grid.within[None, :]]).ravel()
        per_block = np.concatenate([grid.blocks, grid.at, grid.sub]).astype(np.int64)
        view_at = at
        block_at = view_at + _padded(len(per_view))
        at = block_at + _padded(len(per_block))
        parts += [per_view, np.zeros(block_at - view_at - len(per_view), np.int64),
                  per_block, np.zeros(at - block_at - len(per_block), np.int64)]  # fmt: skip
        spans.append((view_at, len(grid.views), block_at, len(grid.blocks)))
    flat = np.concatenate(parts) if parts else np.empty(0, np.int64)
    checked = [flat[a : a + 4 * v] for a, v, _, _ in spans]
    checked += [flat[b + k : b + 2 * k] for _, _, b, k in spans]  # record offsets
    combined = int(np.bitwise_or.reduce(np.concatenate([*checked, np.array([host])])))
    return None if combined % word else Tables(flat, spans)


def _padded(n: int) -> int:
    return -(-n // 2) * 2  # int64 entries to a 16-byte boundary


def addresses(
    per_view: np.ndarray, per_block: np.ndarray, host: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the kernel copies for one grid's tables: (engine, host, bytes) per page, views
    outer. The kernel computes the same on the device; this is its reference."""
    base, stride, page, within = per_view
    block, at, sub = per_block
    engine = base[:, None] + block[None, :] * stride[:, None]
    hosted = host + at[None, :] + within[:, None] + sub[None, :] * page[:, None]
    size = np.broadcast_to(page[:, None], engine.shape)
    return engine.ravel(), hosted.ravel(), size.ravel()

"""What both ends of a prefill->decode transfer share: errors, identities, rows and their order.

TransferError                 every failure of a pull, with what failed in its message
PeerIdentity                  the fields that must match between the two ranks
Rows                          rows ``(view, block)`` as an ``(n, 2)`` int64 array
BlockRows                     one rank's engine KV memory as (view, block) byte rows
request_rows(groups, ids)     the canonical row order of a request, the same at both ends
row_sizes(page_bytes, rows)   bytes of each of those rows; ``row_bytes``: of all of them
slices(rows, page_bytes)      rows in slices of at most ``SLICE_BYTES``, moved one at a time

Rows are arrays, not lists of pairs: a 4,096-token request of a 70B model's tensor-parallel rank
is 40,960 rows (160 views of 256 blocks), and every step here is a few numpy calls per group or
per slice, never Python per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

SLICE_BYTES = 16 << 20  # rows read or written at once (CUDA: staged in pinned memory)

Rows = npt.NDArray[np.int64]  # (n, 2): a row's view, then its block


class TransferError(Exception):
    """A pull failed; ``str(e)`` names the peer and what failed (refused, reset, timeout, ...)."""


@dataclass(frozen=True)
class PeerIdentity:
    """What must match between the two ranks of a transfer (model, dtype, layout, tp, blocks)."""

    fields: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        names = [name for name, _ in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"PeerIdentity: a field is named twice in {names}")

    def differences(self, other: PeerIdentity) -> list[str]:
        """``["model 'a' != 'b'", ...]``: this side's value first; empty when equal."""
        mine, theirs = dict(self.fields), dict(other.fields)
        names = [n for n, _ in self.fields] + [n for n, _ in other.fields if n not in mine]
        return [
            f"{name} {_shown(mine.get(name))} != {_shown(theirs.get(name))}"
            for name in names
            if mine.get(name) != theirs.get(name)
        ]


def _shown(value: str | None) -> str:
    return "(missing)" if value is None else repr(value)


class BlockRows(Protocol):
    """One rank's engine KV memory, addressed as rows ``(view, block)`` of ``page_bytes[view]``.

    Rows are handed out as byte views whose bytes, in order, are the rows' (a view per row, or
    fewer where rows lie back to back). Sending, a slice at a time on one thread: ``read_rows``
    returns byte views to send, valid until the thread's next ``read_rows``; ``read_ahead(rows)``
    says that the thread's next ``read_rows`` asks for ``rows`` (a staged implementation reads
    them while the last slice is sent). Receiving, a slice at a time on one thread:
    ``write_rows`` returns writable byte views to receive into; ``commit`` of the same rows makes
    what was received part of the engine's memory, done by the time the thread's ``flush``
    returns (a staged implementation moves it while the next slice arrives). A pull commits its
    slices before its checksum is verified: a failed pull leaves its blocks' contents undefined,
    and the engine computes them again.
    ``bind_thread`` is called once at the start of every transfer thread (a CUDA implementation
    binds its captured device there). ``wait_for(ready)``: the thread's later commits wait for
    ``ready``, an event on the engine's stream recorded when the pull was asked for (work queued
    before it may still read or write the blocks); on the CPU that work is done already.
    """

    page_bytes: tuple[int, ...]  # bytes of one block's row in each view
    groups: tuple[tuple[int, ...], ...]  # view indices per KV cache group

    def read_rows(self, rows: Rows) -> list[memoryview]: ...

    def read_ahead(self, rows: Rows) -> None: ...

    def write_rows(self, rows: Rows) -> list[memoryview]: ...

    def commit(self, rows: Rows) -> None: ...

    def flush(self) -> None: ...

    def bind_thread(self) -> None: ...

    def wait_for(self, ready: torch.cuda.Event) -> None: ...


def request_rows(groups: tuple[tuple[int, ...], ...], block_ids: Sequence[Sequence[int]]) -> Rows:
    """The rows of a request in the order both ends use: per group, per view, per block."""
    if len(block_ids) != len(groups):
        raise ValueError(f"{len(block_ids)} lists of block ids for {len(groups)} groups")
    parts = [np.empty((0, 2), dtype=np.int64)]
    for views, ids in zip(groups, block_ids):
        view = np.asarray(views, dtype=np.int64)
        block = np.asarray(ids, dtype=np.int64).reshape(-1)
        parts.append(np.stack((np.repeat(view, len(block)), np.tile(block, len(view))), axis=1))
    return np.concatenate(parts)


def row_sizes(page_bytes: Sequence[int], rows: Rows) -> npt.NDArray[np.int64]:
    """Bytes of each row."""
    return np.asarray(page_bytes, dtype=np.int64)[rows[:, 0]]


def row_bytes(page_bytes: Sequence[int], rows: Rows) -> int:
    return int(row_sizes(page_bytes, rows).sum())


def slices(rows: Rows, page_bytes: Sequence[int], limit: int = SLICE_BYTES) -> list[Rows]:
    """``rows`` in order, in consecutive slices of at most ``limit`` bytes (a row larger than
    that alone); none when there are no rows."""
    ends = np.cumsum(row_sizes(page_bytes, rows))
    out: list[Rows] = []
    start = 0
    while start < len(rows):
        before = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, before + limit, side="right")))
        out.append(rows[start:stop])
        start = stop
    return out

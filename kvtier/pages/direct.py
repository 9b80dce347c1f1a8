"""Pages moved straight between CPU engine memory and host memory, in pieces for copy lanes.

    direct_pieces(batch, spaces, host, store, piece_bytes) -> [piece]   callables, any order

With the engine on the CPU there is nothing to stage: host memory plays the staging area's part.
A batch's rows (``plan.py``) are cut where the host bytes stop being adjacent or the engine
storage changes; each such segment is one numpy call over rows of the engine's storage:
``np.take`` of the segment's rows straight into its host bytes (a store), or a fancy assignment
from them (a load). numpy copies a row at a time inside the call, the GIL released, so a 64 MiB
job of 64 KiB pages in 64 chunks costs a few dozen calls, not a call (and a GIL round trip) per
page; no temporary is made. Long segments are cut so that every lane gets a share.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from kvtier.pages.plan import Batch
from kvtier.pages.spaces import Spaces

Piece = Callable[[], None]


def direct_pieces(
    batch: Batch, spaces: Spaces, host: torch.Tensor, store: bool, piece_bytes: int
) -> list[Piece]:
    """The copies of ``batch`` between the engine and ``host`` (1-D bytes) as pieces of about
    ``piece_bytes``: engine -> host when ``store``."""
    unit = spaces.unit
    tensors = [t.numpy() for t in spaces.tensors]  # (rows, words) each
    word = tensors[0].dtype
    usable = host.numel() // unit * unit
    host_rows = host[:usable].numpy().view(word).reshape(-1, unit // word.itemsize)
    space, engine_rows, at = _rows(batch, unit)
    # a segment: consecutive staging rows of one space whose host rows follow one another
    cut = (space[1:] != space[:-1]) | (at[1:] != at[:-1] + 1)
    edges = np.concatenate([[0], np.flatnonzero(cut) + 1, [len(at)]]).tolist()
    step = max(1, piece_bytes // unit)  # rows per piece
    pieces: list[list[_Segment]] = [[]]
    room = step
    for first, last in zip(edges[:-1], edges[1:]):
        engine = tensors[int(space[first])]
        start = first
        while start < last:
            if not room:
                pieces.append([])
                room = step
            stop = min(last, start + room)
            rows = host_rows[at[start] : at[start] + stop - start]
            pieces[-1].append((engine, rows, engine_rows[start:stop]))
            room -= stop - start
            start = stop
    return [partial(_run, piece, store) for piece in pieces if piece]


_Segment = tuple[np.ndarray, np.ndarray, np.ndarray]  # engine, host rows, engine row ids


def _run(segments: list[_Segment], store: bool) -> None:
    """Each segment's engine rows <-> its consecutive host rows, one numpy call each (the GIL
    released inside)."""
    for engine, host, rows in segments:
        if store:
            np.take(engine, rows, axis=0, out=host, mode="clip")  # rows were range-checked
        else:
            engine[rows] = host


def _rows(batch: Batch, unit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per staging row of ``batch``: its engine space, its row there, and its host row."""
    total = batch.nbytes // unit
    space = np.empty(total, dtype=np.int64)
    engine = np.empty(total, dtype=np.int64)
    for gather in batch.gathers:
        where = slice(None) if gather.staged is None else gather.staged
        space[where] = gather.space
        engine[where] = gather.rows
    copies = batch.copies // unit  # (host row, staging row, rows)
    host = np.repeat(copies[:, 0] - copies[:, 1], copies[:, 2]) + np.arange(total)
    return space, engine, host

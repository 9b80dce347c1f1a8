"""A job as segments of consecutive host rows: cut into byte-bounded batches, every block once;
CUDA staging offsets (pure arithmetic, checked without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.worker.copy_cuda import stage_batches
from kvtier.worker.segments import Segment, split_segments

PAGE_BYTES = [100, 60]
SEGMENTS = [
    Segment(0, 10, np.arange(7)),
    Segment(1, 0, np.array([40, 3, 9])),
    Segment(0, 30, np.array([11])),
]


def _moved(batches: list[list[Segment]]) -> list[tuple[int, int, int]]:
    """(view, host row, engine block) of every block, in order."""
    return [
        (s.view, s.first + i, int(block)) for batch in batches for s in batch
        for i, block in enumerate(s.ids)
    ]  # fmt: skip


@pytest.mark.parametrize("batch_bytes", [1, 100, 250, 1000, 10**6])
def test_split_segments_places_every_block_once_within_the_bound(batch_bytes: int) -> None:
    batches = split_segments(SEGMENTS, PAGE_BYTES, batch_bytes)
    assert _moved(batches) == _moved([SEGMENTS])
    for batch in batches:
        size = sum(len(s.ids) * PAGE_BYTES[s.view] for s in batch)
        assert size <= batch_bytes or sum(len(s.ids) for s in batch) == 1


def test_split_segments_fills_each_batch_before_the_next() -> None:
    batches = split_segments(SEGMENTS, PAGE_BYTES, 250)  # two 100-byte pages, then the rest
    assert [[(s.view, s.first, s.ids.tolist()) for s in b] for b in batches] == [
        [(0, 10, [0, 1])],
        [(0, 12, [2, 3])],
        [(0, 14, [4, 5])],
        [(0, 16, [6]), (1, 0, [40, 3])],
        [(1, 2, [9]), (0, 30, [11])],
    ]


def test_stage_batches_lay_segments_back_to_back() -> None:
    (batch,) = stage_batches(SEGMENTS, PAGE_BYTES, 10**6)
    assert batch.offsets == [0, 700, 880]
    assert batch.nbytes == 980
    assert batch.ids.tolist() == [0, 1, 2, 3, 4, 5, 6, 40, 3, 9, 11]
    assert batch.staged(direct_min_bytes=400)  # 3 segments averaging 327 bytes: one transfer
    assert not batch.staged(direct_min_bytes=300)  # large enough to copy one by one
    (single,) = stage_batches(SEGMENTS[:1], PAGE_BYTES, 10**6)
    assert not single.staged(direct_min_bytes=10**9)  # one segment is one transfer anyway


def test_stage_batches_bound_the_staging_area() -> None:
    batches = stage_batches(SEGMENTS, PAGE_BYTES, 250)
    assert [b.nbytes for b in batches] == [200, 200, 200, 220, 160]
    assert _moved([b.segments for b in batches]) == _moved([SEGMENTS])

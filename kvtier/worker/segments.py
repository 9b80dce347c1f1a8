"""A planned job as segments of consecutive host rows, and byte-bounded batches of them.

    job_segments(plan, layout, factor) -> list[Segment]   every (view, run) of a job, in order
    split_segments(segments, page_bytes, batch_bytes)     cut into batches of about batch_bytes
    segment_bytes(segments, page_bytes) -> int            bytes the segments move

A segment is the unit one copy call moves: engine blocks ``ids`` of one view, to or from host page
rows ``first : first + len(ids)`` of that view. CPU copies hand batches to copy lanes; CUDA copies
stage a batch through one contiguous device area.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from kvtier.layout import KVLayout
from kvtier.worker.plan import GroupCopy


class Segment(NamedTuple):
    """Engine blocks ``ids`` of view ``view`` <-> host page rows ``first : first + len(ids)``."""

    view: int
    first: int
    ids: np.ndarray  # int64 engine block ids


def job_segments(plan: Sequence[GroupCopy], layout: KVLayout) -> list[Segment]:
    """One segment per (group view, run of consecutive host rows) of ``plan``, in plan order."""
    return [
        Segment(view, int(copy.host_rows[start]), copy.block_ids[start:end])
        for copy in plan
        for view in layout.groups[copy.group]
        for start, end in copy.runs
    ]


def segment_bytes(segments: Sequence[Segment], page_bytes: Sequence[int]) -> int:
    return sum(len(segment.ids) * page_bytes[segment.view] for segment in segments)


def split_segments(
    segments: Sequence[Segment], page_bytes: Sequence[int], batch_bytes: int
) -> list[list[Segment]]:
    """Cut ``segments`` into batches of at most ``batch_bytes`` (at least one block each), in
    order; a segment may be split between batches, and every block lands in exactly one."""
    batches: list[list[Segment]] = [[]]
    room = batch_bytes
    for view, first, ids in segments:
        page, start = page_bytes[view], 0
        while start < len(ids):
            take = min(len(ids) - start, max(room, 0) // page)
            if take == 0:
                if batches[-1]:  # full: start the next batch
                    batches.append([])
                    room = batch_bytes
                    continue
                take = 1  # a page larger than a batch goes alone
            batches[-1].append(Segment(view, first + start, ids[start : start + take]))
            room -= take * page
            start += take
    return [batch for batch in batches if batch]

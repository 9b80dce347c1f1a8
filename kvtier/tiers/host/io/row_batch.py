"""Many small jobs of one step copied as one: the plan, made with Python ints.

    plan_rows(engine, host, factor, groups) -> [(group, ids, rows)]   ``plan_copy``'s mapping
    RowBatch.of(planned, groups) -> RowBatch      the jobs' ids and rows joined, group by group
    RowBatch.within(num_blocks, num_rows) -> bool every id and row in range
    RowBatch.of_plan(plan, groups) -> RowBatch    one job's ``plan_copy`` as a batch

At high concurrency a step stores hundreds of one-chunk jobs (a chunk and a prompt's tail per
request). Planned one by one with numpy (``plan.py``), each costs tens of microseconds of small-
array overhead and a copy call per run of host rows; here a job of a few blocks is planned with
Python ints, and the whole step copies as one (``pages.descriptors``: a ``memmove`` per run of
pages adjacent in both the engine and a host record).
The mapping is ``plan_copy``'s (see ``plan.py``), and so are its refusals: a job it would refuse
is refused here alone, with the same message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from kvtier.addresses import EngineBlocks, HostChunks
from kvtier.tiers.base.chunk_plan import GroupCopy, check_groups, checked_spans


def plan_rows(
    engine: EngineBlocks, host: HostChunks, factor: int, num_groups: int
) -> list[tuple[int, list[int], list[int]]]:
    """Per group with blocks: (group, engine block ids, host page rows), as ``plan_copy`` maps
    them; ``ValueError`` where it would refuse the job (ids and slots are range-checked by the
    caller)."""
    sizes = engine.group_sizes
    if len(sizes) == 1 == len(engine.block_indices) and num_groups:  # one group: most jobs
        n, skip = sizes[0], engine.block_indices[0] % factor
        ids, slots = engine.block_ids.tolist(), host.slots.tolist()
        if n and len(ids) == n and len(slots) == (n + skip + factor - 1) // factor:
            rows = [slots[(skip + k) // factor] * factor + (skip + k) % factor for k in range(n)]
            return [(0, ids, rows)]
    check_groups(engine, num_groups)
    spans = checked_spans(engine, len(host.slots), factor)
    sizes, starts = engine.group_sizes, engine.block_indices
    ids, slots = engine.block_ids.tolist(), host.slots.tolist()
    planned = []
    block_at = slot_at = 0
    for group, (n, start, span) in enumerate(zip(sizes, starts, spans, strict=True)):
        if n:
            skip = start % factor
            rows = [
                slots[slot_at + (skip + k) // factor] * factor + (skip + k) % factor
                for k in range(n)
            ]
            planned.append((group, ids[block_at : block_at + n], rows))
        block_at += n
        slot_at += span
    return planned


class RowBatch(NamedTuple):
    """Engine block ids and host page rows of many jobs, per group (equal lengths)."""

    ids: list[np.ndarray]  # per group, int64
    rows: list[np.ndarray]  # per group, int64

    @staticmethod
    def of(planned: Sequence[list[tuple[int, list[int], list[int]]]], num_groups: int) -> RowBatch:
        """The jobs' plans (``plan_rows``) joined, group by group."""
        ids: list[list[int]] = [[] for _ in range(num_groups)]
        rows: list[list[int]] = [[] for _ in range(num_groups)]
        for job in planned:
            for group, job_ids, job_rows in job:
                ids[group] += job_ids
                rows[group] += job_rows
        return RowBatch(
            [np.array(i, dtype=np.int64) for i in ids], [np.array(r, dtype=np.int64) for r in rows]
        )

    def within(self, num_blocks: int, num_rows: int) -> bool:
        """Whether every id lies in ``[0, num_blocks)`` and every row in ``[0, num_rows)``."""
        return all(
            _within(ids, num_blocks) and _within(rows, num_rows)
            for ids, rows in zip(self.ids, self.rows, strict=True)
        )

    @staticmethod
    def of_plan(plan: Sequence[GroupCopy], num_groups: int) -> RowBatch:
        """One job's ``plan_copy`` as a batch."""
        ids = [np.empty(0, dtype=np.int64) for _ in range(num_groups)]
        rows = [np.empty(0, dtype=np.int64) for _ in range(num_groups)]
        for copy in plan:
            ids[copy.group] = np.concatenate([ids[copy.group], copy.block_ids])
            rows[copy.group] = np.concatenate([rows[copy.group], copy.host_rows])
        return RowBatch(ids, rows)


def _within(values: np.ndarray, limit: int) -> bool:
    return not len(values) or (int(values.min()) >= 0 and int(values.max()) < limit)

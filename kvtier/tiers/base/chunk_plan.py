"""Which engine block goes to which host page row: the chunk arithmetic of DESIGN §4.

A chunk is ``factor`` consecutive engine blocks of one group. Group ``g``'s transfer starts at
logical block ``block_indices[g]``, so its first chunk is entered
``skip = block_indices[g] % factor`` blocks in; ``n`` blocks then span
``ceil((n + skip) / factor)`` chunks, and engine block ``k`` lands in sub-block
``(skip + k) % factor`` of chunk ``(skip + k) // factor``. Every block and every slot is consumed
exactly, or the plan is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from kvtier.addresses import EngineBlocks, HostChunks


class GroupCopy(NamedTuple):
    """The blocks of one group in a transfer and the host page rows they map to."""

    group: int
    block_ids: np.ndarray  # int64 engine block ids, (n,)
    host_rows: np.ndarray  # int64 host page rows (slot * factor + sub-block), (n,)


def chunks_spanned(num_blocks: int, block_index: int, factor: int) -> int:
    """How many chunks ``num_blocks`` blocks starting at logical block ``block_index`` touch."""
    if num_blocks == 0:
        return 0
    return -(-(num_blocks + block_index % factor) // factor)


def plan_copy(engine: EngineBlocks, host: HostChunks, factor: int) -> list[GroupCopy]:
    """Map every engine block of ``engine`` onto a host page row of ``host`` (raises ValueError)."""
    sizes, starts = engine.group_sizes, engine.block_indices
    spans = checked_spans(engine, len(host.slots), factor)
    copies = []
    block_at = slot_at = 0
    for group, (n, start, span) in enumerate(zip(sizes, starts, spans)):
        if n:
            position = start % factor + np.arange(n, dtype=np.int64)
            slots = np.asarray(host.slots[slot_at : slot_at + span], dtype=np.int64)
            rows = slots[position // factor] * factor + position % factor
            ids = np.asarray(engine.block_ids[block_at : block_at + n], dtype=np.int64)
            copies.append(GroupCopy(group, ids, rows))
        block_at += n
        slot_at += span
    return copies


def join_by_group(copies: Iterable[GroupCopy]) -> list[GroupCopy]:
    """``copies`` joined into one per group (its blocks and rows in order), groups in the order
    they first come: a job of many parts, or of many chunks, is one grid per group."""
    by_group: dict[int, list[GroupCopy]] = {}
    for copy in copies:
        by_group.setdefault(copy.group, []).append(copy)
    return [
        GroupCopy(
            group,
            np.concatenate([c.block_ids for c in parts]),
            np.concatenate([c.host_rows for c in parts]),
        )  # fmt: skip
        for group, parts in by_group.items()
    ]


def check_groups(engine: EngineBlocks, num_groups: int) -> None:
    """``ValueError`` when the transfer names more groups than the layout has."""
    if len(engine.group_sizes) > num_groups:
        raise ValueError(
            f"{len(engine.group_sizes)} groups in a transfer, the layout has {num_groups}"
        )


def checked_spans(engine: EngineBlocks, num_slots: int, factor: int) -> list[int]:
    """The chunks each group of ``engine`` spans; ``ValueError`` when its sizes, indices, blocks
    and ``num_slots`` host slots do not add up."""
    sizes, starts = engine.group_sizes, engine.block_indices
    if len(sizes) != len(starts):
        raise ValueError(
            f"kvtier: {len(sizes)} group sizes but {len(starts)} block indices in a transfer"
        )
    if len(engine.block_ids) != sum(sizes):
        raise ValueError(
            f"kvtier: {len(engine.block_ids)} engine blocks but group sizes add up to {sum(sizes)}"
        )
    spans = [chunks_spanned(n, start, factor) for n, start in zip(sizes, starts)]
    if num_slots != sum(spans):
        raise ValueError(
            f"kvtier: {num_slots} host slots for a transfer spanning {sum(spans)} chunks"
        )
    return spans


def check_range(what: str, ids: np.ndarray, limit: int) -> None:
    """``ValueError`` unless every id lies in ``[0, limit)``."""
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= limit):
        low, high = int(ids.min()), int(ids.max())
        raise ValueError(f"{what}s must lie in [0, {limit}), got {low}..{high}")

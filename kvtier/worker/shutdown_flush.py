"""The host tier's chunks written to the tiers below it as the engine shuts down, in bounded time.

The scheduler half knows which host chunks a lower tier lacks (its dirty chunks), but at shutdown
it takes no more steps: only the worker half runs. Each worker rank knows the chunk each of its
host slots holds (``WorkerConnector._slot_keys``) and asks every tier which of them it lacks (the
disk: this rank's file; Redis: an ``EXISTS`` of this rank's records, per batch), then writes
those, newest first, one batch at a time to each tier in turn, so that every tier gets the hottest
chunks first, until all are written or the deadline passed.

    flush_host(targets, record, chunks, deadline) -> {tier name: FlushCount}
    flush_tiers(tiers, record, chunks, deadline, counters)   the same for a rank's tiers,
                                                             counted and logged

A tier that fails (Redis down, a full disk) is left at once; a chunk too large for the room a
tier has left is skipped. What a tier still lacks is counted and logged by the caller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.keys import ChunkKey, key_group
from kvtier.tiers.base.chunk_format import Buffer
from kvtier.tiers.base.chunk_tier import FlushTier
from kvtier.worker.rank_counters import RankCounters

logger = logging.getLogger(__name__)

BATCH = 32  # chunks checked, then written, per tier and round trip

Record = Callable[[int, int], Buffer]  # (host slot, group) -> the chunk's record there


@dataclass
class FlushTarget:
    """``tier`` under its chain ``name``; ``room``: bytes this rank may still write there
    (None: the tier's own budget, as Redis's ``maxmemory``)."""

    name: str
    tier: FlushTier
    room: int | None = None


@dataclass
class FlushCount:
    """What the flush did for one tier: chunks it ``written``, chunks the tier still lacks or
    that were never checked (``unwritten``), and why it stopped early (``stopped``)."""

    written: int = 0
    unwritten: int = 0
    stopped: str = ""  # "" | "deadline" | the error that made the tier be left


def flush_host(
    targets: Sequence[FlushTarget],
    record: Record,
    chunks: Sequence[tuple[int, ChunkKey]],
    deadline: float,
) -> dict[str, FlushCount]:
    """Write each (slot, key) of ``chunks`` (newest first) that a target lacks, each from its
    host ``record(slot, group)``, until ``deadline`` (monotonic)."""
    counts = {target.name: FlushCount() for target in targets}
    live = list(targets)
    for first in range(0, len(chunks), BATCH):
        batch = chunks[first : first + BATCH]
        for target in list(live):
            count = counts[target.name]
            if time.monotonic() >= deadline:
                count.stopped = "deadline"
            else:
                try:
                    count.unwritten += _write_batch(target, record, batch, count)
                    continue
                except OSError as error:
                    count.stopped = str(error) or type(error).__name__
            live.remove(target)
            count.unwritten += len(chunks) - first  # this batch and the next: not known held
    return counts


def _write_batch(
    target: FlushTarget,
    record: Record,
    batch: Sequence[tuple[int, ChunkKey]],
    count: FlushCount,
) -> int:
    """Write the chunks of ``batch`` ``target`` lacks and has room for; how many it still
    lacks. OSError: the tier failed."""
    tier = target.tier
    held = tier.holds_many([key for _, key in batch])
    todo: list[tuple[int, ChunkKey]] = []
    lacking = 0
    for (slot, key), there in zip(batch, held):
        if there:
            continue
        size = tier.file_bytes(key_group(key))
        if target.room is not None and size > target.room:
            lacking += 1  # no room left for it
            continue
        if target.room is not None:
            target.room -= size
        todo.append((slot, key))
    if not todo:
        return lacking
    payloads = [[record(slot, key_group(key))] for slot, key in todo]
    written = tier.write_many([key for _, key in todo], payloads)
    count.written += sum(n is not None for n in written)
    return lacking + sum(n is None for n in written)


def flush_tiers(
    targets: Sequence[FlushTarget],
    record: Record,
    chunks: Sequence[tuple[int, ChunkKey]],
    deadline: float,
    counters: RankCounters,
) -> None:
    """``flush_host`` for a rank's ``targets``: what each tier got, counted in ``counters``
    (``shutdown_written``, ``shutdown_unwritten``) and logged."""
    started = time.perf_counter()
    counts: dict[str, FlushCount] = {}
    if time.monotonic() < deadline:
        counts = flush_host(targets, record, chunks, deadline)
    for target in targets:
        count = counts.get(target.name) or FlushCount(0, len(chunks), "no time left")
        counters.shutdown_written[target.name] = count.written
        counters.shutdown_unwritten[target.name] = count.unwritten
        stopped = f" (stopped: {count.stopped})" if count.stopped else ""
        logger.info(
            "kvtier: shutdown wrote %d host chunks to %s in %.2f s; %d of %d not written "
            "or not checked%s", count.written, target.name, time.perf_counter() - started,
            count.unwritten, len(chunks), stopped,
        )  # fmt: skip

"""The chunks a tier load reads, and their reading: in order on the job's thread, or several at
once on threads of their own where the tier allows it (the disk tier: ``disk.readers``, by
default ``disk/files.py``'s ``default_readers``; not Redis, whose replies come in the order of
its prefetches).

    ChunkRead                 a chunk of a job: its position, group, the blocks it fills
    plan_reads(plan, factor)  every chunk a load's copy plan reads, in reading order
    ChunkReader               reads a batch of chunks into their staging buffers: ok per chunk
                              (``read``), or starts reading it and returns how to wait for it
                              (``submit``: the next batch read while the caller moves one)

A read that fails (a ``ChunkError``: bad or absent, the tier removed it; an ``OSError``: the
tier unreachable) is a ``False`` for its chunk, the others of the batch read all the same.
Each read is the tier's own, checks included: a chunk's buffer is good only where its read
returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from typing import NamedTuple

import numpy as np

from kvtier.keys import ChunkKey
from kvtier.tiers.base.chunk_format import ChunkError
from kvtier.tiers.base.chunk_plan import GroupCopy
from kvtier.tiers.base.chunk_tier import ChunkTier

logger = logging.getLogger(__name__)


class ChunkRead(NamedTuple):
    """A chunk of a job to read: its position in the job's keys, group, the engine blocks it
    fills and the sub-block of its record the first of them is."""

    chunk: int
    group: int
    block_ids: np.ndarray
    first: int


def plan_reads(plan: Sequence[GroupCopy], factor: int) -> list[ChunkRead]:
    """Every chunk the plan reads, in reading order, with the blocks it fills."""
    reads = []
    for copy in plan:
        chunk_of_row = copy.host_rows // factor
        for chunk in dict.fromkeys(chunk_of_row.tolist()):
            mine = np.flatnonzero(chunk_of_row == chunk)
            first = int(copy.host_rows[mine[0]]) % factor  # a chunk's rows are consecutive
            reads.append(ChunkRead(chunk, copy.group, copy.block_ids[mine], first))
    return reads


class ChunkReader:
    """Reads chunks of ``tier`` into buffers, ``readers`` at once (threads named
    ``kvtier-<name>-read``; none when it is 1: the calling thread reads them in order)."""

    def __init__(self, tier: ChunkTier, name: str, readers: int = 1) -> None:
        if readers < 1:
            raise ValueError(f"{name} tier: readers must be >= 1, got {readers}")
        self.tier = tier
        self.name = name
        self._pool = (
            ThreadPoolExecutor(readers, thread_name_prefix=f"kvtier-{name}-read")
            if readers > 1
            else None
        )

    @property
    def beside(self) -> bool:
        """Whether reads run on threads of their own (``submit`` returns before they end)."""
        return self._pool is not None

    def read(
        self,
        keys: Sequence[ChunkKey],
        into: Sequence[np.ndarray],
        before: Callable[[int], object] = lambda i: None,
    ) -> list[bool]:
        """Each chunk ``keys[i]``'s record into ``into[i]``; whether each read and verified.
        ``before(i)`` is called on this thread before chunk ``i`` is read (one reader: right
        before it, so that a tier's prefetches stay as far ahead as it asked; several: all of
        them first)."""
        return self.submit(keys, into, before)()

    def submit(
        self,
        keys: Sequence[ChunkKey],
        into: Sequence[np.ndarray],
        before: Callable[[int], object] = lambda i: None,
    ) -> Callable[[], list[bool]]:
        """``read``, started: returns what waits for every read of the batch to end and says
        whether each read and verified (one reader: they are read before this returns)."""
        if len(keys) != len(into):
            raise ValueError(f"{len(keys)} chunks to read into {len(into)} buffers")
        if self._pool is None:
            good = []
            for i, (key, out) in enumerate(zip(keys, into)):
                before(i)
                good.append(self._one(key, out))
            return lambda: good
        for i in range(len(keys)):
            before(i)
        reads = [self._pool.submit(self._one, key, out) for key, out in zip(keys, into)]
        return partial(_results, reads)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _one(self, key: ChunkKey, out: np.ndarray) -> bool:
        try:
            self.tier.read(key, [out])
        except (ChunkError, OSError) as error:
            if not isinstance(error, ChunkError):
                logger.warning("kvtier: %s chunk unreadable: %s", self.name, error)
            return False
        return True


def _results(reads: Sequence[Future[bool]]) -> list[bool]:
    """Every read done before any error is raised: none writes into a reused buffer."""
    wait(reads)
    return [read.result() for read in reads]

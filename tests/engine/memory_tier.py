"""A tier from outside kvtier, written as docs/DESIGN.md's "How to add a tier" says: chunks in a
Python dict, shared by the two halves of an in-process engine (a test's ``LLM``).

Plugged in by its import path alone, with no change under ``kvtier/``::

    {"cpu_bytes_to_use": ..., "tiers": ["memory_tier:SPEC"], "memory": {"max_chunks": 512}}

``read_delay_s`` (tests only; default 0) makes each chunk's read take that much longer: a tier
slower than the engine computing the same tokens (``test_hit_cost.py``).

The scheduler half's index (``MemoryIndex``) answers lookups from the dict, in order; each rank's
side (``MemoryChunks``) reads and writes its share of a chunk, and kvtier's generic handlers
(``kvtier.tiers.chunk_io``) move it between the dict and the engine or the host tier.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.config_parse import mapping, non_negative_float, optional, positive_int, required
from kvtier.keys import ChunkKey, key_group
from kvtier.layout import KVLayout
from kvtier.tiers.base.chunk_format import Buffer, ChunkError
from kvtier.tiers.base.chunk_io import TierLoadHandler, TierWriteHandler
from kvtier.tiers.base.chunk_tier import view_bytes
from kvtier.tiers.base.index import Found, Traits, Usage
from kvtier.tiers.base.spec import SchedulerContext, TierSpec, WorkerContext, WorkerTier

NAME = "memory"
STORE: dict[tuple[ChunkKey, int], bytes] = {}  # (key, rank) -> the rank's record of the chunk


@dataclass(frozen=True)
class MemoryConfig:
    max_chunks: int
    read_delay_s: float = 0.0  # added to each chunk's read

    @classmethod
    def parse(cls, raw: object, key: str) -> MemoryConfig:
        section = mapping(raw, key, ("max_chunks", "read_delay_s"))
        return cls(
            required(section, key, "max_chunks", positive_int),
            optional(section, key, "read_delay_s", non_negative_float, 0.0),
        )


class MemoryIndex:
    """The scheduler half's view (``kvtier/scheduler/lower_tier.py``): a chunk is ready when
    every rank's share is in ``STORE``; at most ``max_chunks`` of them, oldest evicted first."""

    name = NAME
    traits = Traits(reads_before_forward=True, write_through=True, max_in_flight=64)

    def __init__(self, max_chunks: int, world_size: int) -> None:
        self.max_chunks, self.world_size = max_chunks, world_size
        self.ready: dict[ChunkKey, None] = {}  # oldest first
        self.writing: set[ChunkKey] = set()
        self.pinned: dict[ChunkKey, int] = {}
        self.evicted = 0
        self.removed: list[ChunkKey] = []  # ready chunks dropped since ``take_removed``

    def usage(self) -> Usage:
        # a snapshot: the ranks' write threads add chunks meanwhile (list() holds the GIL)
        return Usage(sum(len(record) for record in list(STORE.values())), None, self.evicted)

    def lookup(self, keys: Sequence[ChunkKey]) -> Found:
        found = 0
        for key in keys:
            if key not in self.ready:
                break
            found += 1
        return Found(found)

    def prepare_load(self, keys: Sequence[ChunkKey]) -> None:
        for key in keys:
            self.pinned[key] = self.pinned.get(key, 0) + 1

    def complete_load(self, keys: Sequence[ChunkKey], bad: Sequence[ChunkKey] = ()) -> None:
        for key in keys:
            self.pinned[key] -= 1
            if not self.pinned[key]:
                del self.pinned[key]
        for key in bad:
            self._drop(key)

    def holds(self, key: ChunkKey) -> bool:
        return key in self.ready or key in self.writing

    def prepare_store(self, keys: Sequence[ChunkKey]) -> list[ChunkKey]:
        taken = []
        for key in keys:
            while len(self.ready) + len(self.writing) >= self.max_chunks and self._evict():
                pass
            if len(self.ready) + len(self.writing) < self.max_chunks:
                self.writing.add(key)
                taken.append(key)
        return taken

    def complete_store(self, ok: Mapping[ChunkKey, int], failed: Sequence[ChunkKey]) -> None:
        for key in ok:
            self.writing.discard(key)
            self.ready[key] = None
        for key in failed:
            self.writing.discard(key)

    def verify(self, keys: Sequence[ChunkKey]) -> int:
        return len(keys)  # nothing is lost unseen: the dict is this process's

    def take_gone(self) -> list[ChunkKey]:
        return []

    def take_removed(self) -> list[ChunkKey]:
        removed, self.removed = self.removed, []
        return removed

    def check_integrity(self) -> None:
        assert not self.ready.keys() & self.writing

    def _evict(self) -> bool:
        for key in self.ready:
            if key not in self.pinned:
                self._drop(key)
                self.evicted += 1
                return True
        return False

    def _drop(self, key: ChunkKey) -> None:
        if key in self.ready:
            del self.ready[key]
            self.removed.append(key)
        for rank in range(self.world_size):
            STORE.pop((key, rank), None)


class MemoryChunks:
    """One rank's share of each chunk (``kvtier/tiers/chunk_tier.py``), and what a shutdown
    flush needs (``kvtier/worker/shutdown_flush.py``)."""

    read_ahead = 0

    def __init__(self, layout: KVLayout, rank: int, factor: int, read_delay_s: float = 0.0) -> None:
        self.layout, self.rank, self.factor = layout, rank, factor
        self.read_delay_s = read_delay_s

    def prefetch(self, key: ChunkKey) -> None:
        return None

    def read(self, key: ChunkKey, out: Sequence[np.ndarray]) -> None:
        if self.read_delay_s:
            time.sleep(self.read_delay_s)  # a slow medium, as the tests configure it
        record = STORE.get((key, self.rank))
        size = sum(view_bytes(self.layout, key_group(key), self.factor))
        if record is None or len(record) != size or sum(o.nbytes for o in out) != size:
            raise ChunkError(f"memory tier: no chunk {key.hex()[:16]} of this shape")
        at = 0
        for buffer in out:  # the record, in the pieces the handler asks for
            buffer[:] = np.frombuffer(record, np.uint8, buffer.nbytes, at)
            at += buffer.nbytes

    def write(self, key: ChunkKey, payload: Sequence[Buffer]) -> int:
        record = b"".join(bytes(memoryview(b).cast("B")) for b in payload)
        STORE[(key, self.rank)] = record
        return len(record)

    def file_bytes(self, group: int) -> int:
        return sum(view_bytes(self.layout, group, self.factor))

    def holds_many(self, keys: Sequence[ChunkKey]) -> list[bool]:
        return [(key, self.rank) in STORE for key in keys]

    def write_many(
        self, keys: Sequence[ChunkKey], payloads: Sequence[Sequence[Buffer]]
    ) -> list[int | None]:
        return [self.write(key, payload) for key, payload in zip(keys, payloads)]


def _scheduler(ctx: SchedulerContext) -> MemoryIndex:
    return MemoryIndex(ctx.config.max_chunks, ctx.world_size)


def _worker(ctx: WorkerContext) -> WorkerTier:
    chunks = MemoryChunks(ctx.layout, ctx.rank, ctx.factor, ctx.config.read_delay_s)
    return WorkerTier(
        NAME,
        load=TierLoadHandler(ctx.layout, chunks, NAME),
        write=TierWriteHandler(ctx.host, chunks, NAME),
        flush=chunks,
    )


SPEC = TierSpec(
    name=NAME,
    hit_source="EXTERNAL_UNSPECIFIED",
    section=NAME,
    parse=MemoryConfig.parse,
    scheduler=_scheduler,
    worker=_worker,
)

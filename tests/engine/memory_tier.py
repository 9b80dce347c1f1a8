"""A tier from outside kvtier, written as docs/DESIGN.md's "How to add a tier" says: chunks in a
Python dict, shared by the two halves of an in-process engine (a test's ``LLM``).

Plugged in by its import path alone, with no change under ``kvtier/``::

    {"cpu_bytes_to_use": ..., "tiers": ["memory_tier:SPEC"], "memory": {"max_chunks": 512}}

``read_delay_s`` (tests only; default 0) makes each chunk's read take that much longer: a tier
slower than the engine computing the same tokens (``test_hit_cost.py``).

The scheduler half's index (``MemoryIndex``) answers lookups from the dict, in order; each rank's
side (``MemoryChunks``) reads and writes its share of a chunk, and kvtier's generic handlers
(``TierLoadHandler``, ``TierWriteHandler``) move it between the dict and the engine or the host
tier. It imports one module of kvtier's, its public one for tiers: ``kvtier.tier_api``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvtier import tier_api as api

NAME = "memory"
STORE: dict[tuple[api.ChunkKey, int], bytes] = {}  # (key, rank) -> the rank's record of the chunk


@dataclass(frozen=True)
class MemoryConfig:
    max_chunks: int
    read_delay_s: float = 0.0  # added to each chunk's read

    @classmethod
    def parse(cls, raw: object, key: str) -> MemoryConfig:
        section = api.mapping(raw, key, ("max_chunks", "read_delay_s"))
        return cls(
            api.required(section, key, "max_chunks", api.positive_int),
            api.optional(section, key, "read_delay_s", api.non_negative_float, 0.0),
        )


class MemoryIndex:
    """The scheduler half's view (``kvtier/scheduler/lower_tier.py``): a chunk is ready when
    every rank's share is in ``STORE``; at most ``max_chunks`` of them, oldest evicted first."""

    name = NAME
    traits = api.Traits(reads_before_forward=True, write_through=True, max_in_flight=64)

    def __init__(self, max_chunks: int, world_size: int) -> None:
        self.max_chunks, self.world_size = max_chunks, world_size
        self.ready: dict[api.ChunkKey, None] = {}  # oldest first
        self.writing: set[api.ChunkKey] = set()
        self.pinned: dict[api.ChunkKey, int] = {}
        self.evicted = 0
        self.removed: list[api.ChunkKey] = []  # ready chunks dropped since ``take_removed``

    def usage(self) -> api.Usage:
        # a snapshot: the ranks' write threads add chunks meanwhile (list() holds the GIL)
        return api.Usage(sum(len(record) for record in list(STORE.values())), None, self.evicted)

    def lookup(self, keys: Sequence[api.ChunkKey]) -> api.Found:
        found = 0
        for key in keys:
            if key not in self.ready:
                break
            found += 1
        return api.Found(found)

    def prepare_load(self, keys: Sequence[api.ChunkKey]) -> None:
        for key in keys:
            self.pinned[key] = self.pinned.get(key, 0) + 1

    def complete_load(self, keys: Sequence[api.ChunkKey], bad: Sequence[api.ChunkKey] = ()) -> None:
        for key in keys:
            self.pinned[key] -= 1
            if not self.pinned[key]:
                del self.pinned[key]
        for key in bad:
            self._drop(key)

    def holds(self, key: api.ChunkKey) -> bool:
        return key in self.ready or key in self.writing

    def prepare_store(self, keys: Sequence[api.ChunkKey]) -> list[api.ChunkKey]:
        taken = []
        for key in keys:
            while len(self.ready) + len(self.writing) >= self.max_chunks and self._evict():
                pass
            if len(self.ready) + len(self.writing) < self.max_chunks:
                self.writing.add(key)
                taken.append(key)
        return taken

    def complete_store(
        self, ok: Mapping[api.ChunkKey, int], failed: Sequence[api.ChunkKey]
    ) -> None:
        for key in ok:
            self.writing.discard(key)
            self.ready[key] = None
        for key in failed:
            self.writing.discard(key)

    def verify(self, keys: Sequence[api.ChunkKey]) -> int:
        return len(keys)  # nothing is lost unseen: the dict is this process's

    def take_gone(self) -> list[api.ChunkKey]:
        return []

    def take_removed(self) -> list[api.ChunkKey]:
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

    def _drop(self, key: api.ChunkKey) -> None:
        if key in self.ready:
            del self.ready[key]
            self.removed.append(key)
        for rank in range(self.world_size):
            STORE.pop((key, rank), None)


class MemoryChunks:
    """One rank's share of each chunk (``kvtier/tiers/chunk_tier.py``), and what a shutdown
    flush needs (``kvtier/worker/shutdown_flush.py``)."""

    read_ahead = 0

    def __init__(
        self, layout: api.KVLayout, rank: int, factor: int, read_delay_s: float = 0.0
    ) -> None:
        self.layout, self.rank, self.factor = layout, rank, factor
        self.read_delay_s = read_delay_s

    def prefetch(self, key: api.ChunkKey) -> None:
        return None

    def read(self, key: api.ChunkKey, out: Sequence[np.ndarray]) -> None:
        if self.read_delay_s:
            time.sleep(self.read_delay_s)  # a slow medium, as the tests configure it
        record = STORE.get((key, self.rank))
        size = sum(api.view_bytes(self.layout, api.key_group(key), self.factor))
        if record is None or len(record) != size or sum(o.nbytes for o in out) != size:
            raise api.ChunkError(f"memory tier: no chunk {key.hex()[:16]} of this shape")
        at = 0
        for buffer in out:  # the record, in the pieces the handler asks for
            buffer[:] = np.frombuffer(record, np.uint8, buffer.nbytes, at)
            at += buffer.nbytes

    def write(self, key: api.ChunkKey, payload: Sequence[api.Buffer]) -> int:
        record = b"".join(bytes(memoryview(b).cast("B")) for b in payload)
        STORE[(key, self.rank)] = record
        return len(record)

    def file_bytes(self, group: int) -> int:
        return sum(api.view_bytes(self.layout, group, self.factor))

    def holds_many(self, keys: Sequence[api.ChunkKey]) -> list[bool]:
        return [(key, self.rank) in STORE for key in keys]

    def write_many(
        self, keys: Sequence[api.ChunkKey], payloads: Sequence[Sequence[api.Buffer]]
    ) -> list[int | None]:
        return [self.write(key, payload) for key, payload in zip(keys, payloads)]


def _scheduler(ctx: api.SchedulerContext) -> MemoryIndex:
    return MemoryIndex(ctx.config.max_chunks, ctx.world_size)


def _worker(ctx: api.WorkerContext) -> api.WorkerTier:
    chunks = MemoryChunks(ctx.layout, ctx.rank, ctx.factor, ctx.config.read_delay_s)
    return api.WorkerTier(
        NAME,
        load=api.TierLoadHandler(ctx.layout, chunks, NAME),
        write=api.TierWriteHandler(ctx.host, chunks, NAME),
        flush=chunks,
    )


SPEC = api.TierSpec(
    name=NAME,
    hit_source="EXTERNAL_UNSPECIFIED",
    section=NAME,
    parse=MemoryConfig.parse,
    scheduler=_scheduler,
    worker=_worker,
)

"""Which chunks a request can load, and from which tier: the load half of the scheduler.

    hit_run(state, first, full) -> HitRun         the loadable chunks from ``first``: in the
                                                  host tier, across tiers, store in flight?
    plan(state, num_external_tokens) -> [LoadJob] pin the hit and make its load jobs

A hit is a run of chunks in the host tier followed by a run on disk, in every full-attention group;
a sliding-window group needs only the chunks of its window at the hit's end, in the same order.
That gives one load job per tier, each a contiguous range of blocks per group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from kvtier.addresses import DiskChunks, EngineBlocks, HostChunks
from kvtier.counters import KVTierStats
from kvtier.keys import ChunkKey, ChunkKeyMaker
from kvtier.scheduler.disk_index import DiskIndex
from kvtier.scheduler.job_table import Job, JobKind, JobTable
from kvtier.scheduler.manager import ChunkManager
from kvtier.scheduler.request import RequestState
from kvtier.scheduler.store_planner import NULL_BLOCK
from kvtier.step_plan import LoadJob


class HitRun(NamedTuple):
    """Chunks ``first..host_end`` are in the host tier and ``first..end`` across the tiers;
    ``retry``: the run stops at a chunk whose store is in flight."""

    host_end: int
    end: int
    retry: bool = False


@dataclass(frozen=True)
class GroupSpec:
    """One KV cache group as the scheduler half needs it."""

    block_tokens: int
    sliding_window: int | None = None  # tokens; None for full attention


class LoadPlanner:
    def __init__(
        self,
        groups: Sequence[GroupSpec],
        keys: ChunkKeyMaker,
        block_tokens: int,
        manager: ChunkManager,
        disk: DiskIndex | None,
        jobs: JobTable,
        stats: KVTierStats,
    ) -> None:
        self.groups = tuple(groups)
        self.keys = keys
        self.factor = keys.block_size_factor
        self.block_tokens = block_tokens
        self.chunk_tokens = block_tokens * self.factor
        self.manager = manager
        self.disk = disk
        self.jobs = jobs
        self.stats = stats

    def hit_run(self, state: RequestState, first: int, full: int) -> HitRun:
        """The loadable run of chunks from chunk ``first`` (at most to ``full``): where its part
        in the host tier ends, where it ends across the tiers, and whether it stops at a chunk
        whose store is in flight (it may be longer on a later step)."""
        if self.manager.capacity == 0 and self.disk is None:
            return HitRun(first, first, False)
        end, host_end, retry = full, full, False
        for g, spec in enumerate(self.groups):
            if spec.sliding_window is None:
                keys = state.group_keys(self.keys, g, full)[first:end]
                found = self.manager.lookup(keys)
                host_end = min(host_end, first + found.ready)
                end = first + found.ready + self._on_disk(keys[found.ready :])
                retry = retry or found.retry_later
        host_end = min(host_end, end)
        while end > first and not self._window_ready(state, end, disk=True):
            end -= 1
        host_end = min(host_end, end)
        while host_end > first and not self._window_ready(state, host_end, disk=False):
            host_end -= 1
        return HitRun(host_end, end, retry)

    def _window_ready(self, state: RequestState, end: int, disk: bool) -> bool:
        """Whether every sliding-window group holds the chunks its window needs at chunk ``end``
        (in the host tier, or also on disk)."""
        for g, spec in enumerate(self.groups):
            if spec.sliding_window is None:
                continue
            first_token = max(0, end * self.chunk_tokens - spec.sliding_window)
            keys = state.group_keys(self.keys, g, end)[first_token // self.chunk_tokens : end]
            in_host = self.manager.lookup(keys).ready
            on_disk = self._on_disk(keys[in_host:]) if disk else 0
            if in_host + on_disk < len(keys):
                return False
        return True

    def _on_disk(self, keys: Sequence[ChunkKey]) -> int:
        """How many leading ``keys`` the disk tier holds (0 without one)."""
        return self.disk.lookup(keys) if self.disk is not None and keys else 0

    def _ready(self, chunk_keys: list[ChunkKey], block: int) -> bool:
        key = chunk_keys[block // self.factor]
        return self.manager.is_ready(key) or self._on_disk([key]) == 1

    def plan(self, state: RequestState, num_external_tokens: int) -> list[LoadJob]:
        """Pin the hit of ``num_external_tokens`` beyond the engine's own and make its loads.

        Per group, the blocks of the hit's chunks in the host tier come first, then those on
        disk: at most one load job per tier.
        """
        start, end = state.num_computed_tokens, state.num_computed_tokens + num_external_tokens
        host, disk = _LoadParts(), _LoadParts()
        counted: tuple[int, int] | None = None  # (host, disk) chunks of the first full group
        host_end = start  # where the host part of the first full group ends, in tokens
        for g, spec in enumerate(self.groups):
            # a hit capped before the prompt's last token ends inside a block: load all of it
            first, last = start // self.block_tokens, -(-end // self.block_tokens)
            if num_external_tokens == 0:
                first = last
            chunk_keys = state.load_keys(self.keys, g, -(-last // self.factor))
            blocks = state.block_ids[g]
            if spec.sliding_window is not None:  # only the window's chunks were looked up
                window = max(0, end - spec.sliding_window) // self.chunk_tokens * self.factor
                first = min(last, max(first, window))
            # a sliding window keeps only its last blocks (the others are NULL_BLOCK), and only
            # those chunks were required by lookup; skip what lies before them
            while first < last and (
                blocks[first] == NULL_BLOCK
                or (spec.sliding_window is not None and not self._ready(chunk_keys, first))
            ):
                first += 1
            split = first
            while split < last and self.manager.is_ready(chunk_keys[split // self.factor]):
                split = (split // self.factor + 1) * self.factor
            split = min(split, last)
            in_host = host.add(first, split, chunk_keys, blocks, self.factor)
            on_disk = disk.add(split, last, chunk_keys, blocks, self.factor)
            if counted is None and spec.sliding_window is None:
                counted = (in_host, on_disk)
                host_end = min(end, max(start, split * self.block_tokens))
            # chunks loaded from disk are stored in the host tier again, once loaded
            full = len(state.block_hashes) // self.factor  # a tail is not a chunk to store
            state.stored_upto[g] = max(state.stored_upto[g], min(split // self.factor, full))
            if split // self.factor > full:
                state.tail_done = True  # loaded: never stored again
        self._count_lookup(state, *(counted or (0, 0)))
        if num_external_tokens:
            in_host_tokens = host_end - start if counted is not None else num_external_tokens
            state.loaded_tokens = _nonzero(
                {"cpu": in_host_tokens, "disk": num_external_tokens - in_host_tokens}
            )
        loads = []
        if host.keys:
            sync = not state.load_async
            slots = HostChunks(np.array(self.manager.prepare_load(host.keys).slots, np.int64))
            if sync:  # read before this step's forward, so before its stores write any slot:
                self.manager.complete_load(host.keys)  # this step's stores may evict them
            job = Job(state.req_id, host.keys, JobKind.LOAD, pinned=not sync)
            loads.append(self._load(state, job, slots, host, sync))
        if disk.keys:
            assert self.disk is not None, "kvtier: a disk hit without a disk tier"
            self.disk.prepare_load(disk.keys)
            job = Job(state.req_id, disk.keys, JobKind.DISK_LOAD)
            chunks = DiskChunks(tuple(disk.keys))
            loads.append(self._load(state, job, chunks, disk, sync=not state.load_async))
        return loads

    def _count_lookup(self, state: RequestState, in_host: int, on_disk: int) -> None:
        if not state.lookup_end:  # count each lookup once: vLLM calls this again after a load
            return
        looked = state.lookup_end - state.lookup_start
        # full chunks only: a prompt's tail loaded after them is not a chunk looked up
        in_host = min(in_host, looked)
        on_disk = min(on_disk, looked - in_host)
        self.stats.lookups += 1
        self.stats.cpu.hit_chunks += in_host
        self.stats.cpu.miss_chunks += looked - in_host
        if "disk" in self.stats.tiers:
            self.stats.tiers["disk"].hit_chunks += on_disk
            self.stats.tiers["disk"].miss_chunks += looked - in_host - on_disk
        state.lookup_start = state.lookup_end = 0

    def _load(
        self,
        state: RequestState,
        job: Job,
        src: HostChunks | DiskChunks,
        parts: _LoadParts,
        sync: bool,
    ) -> LoadJob:
        job_id = self.jobs.add(job)
        blocks = EngineBlocks(
            np.array(parts.ids, dtype=np.int64), tuple(parts.sizes), tuple(parts.starts)
        )
        state.load_jobs.add(job_id)
        return LoadJob(job_id, state.req_id, src, blocks, sync)


class _LoadParts:
    """The part of a hit one tier loads: its keys and engine blocks, group by group."""

    def __init__(self) -> None:
        self.keys: list[ChunkKey] = []
        self.ids: list[int] = []
        self.sizes: list[int] = []
        self.starts: list[int] = []

    def add(
        self, first: int, end: int, chunk_keys: list[ChunkKey], blocks: list[int], factor: int
    ) -> int:
        """Blocks ``first:end`` of the next group (none when ``first == end``); its chunks."""
        keys = chunk_keys[first // factor : -(-end // factor)] if first < end else []
        self.keys += keys
        self.ids += blocks[first:end]
        self.sizes.append(max(0, end - first))
        self.starts.append(first if first < end else 0)
        return len(keys)


def _nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {name: count for name, count in counts.items() if count}

"""Which chunks a request can load, and from which tier: the load half of the scheduler.

    hit_run(state, first, full) -> HitRun         the loadable chunks from ``first``: in the
                                                  host tier, across tiers, store in flight?
    plan(state, num_external_tokens) -> [LoadJob] pin the hit and make its load jobs

A hit is one run of chunks across the tiers, in every full-attention group: a run in the host
tier, then a run in the first tier of the chain below it (``lower_tier.py``: the disk tier, the
Redis tier), then in the next; a sliding-window group needs only the chunks of its window at the
hit's end, in the same order. That gives one load job per tier, each a contiguous range of blocks
per group. A remote tier may not know yet (its lookup is in flight): the run stops there and is
``pending``; the part a load may read before the forward (``sync_end``) stops at the first chunk
of a tier that is never read synchronously (a network store).

The run's types (``HitRun``, ``Below``, ``GroupSpec``) are ``hit.py``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvtier.addresses import NULL_BLOCK, EngineBlocks, HostChunks, TierChunks
from kvtier.counters import KVTierStats
from kvtier.keys import ChunkKey, ChunkKeyMaker
from kvtier.scheduler.hit import Below, GroupSpec, HitRun
from kvtier.scheduler.job_table import Job, JobKind, JobTable
from kvtier.scheduler.request import RequestState
from kvtier.step_plan import LoadJob
from kvtier.tiers.base.index import TierIndex
from kvtier.tiers.host.index import ChunkManager


class LoadPlanner:
    def __init__(
        self,
        groups: Sequence[GroupSpec],
        keys: ChunkKeyMaker,
        block_tokens: int,
        manager: ChunkManager,
        lower: Sequence[TierIndex],
        jobs: JobTable,
        stats: KVTierStats,
        chain_before_forward: bool = True,  # a local disk's short read before the forward;
    ) -> None:  # False where the engine does not recover from one failing (vllm/recovery.py)
        self.groups = tuple(groups)
        self.keys = keys
        self.factor = keys.block_size_factor
        self.block_tokens = block_tokens
        self.chunk_tokens = block_tokens * self.factor
        self.manager = manager
        self.lower = tuple(lower)
        self.jobs = jobs
        self.stats = stats
        self.chain_before_forward = chain_before_forward
        self._host_only = not self.lower and [g.sliding_window for g in self.groups] == [None]

    def hit_run(self, state: RequestState, first: int, full: int) -> HitRun:
        """The loadable run of chunks from chunk ``first`` (at most to ``full``): where its part
        in the host tier ends, where it ends across the tiers, whether it stops at a chunk whose
        store is in flight, where its part loadable before the forward ends, and whether a
        remote tier is still looking it up."""
        if self.manager.capacity == 0 and not self.lower:
            return HitRun(first, first, False)
        if self._host_only:  # one full-attention group, nothing below host memory
            found = self.manager.lookup(state.chunk_keys(self.keys, 0, full)[first:full])
            end = first + found.ready
            return HitRun(end, end, found.pending, end, False)
        end, host_end, sync_end, retry, pending = full, full, full, False, False
        stops = [full] * len(self.lower)  # where each tier's part ends, the least of the groups
        for g, spec in enumerate(self.groups):
            if spec.sliding_window is None:
                keys = state.group_keys(self.keys, g, full)[first:end]
                found = self.manager.lookup(keys)
                host_end = min(host_end, first + found.ready)
                below = self._below(keys[found.ready :])
                end = first + found.ready + below.chunks
                sync_end = min(sync_end, first + found.ready + below.sync)
                retry = retry or found.pending
                pending = pending or below.pending
                at = first + found.ready
                for i, count in enumerate(below.counts):
                    at += count
                    stops[i] = min(stops[i], at)
        host_end = min(host_end, end)
        while end > first and not (ready := self._window_ready(state, end, below=True)):
            if ready is None:  # a remote tier is still looking the window up: ask again
                end, pending = first, True  # later, rather than take a shorter run for a miss
                break
            end -= 1
        host_end, sync_end = min(host_end, end), min(sync_end, end)
        while host_end > first and not self._window_ready(state, host_end, below=False):
            host_end -= 1
        parts = tuple(
            (tier.name, max(host_end, min(stop, end))) for tier, stop in zip(self.lower, stops)
        )
        return HitRun(host_end, end, retry, sync_end, pending, parts)

    def _window_ready(self, state: RequestState, end: int, below: bool) -> bool | None:
        """Whether every sliding-window group holds the chunks its window needs at chunk ``end``
        (in the host tier, or also in the tiers ``below`` it); None: a tier below has not
        answered yet."""
        for g, spec in enumerate(self.groups):
            if spec.sliding_window is None:
                continue
            first_token = max(0, end * self.chunk_tokens - spec.sliding_window)
            keys = state.group_keys(self.keys, g, end)[first_token // self.chunk_tokens : end]
            in_host = self.manager.lookup(keys).ready
            lower = self._below(keys[in_host:]) if below else Below(0, 0, False)
            if lower.pending:
                return None
            if in_host + lower.chunks < len(keys):
                return False
        return True

    def _below(self, keys: Sequence[ChunkKey]) -> Below:
        """How many leading ``keys`` the chain below host memory holds, tier after tier."""
        count = sync = 0
        counts = [0] * len(self.lower)
        synchronous = self.chain_before_forward  # every tier with chunks so far: before the forward
        for i, tier in enumerate(self.lower):
            if count == len(keys):
                break
            found = tier.lookup(keys[count:])
            if found.pending and not found.ready:
                return Below(count, sync, True, tuple(counts))
            count += found.ready
            counts[i] = found.ready
            if tier.traits.reads_before_forward and synchronous:
                sync = count
            elif found.ready:
                synchronous = False
        return Below(count, sync, False, tuple(counts))

    def _ready(self, chunk_keys: list[ChunkKey], block: int) -> bool:
        key = chunk_keys[block // self.factor]
        return self.manager.is_ready(key) or self._below([key]).chunks == 1

    def plan(self, state: RequestState, num_external_tokens: int) -> list[LoadJob]:
        """Pin the hit of ``num_external_tokens`` beyond the engine's own and make its loads.

        Per group, the blocks of the hit's chunks in the host tier come first, then those of
        each tier of the chain, in its order: at most one load job per tier.
        """
        start, end = state.num_computed_tokens, state.num_computed_tokens + num_external_tokens
        if not num_external_tokens:  # no hit (most requests at high concurrency): no loads
            return self._no_load(state, -(-start // self.block_tokens))
        host = _LoadParts()
        lower = [_LoadParts() for _ in self.lower]
        counted: list[int] | None = None  # chunks per tier (host first) of the first full group
        ends: list[int] = []  # where each tier's part of the first full group ends, in tokens
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
            counts = [host.add(first, split, chunk_keys, blocks, self.factor)]
            stops = [split]
            for stop in self._lower_stops(split, last, chunk_keys):
                counts.append(lower[len(stops) - 1].add(stops[-1], stop, chunk_keys, blocks,
                                                        self.factor))  # fmt: skip
                stops.append(stop)
            if stops[-1] < last:
                raise AssertionError("kvtier: a hit beyond the host tier without a lower tier")
            if counted is None and spec.sliding_window is None:
                counted = counts
                ends = [min(end, max(start, stop * self.block_tokens)) for stop in stops]
            # chunks loaded from a lower tier are stored in the host tier again, once loaded
            full = len(state.block_hashes) // self.factor  # a tail is not a chunk to store
            state.stored_upto[g] = max(state.stored_upto[g], min(split // self.factor, full))
            if split // self.factor > full:
                state.tail_done = True  # loaded: never stored again
        self._count_lookup(state, counted or [0] * (1 + len(self.lower)))
        if num_external_tokens:
            # each tier's tokens, from the first full-attention group (its last part ends at
            # ``end``); without one, the host tier names the whole hit
            names = ["cpu", *(tier.name for tier in self.lower)]
            edges = [start, *(ends or [end])]
            tokens = {
                name: edges[i + 1] - edges[i] for i, name in enumerate(names[: len(edges) - 1])
            }
            state.loaded_tokens = _nonzero(tokens)
        loads = []
        if host.keys:
            sync = not state.load_async
            self.manager.prepare_load(host.keys)
            slots = HostChunks(np.array(self.manager.slots(host.keys), np.int64))
            if sync:  # read before this step's forward, so before its stores write any slot:
                self.manager.complete_load(host.keys)  # this step's stores may evict them
            job = Job(state.req_id, host.keys, JobKind.LOAD, pinned=not sync,
                      tokens=state.loaded_tokens.get("cpu", 0))  # fmt: skip
            loads.append(self._load(state, job, slots, host, sync))
        for tier, part in zip(self.lower, lower):
            if part.keys:
                tier.prepare_load(part.keys)
                job = Job(state.req_id, part.keys, JobKind.TIER_LOAD, tier=tier.name,
                          tokens=state.loaded_tokens.get(tier.name, 0))  # fmt: skip
                chunks = TierChunks(tier.name, tuple(part.keys))
                loads.append(self._load(state, job, chunks, part, sync=not state.load_async))
        return loads

    def _no_load(self, state: RequestState, computed_blocks: int) -> list[LoadJob]:
        """``plan`` of no hit: what the engine's own hit covers is not stored again."""
        held, full = computed_blocks // self.factor, len(state.block_hashes) // self.factor
        state.stored_upto = [max(upto, min(held, full)) for upto in state.stored_upto]
        state.tail_done = state.tail_done or held > full
        self._count_lookup(state, [0] * (1 + len(self.lower)))
        return []

    def _lower_stops(self, split: int, last: int, chunk_keys: list[ChunkKey]) -> list[int]:
        """Where each lower tier's part of blocks ``split..last`` ends: tier after tier, each from
        where the one before stopped; the last tier takes what is left (a chunk that is gone by
        now fails its load, and the engine recomputes it)."""
        stops, at = [], split
        for i, tier in enumerate(self.lower):
            if at < last and i < len(self.lower) - 1:
                found = tier.lookup(chunk_keys[at // self.factor : -(-last // self.factor)]).ready
                at = min(last, (at // self.factor + found) * self.factor) if found else at
            elif at < last:
                at = last
            stops.append(at)
        return stops

    def _count_lookup(self, state: RequestState, counts: Sequence[int]) -> None:
        """Count the looked-up chunks each tier served (``counts``: host first, then the chain)."""
        if not state.lookup_end:  # count each lookup once: vLLM calls this again after a load
            return
        # full chunks only: a prompt's tail loaded after them is not a chunk looked up
        left = state.lookup_end - state.lookup_start
        self.stats.lookups += 1
        declined = {part.tier: part.chunks for part in state.declined}
        for name, count in zip(["cpu", *(tier.name for tier in self.lower)], counts):
            served = min(count, left)
            computed = min(declined.get(name, 0), left - served)  # found, loading it too slow
            stats = self.stats.tiers[name]
            stats.hit_chunks += served
            stats.declined_chunks += computed
            stats.miss_chunks += left - served - computed
            left -= served + computed
        for tier in self.lower:  # counted by the tier, off the step
            self.stats.tiers[tier.name].failed_lookups = tier.usage().failed_lookups
        state.lookup_start = state.lookup_end = 0

    def _load(
        self,
        state: RequestState,
        job: Job,
        src: HostChunks | TierChunks,
        parts: _LoadParts,
        sync: bool,
    ) -> LoadJob:
        job.sync, job.writes = sync, list(parts.ids)
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

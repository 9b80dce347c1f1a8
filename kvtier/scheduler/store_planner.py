"""Which chunks a step completed, which of them fit in the host tier, and the jobs storing them.

A chunk is offered once, when the step that computes its last token is planned; chunks whose
blocks a sliding window already dropped (vLLM's null block, or below ``RequestState.dropped``)
are never offered. When a busy step cannot fit all its chunks (the others are pinned by loads or
still being stored), the earliest chunks of the prompt, the most reused, are kept.

A step's work is proportional to the chunks it completes: the keys, blocks and runs of the new
chunks only, never a request's whole table. A step's stores are one job (``plan``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from kvtier.addresses import NULL_BLOCK, EngineBlocks, HostChunks
from kvtier.counters import TierStats
from kvtier.keys import ChunkKey, ChunkKeyMaker
from kvtier.scheduler.job_table import Job, JobKind, JobTable, StorePart
from kvtier.scheduler.request import RequestState
from kvtier.step_plan import StoreJob
from kvtier.tiers.base.results import Key, StorePlan
from kvtier.tiers.host.index import ChunkManager


class ChunkOffer(NamedTuple):
    """A request's chunks a step completed: their keys, and per group their one-chunk runs
    ``(group, chunk, chunk + 1)``."""

    state: RequestState
    keys: list[ChunkKey]
    runs: list[list[tuple[int, int, int]]]


class TailOffer(NamedTuple):
    """A request's prompt tail, computed: its key and engine blocks (``first``: the first
    one's index in the request)."""

    state: RequestState
    key: ChunkKey
    blocks: list[int]
    first: int


class _Part(NamedTuple):
    """One part of a step's store job, as planned: the scheduler's record of it, and what its
    ``StoreJob`` tells the workers (engine blocks by group, host slots, keys to flush)."""

    state: RequestState
    record: StorePart
    blocks: list[int]
    sizes: tuple[int, ...]
    starts: tuple[int, ...]
    slots: list[int]
    flushed: tuple[ChunkKey, ...] = ()  # a prompt's tail is never written below host memory


class StorePlanner:
    def __init__(
        self,
        manager: ChunkManager,
        jobs: JobTable,
        keys: ChunkKeyMaker,
        block_tokens: int,
        stats: TierStats,
    ) -> None:
        self.manager = manager
        self.jobs = jobs
        self.keys = keys
        self.factor = keys.block_size_factor
        self.chunk_tokens = block_tokens * self.factor
        self.stats = stats
        self.evicted: list[tuple[ChunkKey, int]] = []  # (key, slot) evicted since take_evicted

    def take_evicted(self) -> list[tuple[ChunkKey, int]]:
        """The chunks evicted from the host tier to make room, with the slots they held."""
        evicted, self.evicted = self.evicted, []
        return evicted

    def offer(self, state: RequestState, num_computed_tokens: int) -> ChunkOffer | None:
        """``state``'s full chunks computed up to ``num_computed_tokens`` and not offered yet
        (None: none, most decode steps); they count as offered from now on."""
        full = min(num_computed_tokens // self.chunk_tokens, len(state.block_hashes) // self.factor)
        if full <= min(state.stored_upto):
            return None
        runs: list[list[tuple[int, int, int]]] = []  # per group: (group, first chunk, end chunk)
        offered: list[ChunkKey] = []
        for g in range(state.num_groups):
            first = state.stored_upto[g]
            keys = state.chunk_keys(self.keys, g, full) if full > first else []
            chunks = [c for c in range(first, full) if self._computed(state, g, c)]
            state.stored_upto[g] = max(first, full)
            offered += [keys[c] for c in chunks]
            runs.append([(g, c, c + 1) for c in chunks])
        return ChunkOffer(state, offered, runs) if offered else None

    def plan(self, offers: Sequence[ChunkOffer], tails: Sequence[TailOffer]) -> list[StoreJob]:
        """The stores of a step's ``offers``, then its prompt ``tails``: one job.

        One reservation for the whole step when the host tier has room for all of it (most
        steps); otherwise request by request, the chunks first (a full chunk is worth more than
        a tail), each request keeping the earliest chunks that fit (``reserve``).

        The step's stores are one job (``Job.parts``: a part per run of a request's chunks, and
        per tail): copied, reported and completed together, each part still its request's (a
        request finished keeps its blocks until the job is done; a part computed from a failed
        load fails alone). Each part is a ``StoreJob`` of the job's id for the workers.
        """
        keys = [key for offer in offers for key in offer.keys] + [tail.key for tail in tails]
        plan = self.manager.place(keys) if keys else None
        parts: list[_Part] = []
        if plan is not None:  # a chunk two requests offer is stored by the first
            self._evicted(plan)
            slots = dict(zip(plan.keys, plan.slots, strict=True))
            for offer in offers:
                parts += self._chunk_parts(offer, slots)
            for tail in tails:
                slot = slots.pop(tail.key, None)
                if slot is not None:
                    parts.append(self._tail_part(tail, slot))
        else:
            for offer in offers:
                plan, taken = self._reserve(offer.keys)
                if taken < len(offer.keys):
                    self._offer_again(offer.state, offer.runs, offer.keys[taken:])
                if plan is not None:
                    parts += self._chunk_parts(offer, dict(zip(plan.keys, plan.slots, strict=True)))
            for tail in tails:
                plan = self.reserve([tail.key])
                if plan is not None and plan.keys:
                    parts.append(self._tail_part(tail, plan.slots[0]))
        return self._job(parts) if parts else []

    def _job(self, parts: list[_Part]) -> list[StoreJob]:
        """One job of ``parts``: its id in the job table, in each request's ``store_jobs``."""
        job = Job(
            "", [key for part in parts for key in part.record.keys], JobKind.STORE,
            blocks=[block for part in parts for block in part.blocks],
            parts=[part.record for part in parts],
        )  # fmt: skip
        job_id = self.jobs.add(job)
        blocks = np.array(job.blocks, dtype=np.int64)  # each part's a view of the job's
        slots = np.array([slot for part in parts for slot in part.slots], dtype=np.int64)
        jobs, at, slot_at = [], 0, 0
        for state, _, ids, sizes, starts, part_slots, flushed in parts:
            state.store_jobs.add(job_id)
            end, slot_end = at + len(ids), slot_at + len(part_slots)
            engine = EngineBlocks(blocks[at:end], sizes, starts)
            host = HostChunks(slots[slot_at:slot_end])
            jobs.append(StoreJob(job_id, state.req_id, engine, host, flushed))
            at, slot_at = end, slot_end
        return jobs

    def _chunk_parts(self, offer: ChunkOffer, slots: dict[Key, int]) -> list[_Part]:
        """The parts storing ``offer``'s chunks that have a slot in ``slots`` (taken from it):
        one per run of adjacent chunks, each group's n-th run in the n-th part."""
        state, runs = offer.state, offer.runs
        if len(runs) == 1 and len(runs[0]) == 1:  # one group, one chunk: most offers
            group, first, end = run = runs[0][0]
            key = state.keys[group][first]
            slot = slots.pop(key, None)
            if slot is None:
                return []
            ids = state.block_ids[group][first * self.factor : end * self.factor]
            record = StorePart(state.req_id, [key], first, (run,))
            return [_Part(state, record, ids, (len(ids),), (first * self.factor,), [slot], (key,))]
        slot_of: dict[Key, int] = {}
        for group_runs in runs:  # keep the chunks prepare_store took, merge neighbours
            kept = []
            for run in group_runs:
                key = state.keys[run[0]][run[1]]
                slot = slots.pop(key, None)
                if slot is not None:
                    slot_of[key] = slot
                    kept.append(run)
            group_runs[:] = _merge(kept)
        return [
            self._chunk_part(state, [r[i] if i < len(r) else None for r in runs], slot_of)
            for i in range(max(map(len, runs), default=0))
        ]

    def _chunk_part(
        self,
        state: RequestState,
        runs: list[tuple[int, int, int] | None],
        slot_of: Mapping[Key, int],
    ) -> _Part:
        """The part storing run ``runs[g]`` (or nothing) of each group ``g``."""
        keys: list[ChunkKey] = []
        ids: list[int] = []
        sizes, starts = [], []
        factor = self.factor
        for g, run in enumerate(runs):
            if run is None:
                sizes.append(0)
                starts.append(0)
                continue
            _, first, end = run
            keys += state.keys[g][first:end]
            ids += state.block_ids[g][first * factor : end * factor]
            sizes.append((end - first) * factor)
            starts.append(first * factor)
        kept = tuple(run for run in runs if run is not None)
        first = min(run[1] for run in kept)
        record = StorePart(state.req_id, keys, first, kept)
        slots = [slot_of[k] for k in keys]
        return _Part(state, record, ids, tuple(sizes), tuple(starts), slots, tuple(keys))

    def _tail_part(self, tail: TailOffer, slot: int) -> _Part:
        """The part storing a prompt's tail into ``slot`` (host memory only: never flushed)."""
        record = StorePart(tail.state.req_id, [tail.key], host_only=True)
        return _Part(tail.state, record, tail.blocks, (len(tail.blocks),), (tail.first,), [slot])

    def _evicted(self, plan: StorePlan) -> None:
        self.stats.evicted_chunks += len(plan.evicted)
        self.evicted += zip(plan.evicted, plan.evicted_slots)  # type: ignore[arg-type]

    def reserve(self, offered: list[ChunkKey]) -> StorePlan | None:
        """Reserve slots for as long a prefix of ``offered`` as there is room for; the chunks
        evicted for them go to ``take_evicted`` (and the counters), the others are skipped.

        Chunks pinned by loads or still being stored cannot be evicted, so a busy step may not
        fit all of them; the earliest chunks of a prompt are the most reused, so keep those.
        """
        plan, kept = self._reserve(offered)
        self.stats.skipped_stores += len(offered) - kept
        return plan

    def _reserve(self, offered: list[ChunkKey]) -> tuple[StorePlan | None, int]:
        """``reserve``, uncounted: the plan, and how many leading chunks of ``offered`` it took."""
        for count in range(min(len(offered), self.manager.room), 0, -1):
            plan = self.manager.place(offered[:count])
            if plan is not None:
                self._evicted(plan)
                return plan, count
        return None, 0

    def _offer_again(
        self, state: RequestState, runs: list[list[tuple[int, int, int]]], cut: list[ChunkKey]
    ) -> None:
        """Chunks ``cut`` for lack of room (pinned by loads, being stored or written) are
        offered again on the request's next step while it holds their blocks: a host tier of
        a few chunks still takes every chunk of a long prompt, and passes it on to the tiers
        below. Counted as skipped once each."""
        if self.manager.capacity == 0:
            self.stats.skipped_stores += len(cut)
            return
        missing = set(cut)
        for g, group_runs in enumerate(runs):
            chunks = [c for _, c, _ in group_runs if state.keys[g][c] in missing]
            if not chunks:
                continue
            self.stats.skipped_stores += sum(c >= state.skipped_upto[g] for c in chunks)
            state.skipped_upto[g] = max(state.skipped_upto[g], chunks[-1] + 1)
            state.stored_upto[g] = min(state.stored_upto[g], chunks[0])

    def _computed(self, state: RequestState, group: int, chunk: int) -> bool:
        """Whether every block of ``chunk`` is allocated and still held (not left a window)."""
        first = chunk * self.factor
        if first < state.dropped[group]:
            return False
        blocks = state.block_ids[group][first : first + self.factor]
        return len(blocks) == self.factor and NULL_BLOCK not in blocks


def _merge(runs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    merged: list[tuple[int, int, int]] = []
    for run in runs:
        if merged and merged[-1][2] == run[1]:
            merged[-1] = (run[0], merged[-1][1], run[2])
        else:
            merged.append(run)
    return merged

"""Which chunks a step completed, which of them fit in the host tier, and the jobs storing them.

A chunk is offered once, when the step that computes its last token is planned; chunks whose
blocks a sliding window already dropped (vLLM's null block, or below ``RequestState.dropped``)
are never offered. When a busy step cannot fit all its chunks (the others are pinned by loads or
still being stored), the earliest chunks of the prompt, the most reused, are kept.

A step's work is proportional to the chunks it completes: the keys, blocks and runs of the new
chunks only, never a request's whole table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from kvtier.addresses import EngineBlocks, HostChunks
from kvtier.counters import TierStats
from kvtier.keys import ChunkKey, ChunkKeyMaker
from kvtier.scheduler.base import Key, StorePlan
from kvtier.scheduler.job_table import Job, JobKind, JobTable
from kvtier.scheduler.manager import ChunkManager
from kvtier.scheduler.request import RequestState
from kvtier.step_plan import StoreJob

NULL_BLOCK = 0  # vLLM's placeholder for blocks a group does not keep (outside a sliding window)


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
        """The store jobs of a step's ``offers``, then its prompt ``tails``.

        One reservation for the whole step when the host tier has room for all of it (most
        steps); otherwise request by request, the chunks first (a full chunk is worth more than
        a tail), each request keeping the earliest chunks that fit (``reserve``).
        """
        keys = [key for offer in offers for key in offer.keys] + [tail.key for tail in tails]
        plan = self.manager.prepare_store(keys) if keys else None
        jobs: list[StoreJob] = []
        if plan is not None:  # a chunk two requests offer is stored by the first
            self._evicted(plan)
            slots = dict(zip(plan.keys, plan.slots, strict=True))
            for offer in offers:
                jobs += self._chunk_jobs(offer, slots)
            for tail in tails:
                slot = slots.pop(tail.key, None)
                if slot is not None:
                    jobs.append(self._tail_job(tail, slot))
            return jobs
        for offer in offers:
            plan, taken = self._reserve(offer.keys)
            if taken < len(offer.keys):
                self._offer_again(offer.state, offer.runs, offer.keys[taken:])
            if plan is not None:
                jobs += self._chunk_jobs(offer, dict(zip(plan.keys, plan.slots, strict=True)))
        for tail in tails:
            plan = self.reserve([tail.key])
            if plan is not None and plan.keys:
                jobs.append(self._tail_job(tail, plan.slots[0]))
        return jobs

    def _chunk_jobs(self, offer: ChunkOffer, slots: dict[Key, int]) -> list[StoreJob]:
        """The jobs storing ``offer``'s chunks that have a slot in ``slots`` (taken from it):
        one per run of adjacent chunks, each group's n-th run in the n-th job."""
        state, runs = offer.state, offer.runs
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
            self._store_job(state, [r[i] if i < len(r) else None for r in runs], slot_of)
            for i in range(max(map(len, runs), default=0))
        ]

    def _tail_job(self, tail: TailOffer, slot: int) -> StoreJob:
        """The job storing a prompt's tail into ``slot`` (host memory only)."""
        state = tail.state
        job = Job(state.req_id, [tail.key], JobKind.STORE, tail.blocks, host_only=True)
        job_id = self.jobs.add(job)
        state.store_jobs.add(job_id)
        engine = EngineBlocks(np.array(tail.blocks, dtype=np.int64), (len(tail.blocks),),
                              (tail.first,))  # fmt: skip
        return StoreJob(job_id, state.req_id, engine, HostChunks(np.array([slot], np.int64)))

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
            plan = self.manager.prepare_store(offered[:count])
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

    def _store_job(
        self,
        state: RequestState,
        runs: list[tuple[int, int, int] | None],
        slot_of: Mapping[Key, int],
    ) -> StoreJob:
        """One job storing run ``runs[g]`` (or nothing) of each group ``g``."""
        keys: list[ChunkKey] = []
        ids: list[int] = []
        sizes, starts = [], []
        for g, run in enumerate(runs):
            if run is None:
                sizes.append(0)
                starts.append(0)
                continue
            _, first, end = run
            keys += state.keys[g][first:end]
            ids += state.block_ids[g][first * self.factor : end * self.factor]
            sizes.append((end - first) * self.factor)
            starts.append(first * self.factor)
        kept = tuple(run for run in runs if run is not None)
        first = min(run[1] for run in kept)
        job = Job(state.req_id, keys, JobKind.STORE, blocks=ids, first_chunk=first, runs=kept)
        job_id = self.jobs.add(job)
        state.store_jobs.add(job_id)
        return StoreJob(
            job_id,
            state.req_id,
            EngineBlocks(np.array(ids, dtype=np.int64), tuple(sizes), tuple(starts)),
            HostChunks(np.array([slot_of[k] for k in keys], dtype=np.int64)),
            tuple(keys),
        )


def _merge(runs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    merged: list[tuple[int, int, int]] = []
    for run in runs:
        if merged and merged[-1][2] == run[1]:
            merged[-1] = (run[0], merged[-1][1], run[2])
        else:
            merged.append(run)
    return merged

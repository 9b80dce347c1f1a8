"""Storing a prompt's tail: its blocks after its last full chunk, the last one partly filled.

    plan(state, num_computed_tokens) -> [StoreJob]   the tail's store, once the prompt is computed

A tail is kept in the host tier only (never written to disk, never flushed at shutdown): it lets a
later hit on the same prompt leave the engine one token to compute, whatever the prompt's length.
Rows of its last block past the prompt's end are whatever the engine wrote there (decoded tokens,
possibly while the store read them); a load gives them to a request that overwrites them before
attention reads them. Its key (``ChunkKeyMaker.tail_key``) names the prefix and the tail's tokens.
"""

from __future__ import annotations

import numpy as np

from kvtier.addresses import EngineBlocks, HostChunks
from kvtier.counters import TierStats
from kvtier.scheduler.job_table import Job, JobKind, JobTable
from kvtier.scheduler.manager import ChunkManager
from kvtier.scheduler.request import RequestState
from kvtier.scheduler.store_planner import NULL_BLOCK, StorePlanner
from kvtier.step_plan import StoreJob


class TailStore:
    def __init__(
        self,
        manager: ChunkManager,
        stores: StorePlanner,
        jobs: JobTable,
        block_tokens: int,
        factor: int,
        stats: TierStats,
    ) -> None:
        self.manager = manager
        self.stores = stores  # its evictions go with the step's others (disk write-back)
        self.jobs = jobs
        self.block_tokens = block_tokens
        self.factor = factor
        self.stats = stats

    def plan(self, state: RequestState, num_computed_tokens: int) -> list[StoreJob]:
        """The store of ``state``'s tail once the engine computed it (offered once)."""
        key = state.tail_key
        if key is None or state.tail_done or num_computed_tokens < state.tail_end:
            return []
        state.tail_done = True
        first = state.tail_end // self.block_tokens // self.factor * self.factor
        end = -(-state.tail_end // self.block_tokens)
        blocks = state.block_ids[0][first:end]
        if len(blocks) != end - first or NULL_BLOCK in blocks:
            return []
        plan = self.manager.prepare_store([key])
        if plan is None or not plan.keys:
            self.stats.skipped_stores += plan is None
            return []
        self.stats.evicted_chunks += len(plan.evicted)
        self.stores.evicted += zip(plan.evicted, plan.evicted_slots)  # type: ignore[arg-type]
        job_id = self.jobs.add(Job(state.req_id, [key], JobKind.STORE, blocks, host_only=True))
        state.store_jobs.add(job_id)
        engine = EngineBlocks(np.array(blocks, dtype=np.int64), (len(blocks),), (first,))
        return [StoreJob(job_id, state.req_id, engine, HostChunks(np.array(plan.slots, np.int64)))]

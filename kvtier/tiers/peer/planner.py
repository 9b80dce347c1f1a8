"""The scheduler half's prefill→decode calls (mixed into ``SchedulerConnector``).

    peer_lookup(req, hashes, params, ...)  -> int        tokens a decode request pulls
    peer_finished(req, params, blocks, ...) -> dict|None  a prefill request's offer: its params
    peer_released(reqs)                                   the workers freed offered blocks
    peer_release(params)                                  a decode engine frees an unused offer

Who pulls what, and the params' fields: ``peer.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kvtier.addresses import EngineBlocks
from kvtier.counters import KVTierStats
from kvtier.scheduler.job_table import Job, JobKind, JobTable
from kvtier.scheduler.load_planner import GroupSpec
from kvtier.scheduler.request import RequestState
from kvtier.step_plan import LoadJob, StepPlan
from kvtier.tiers.peer.roles import PeerConsumer, PeerProducer


class PeerRequests:
    groups: tuple[GroupSpec, ...]
    chunk_tokens: int
    requests: dict[str, RequestState]
    stats: KVTierStats
    producer: PeerProducer | None
    consumer: PeerConsumer | None
    _jobs: JobTable
    _plan: StepPlan
    _state: Callable[[str, Sequence[bytes]], RequestState]  # SchedulerConnector's

    def peer_lookup(
        self,
        req_id: str,
        block_hashes: Sequence[bytes],
        params: Mapping[str, Any] | None,
        num_prompt_tokens: int,
        num_computed_tokens: int,
    ) -> int:
        """Tokens a decode request pulls from its prefill engine beyond the engine's own hit,
        asynchronously (0: not a pull; kv_consumer only). The pull is planned by ``on_alloc``."""
        if self.consumer is None or not self.consumer.wants_pull(params):
            return 0
        tokens = self.consumer.lookup(params, num_prompt_tokens, num_computed_tokens)
        if tokens == 0:  # computed here, as any request (no pull planned, no state kept)
            return 0
        state = self._state(req_id, block_hashes)
        state.num_computed_tokens = num_computed_tokens
        state.peer_params = params
        state.load_async = True
        self.stats.lookups += 1
        return tokens

    def _peer_load(self, state: RequestState, num_external_tokens: int) -> LoadJob:
        assert self.consumer is not None and state.peer_params is not None
        load = self.consumer.pair(
            state.peer_params, state.block_ids, state.num_computed_tokens, num_external_tokens
        )
        state.peer_params = None  # one pull per request
        flat = np.fromiter((b for group in load.local for b in group), dtype=np.int64)
        dst = EngineBlocks(flat, tuple(len(group) for group in load.local), load.first_blocks)
        job_id = self._jobs.add(Job(state.req_id, [], JobKind.PEER_LOAD))
        state.load_jobs.add(job_id)
        state.loaded_tokens = {"peer": num_external_tokens}
        # the pulled prompt is not stored in this engine's tiers: the prefill engine keeps it
        # (the next turn is prefilled there), and a store on the request's first step would
        # delay its first token by a copy of the whole prompt
        pulled = (state.num_computed_tokens + num_external_tokens) // self.chunk_tokens
        state.stored_upto = [max(upto, pulled) for upto in state.stored_upto]
        state.tail_done = True
        return LoadJob(job_id, state.req_id, load.src, dst)

    def peer_release(self, params: Mapping[str, Any] | None) -> bool:
        """A decode request will not pull its prompt (it needs none of it, or ended before it
        was scheduled): tell the prefill engine to free its offer now, not after its hold.
        True when a release was planned (``params`` named a pull)."""
        if self.consumer is None or not self.consumer.wants_pull(params):
            return False
        assert params is not None
        self._plan.releases.append(self.consumer.release(params))
        return True

    def peer_finished(
        self,
        req_id: str,
        params: Mapping[str, Any] | None,
        block_ids: Sequence[Sequence[int]],
        num_computed_tokens: int,
        completed: bool,
    ) -> dict[str, Any] | None:
        """A prefill request finished (kv_producer): offer its blocks to a decode engine.

        Returns the params the decode engine needs (None: not offered). Call before
        ``request_finished``, which then holds the blocks until the workers release them.
        """
        if self.producer is None:
            return None
        offer, peer_params = self.producer.finished(
            req_id, params, block_ids, num_computed_tokens, completed
        )
        if offer is not None:
            self._plan.offers.append(offer)
        return peer_params

    def peer_released(self, req_ids: Iterable[str]) -> None:
        """vLLM's ``finished_sending``: every rank released these requests' blocks."""
        if self.producer is not None:
            self.producer.released(req_ids)

    def _complete_peer_load(self, job: Job) -> None:
        """Every rank finished a pull; counted in chunks of its tokens (the last maybe partial)."""
        stats, outcome = self.stats.tiers["peer"], job.outcome
        state = self.requests.get(job.req_id)
        chunks = -(-(state.loaded_tokens.get("peer", 0) if state else 0) // self.chunk_tokens)
        if outcome.failed:
            stats.failed_loads += 1
            return
        stats.hit_chunks += chunks
        stats.loaded_chunks += chunks
        stats.loaded_bytes += outcome.bytes
        stats.load_seconds += outcome.seconds

"""The peer tier in the scheduler half: a request source (a decode engine's pulls) and a holder
of offers (a prefill engine's finished requests). Added to the scheduler half with
``SchedulerConnector.add_source``.

    lookup(req, hashes, params, ...)    -> int        tokens a decode request pulls
    finished(req, params, blocks, ...)  -> dict|None  a prefill request's offer: its params
    released(reqs)                                    the workers freed offered blocks
    release(params)                     -> bool       a decode engine frees an unused offer

Who pulls what, and the params' fields: ``roles.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kvtier.addresses import EngineBlocks
from kvtier.scheduler.job_table import Job, JobKind
from kvtier.scheduler.request import RequestState
from kvtier.step_plan import LoadJob
from kvtier.tiers.peer.messages import NAME
from kvtier.tiers.peer.roles import PeerConsumer, PeerProducer

if TYPE_CHECKING:
    from kvtier.scheduler.connector import SchedulerConnector


class PeerPlanner:
    """``producer``: this engine prefills for decode engines; ``consumer``: it decodes, pulling
    its prompts from prefill engines (at most one of the two is set)."""

    name = NAME

    def __init__(
        self,
        scheduler: SchedulerConnector,
        producer: PeerProducer | None = None,
        consumer: PeerConsumer | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.producer, self.consumer = producer, consumer
        self._messages: list[object] = []  # offers and releases for the worker side

    # ---- a request source (``scheduler/request_source.py``) ---------------------------------

    def plan_load(self, state: RequestState, num_external_tokens: int) -> LoadJob | None:
        if self.consumer is None or state.source_params is None:
            return None
        load = self.consumer.pair(
            state.source_params, state.block_ids, state.num_computed_tokens, num_external_tokens
        )
        state.source_params = None  # one pull per request
        flat = np.fromiter((b for group in load.local for b in group), dtype=np.int64)
        dst = EngineBlocks(flat, tuple(len(group) for group in load.local), load.first_blocks)
        job_id = self.scheduler.jobs.add(Job(state.req_id, [], JobKind.SOURCE_LOAD, tier=NAME))
        state.load_jobs.add(job_id)
        state.loaded_tokens = {NAME: num_external_tokens}
        # the pulled prompt is not stored in this engine's tiers: the prefill engine keeps it
        # (the next turn is prefilled there), and a store on the request's first step would
        # delay its first token by a copy of the whole prompt
        chunk_tokens = self.scheduler.chunk_tokens
        pulled = (state.num_computed_tokens + num_external_tokens) // chunk_tokens
        state.stored_upto = [max(upto, pulled) for upto in state.stored_upto]
        state.tail_done = True
        return LoadJob(job_id, state.req_id, load.src, dst)

    def complete_load(self, job: Job) -> None:
        """Every rank finished a pull; counted in chunks of its tokens (the last maybe partial)."""
        stats, outcome = self.scheduler.stats.tiers[NAME], job.outcome
        state = self.scheduler.requests.get(job.req_id)
        tokens = state.loaded_tokens.get(NAME, 0) if state else 0
        chunks = -(-tokens // self.scheduler.chunk_tokens)
        if outcome.failed:
            stats.failed_loads += 1
            return
        stats.hit_chunks += chunks
        stats.loaded_chunks += chunks
        stats.loaded_bytes += outcome.bytes
        stats.load_seconds += outcome.seconds

    def holds(self, req_id: str) -> bool:
        return self.producer is not None and self.producer.holds(req_id)

    @property
    def pending(self) -> bool:
        return self.producer is not None and self.producer.pending

    def take_messages(self) -> list[object]:
        messages, self._messages = self._messages, []
        return messages

    # ---- prefill→decode ----------------------------------------------------------------------

    def lookup(
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
        state = self.scheduler.state(req_id, block_hashes)
        state.num_computed_tokens = num_computed_tokens
        state.source_params = params
        state.load_async = True
        self.scheduler.stats.lookups += 1
        return tokens

    def release(self, params: Mapping[str, Any] | None) -> bool:
        """A decode request will not pull its prompt (it needs none of it, or ended before it
        was scheduled): tell the prefill engine to free its offer now, not after its hold.
        True when a release was planned (``params`` named a pull)."""
        if self.consumer is None or not self.consumer.wants_pull(params):
            return False
        assert params is not None
        self._messages.append(self.consumer.release(params))
        return True

    def finished(
        self,
        req_id: str,
        params: Mapping[str, Any] | None,
        block_ids: Sequence[Sequence[int]],
        num_computed_tokens: int,
        completed: bool,
    ) -> dict[str, Any] | None:
        """A prefill request finished (kv_producer): offer its blocks to a decode engine.

        Returns the params the decode engine needs (None: not offered). Call before the
        scheduler's ``request_finished``, which then holds the blocks until the workers release
        them.
        """
        if self.producer is None:
            return None
        offer, peer_params = self.producer.finished(
            req_id, params, block_ids, num_computed_tokens, completed
        )
        if offer is not None:
            self._messages.append(offer)
        return peer_params

    def released(self, req_ids: Iterable[str]) -> None:
        """vLLM's ``finished_sending``: every rank released these requests' blocks."""
        if self.producer is not None:
            self.producer.released(req_ids)

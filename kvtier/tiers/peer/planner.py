"""The peer tier in the scheduler half: a request source (a decode engine's pulls,
``tiers/base/source.py``) and a holder of offers (a prefill engine's finished requests). Added
to the scheduler half with ``SchedulerConnector.add_source``; the scheduler owns the requests,
jobs and counts, this planner only answers for its own requests.

    lookup(params, prompt, computed)    -> int        tokens a decode request pulls
    plan_load(request, tokens)          -> SourceLoad the pull into the blocks allocated
    finished(req, params, blocks, ...)  -> dict|None  a prefill request's offer: its params
    released(reqs)                                    the workers freed offered blocks
    release(params)                     -> bool       a decode engine frees an unused offer

Who pulls what, and the params' fields: ``roles.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kvtier.addresses import EngineBlocks
from kvtier.tiers.base.source import SourceLoad, SourceRequest
from kvtier.tiers.peer.messages import NAME
from kvtier.tiers.peer.roles import PeerConsumer, PeerProducer


class PeerPlanner:
    """``producer``: this engine prefills for decode engines; ``consumer``: it decodes, pulling
    its prompts from prefill engines (at most one of the two is set)."""

    name = NAME

    def __init__(
        self, producer: PeerProducer | None = None, consumer: PeerConsumer | None = None
    ) -> None:
        self.producer, self.consumer = producer, consumer
        self._messages: list[object] = []  # offers and releases for the worker side

    # ---- a request source (``tiers/base/source.py``) -----------------------------------------

    def lookup(
        self, params: Mapping[str, Any] | None, num_prompt_tokens: int, num_computed_tokens: int
    ) -> int:
        """Tokens a decode request pulls from its prefill engine beyond the engine's own hit,
        asynchronously (0: not a pull; kv_consumer only)."""
        if self.consumer is None or not self.consumer.wants_pull(params):
            return 0
        return self.consumer.lookup(params, num_prompt_tokens, num_computed_tokens)

    def plan_load(self, request: SourceRequest, num_external_tokens: int) -> SourceLoad | None:
        if self.consumer is None:
            return None
        if num_external_tokens == 0:  # the engine took none of the pull: free the offer now
            self.release(request.params)
            return None
        load = self.consumer.pair(
            request.params, request.block_ids, request.num_computed_tokens, num_external_tokens
        )
        flat = np.fromiter((b for group in load.local for b in group), dtype=np.int64)
        dst = EngineBlocks(flat, tuple(len(group) for group in load.local), load.first_blocks)
        # the pulled prompt stays the prefill engine's (the next turn is prefilled there)
        return SourceLoad(load.src, dst, kept=True)

    def holds(self, req_id: str) -> bool:
        return self.producer is not None and self.producer.holds(req_id)

    @property
    def pending(self) -> bool:
        return self.producer is not None and self.producer.pending

    def take_messages(self) -> list[object]:
        messages, self._messages = self._messages, []
        return messages

    # ---- prefill→decode ----------------------------------------------------------------------

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

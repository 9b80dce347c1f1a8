"""A request's lookup: which run of chunks the tiers hold beyond the engine's own hit, and how
much of it is worth loading (``hit_policy.py``), with the prompt's tail.

    Lookups(...).lookup(state, computed, num_tokens, tail_tokens) -> int | None
        tokens worth loading beyond ``computed``; None: ask again next step (a store in flight,
        a remote tier's lookup, worth waiting for); ``state.load_async``: the request waits
    Lookups(...).may_wait(block_hashes, num_tokens) -> bool
        before its first lookup: whether a request may get a hit it waits for
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.scheduler.costs import HitCosts
from kvtier.scheduler.hit import HitRun
from kvtier.scheduler.hit_policy import HitPolicy, HitRequest, choose_hit
from kvtier.scheduler.load_planner import LoadPlanner
from kvtier.scheduler.request import RequestState
from kvtier.scheduler.tail_store import TailStore
from kvtier.tiers.host.index import ChunkManager


class Lookups:
    def __init__(
        self,
        manager: ChunkManager,
        loads: LoadPlanner,
        tails: TailStore,
        policy: HitPolicy,
        costs: HitCosts | None,
        groups: int,
        counted: bool,
    ) -> None:
        """``counted``: every lookup counts towards the host tier's store threshold."""
        self.manager, self.loads, self.tails, self.policy = manager, loads, tails, policy
        self.costs, self.groups, self.counted = costs, groups, counted

    def may_wait(self, block_hashes: Sequence[bytes], num_tokens: int, salt: bytes = b"") -> bool:
        """Before its first lookup: whether a request may get a hit it waits for. Its full
        chunks before its last token (a full-attention group's) are walked from the first (the
        engine's own hit is not known yet) while the host tier holds them: True at the first a
        tier below holds, or at the first held at all in a model of several KV cache groups
        (every load makes the request wait there). Only what this engine knows is read: a chunk
        another engine put in Redis or on a shared disk counts once this engine looked it up."""
        factor, keys, specs = self.loads.factor, self.loads.keys, self.loads.groups
        group = next((g for g, spec in enumerate(specs) if spec.sliding_window is None), 0)
        full = min(len(block_hashes) // factor, (num_tokens - 1) // self.policy.chunk_tokens)
        for start in range(0, full * factor, factor):
            (key,) = keys.keys(block_hashes[start : start + factor], group, salt=salt)
            if not self.manager.holds(key):
                return any(tier.holds(key) for tier in self.loads.lower)
            if self.groups > 1:
                return True
        return False

    def lookup(
        self,
        state: RequestState,
        num_computed_tokens: int,
        num_tokens: int | None,
        tail_tokens: Sequence[int] | None,
    ) -> int | None:
        chunk_tokens = self.policy.chunk_tokens
        first = num_computed_tokens // chunk_tokens
        full = len(state.block_hashes) // self.loads.factor
        state.num_computed_tokens = num_computed_tokens
        state.lookup_start, state.lookup_end = first, max(first, full)
        state.load_async, state.declined = False, ()
        if state.load_jobs:
            return 0
        tail = self.tails.key(state, num_tokens, tail_tokens) if self.groups == 1 else None
        if full <= first and tail is None:
            return 0
        run = self.loads.hit_run(state, first, full) if full > first else HitRun(first, first)
        if run.end == first < full and not (run.retry or run.pending) and not self.counted:
            return 0  # a miss from the first chunk on (no tail can follow): most new prompts
        tail_ready = tail is not None and self.manager.lookup([tail]).ready == 1
        costs = self.costs.view() if self.costs is not None else None
        request = HitRequest(num_computed_tokens, num_tokens, first, full)
        hit = choose_hit(run, request, self.policy, tail_ready, costs)
        state.load_async, state.declined = hit.load_async, hit.declined
        if self.costs is not None and costs is not None and hit.tokens is not None:
            self.costs.decided(hit.tiers, [part.tier for part in hit.declined])
        return hit.tokens

"""Stores that a failed synchronous load makes untrustworthy: they never reach a tier.

    untrusted_stores(load, requests) -> [(store job id, request)]   request parts to fail
    offer_again(state, part)                                          re-offer its chunks

The invariant every tier relies on: **a chunk enters a tier (host, disk, Redis, a peer's offer)
only from bytes that passed every check, or from engine blocks the engine computed; never from a
block whose load failed, nor from one computed while attending to such a block.**

An asynchronous load keeps it by construction: its request waits, so nothing is computed or
stored from its blocks until every rank loaded them; a failed one is recomputed first (vLLM's
``failed_recving``). A synchronous load cannot: it runs before the forward of the step that
runs its request, and that step's stores were planned with the step (``build_plan``), before
anyone knew the load would fail. vLLM then recomputes (``invalid_block_ids``: it rolls the
request back to the first failed block and drops the step's output), but the step's forward has
written, and its stores copy out, KV computed from whatever the failed blocks held.

So when a synchronous load is reported failed, every store in flight of a request that holds one
of its blocks (the loading request itself, or another that shares them through the engine's
prefix cache) fails as it completes, whatever its ranks reported; with asynchronous scheduling
that includes the next step's stores, planned before the report. Their chunks are offered again
from their first chunk, so the engine's recomputed KV is stored once it exists. Loads are
reported before the stores of the same step (every rank reads a synchronous load before its
forward, and stores after it), and ``on_report`` completes loads first.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvtier.scheduler.job_table import Job, StorePart
from kvtier.scheduler.request import RequestState


def untrusted_stores(
    load: Job, requests: Mapping[str, RequestState]
) -> list[tuple[int, RequestState]]:
    """The stores not yet completed whose KV may come from ``load``'s blocks (a failed sync
    load): each such request's part of each store job in its ``store_jobs``."""
    written = set(load.writes)
    found: list[tuple[int, RequestState]] = []
    for state in requests.values():
        if not state.store_jobs:
            continue
        shares = state.req_id == load.req_id or any(
            not written.isdisjoint(ids) for ids in state.block_ids
        )
        if shares:
            found += [(job_id, state) for job_id in state.store_jobs]
    return found


def offer_again(state: RequestState, store: StorePart) -> None:
    """Offer the chunks of ``state``'s part of a store again: from its first chunk on (a
    prompt's tail: the tail)."""
    state.due = 0  # looked at in its next step
    if store.host_only:
        state.tail_done = False
        return
    state.stored_upto = [min(upto, store.first_chunk) for upto in state.stored_upto]

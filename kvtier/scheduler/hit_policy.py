"""How much of a request's hit to load, and how: no request may be slower with kvtier than without.

    choose_hit(run, request, policy) -> Hit    tokens to load (None: ask again), asynchronously?

The rules, each against a measured regression:
- A hit stops before the request's last token: the engine computes it to sample the next token
  (vLLM would recompute it anyway; a synchronous load must leave it, or the step has no work).
- A single-group model's hit loads synchronously, before the forward of the step that runs the
  request, when what it reads from disk is shorter than ``min_async_load_tokens``: it costs a
  copy (and a short read), never a scheduling step. A tiny asynchronous load after the engine's
  own prefix hit once made that hit 1.7–4.7x slower.
- A longer read from disk makes the request wait instead (a step, not a stall of every running
  request). Several KV cache groups always load asynchronously (vLLM takes their load failures
  per request only), and only when the load adds ``min_async_load_tokens``: a shorter one costs
  more (a step) than computing those tokens.
- Waiting a step for a store in flight, or for a remote tier's lookup in flight, is worth it
  only when it could add as many tokens.
- A network tier (Redis) is never read before the forward: no engine step waits on it. A hit
  whose part in such a tier is too short to make the request wait ends before that part.
- The prompt's tail (its tokens after the last full chunk) counts when the host tier holds it
  after a full run: then the engine computes only the last token, at any prompt length.
"""

from __future__ import annotations

from typing import NamedTuple

from kvtier.scheduler.load_planner import HitRun


class HitRequest(NamedTuple):
    """What a lookup knows of the request: tokens the engine holds, its length (None: unknown,
    no cap and no synchronous load), chunks from the engine's hit to its last full chunk."""

    num_computed_tokens: int
    num_tokens: int | None
    first: int
    full: int


class HitPolicy(NamedTuple):
    chunk_tokens: int
    sync_capable: bool  # one KV cache group: a failed synchronous load is reported per block
    min_async_load_tokens: int


class Hit(NamedTuple):
    tokens: int | None  # beyond the engine's hit; None: ask again next step
    load_async: bool = False


def choose_hit(run: HitRun, request: HitRequest, policy: HitPolicy, tail_ready: bool) -> Hit:
    """The hit to answer for ``run`` (chunks ``request.first..``); ``tail_ready``: the host tier
    holds the prompt's tail, which follows chunk ``request.full``."""

    def tokens(end: int) -> int:
        covered = end * policy.chunk_tokens
        if request.num_tokens is not None:
            if end > request.full:  # the tail: to the end of the prompt
                covered = request.num_tokens
            covered = min(covered, request.num_tokens - 1)
        return max(0, covered - request.num_computed_tokens)

    if not (policy.sync_capable and request.num_tokens is not None):
        total = tokens(run.end)
        if run.pending and tokens(request.full) - total >= policy.min_async_load_tokens:
            return Hit(None)
        if total >= policy.min_async_load_tokens:
            return Hit(total, load_async=True)
        if run.retry and tokens(request.full) >= policy.min_async_load_tokens:
            return Hit(None)
        return Hit(0)
    host_end = run.host_end
    if tail_ready and host_end == request.full:
        host_end += 1
    in_host, total = tokens(host_end), max(tokens(host_end), tokens(run.end))
    if run.pending and tokens(request.full) - total >= policy.min_async_load_tokens:
        return Hit(None)  # a remote tier may hold more than it would cost to wait for
    if total - in_host >= policy.min_async_load_tokens:
        return Hit(total, load_async=True)  # a long read from disk: worth a step, not a stall
    if total == 0 and run.retry and tokens(request.full) >= policy.min_async_load_tokens:
        return Hit(None)
    sync_end = run.end if run.sync_end is None else run.sync_end
    # the host part, and a short read from a local disk, before the step's forward
    return Hit(max(in_host, tokens(sync_end)))

"""How much of a request's hit to load, and how: no request may be slower with kvtier than without.

    choose_hit(run, request, policy, tail_ready, costs) -> Hit   tokens to load (None: ask
                                                                 again), asynchronously?

Once the engine's steps are measured (``costs``: ``costs/model.py``), what the hit loads is
decided by its measured costs (``hit_benefit.py``): the end of the run, at a tier's boundary,
whose predicted compute saved most exceeds its predicted loads and, for a load that makes the
request wait, the wait; the rest is computed. Until then, the rules below decide, each against
a regression it prevents; their intent holds in both:

- A hit stops before the request's last token: the engine computes it to sample the next token
  (vLLM would recompute it anyway; a synchronous load must leave it, or the step has no work).
- A single-group model's hit loads synchronously, before the forward of the step that runs the
  request, when what it reads from disk is shorter than ``min_async_load_tokens`` (unset: 256):
  it costs a copy (and a short read), never a scheduling step. A tiny asynchronous load after
  the engine's own prefix hit would make that hit several times slower.
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

from kvtier.scheduler.costs import CostView
from kvtier.scheduler.hit import Declined, Hit, HitPolicy, HitRequest, HitRun
from kvtier.scheduler.hit_benefit import choose_by_benefit

__all__ = ["Declined", "Hit", "HitPolicy", "HitRequest", "choose_hit"]


def choose_hit(
    run: HitRun,
    request: HitRequest,
    policy: HitPolicy,
    tail_ready: bool,
    costs: CostView | None = None,
) -> Hit:
    """The hit to answer for ``run`` (chunks ``request.first..``); ``tail_ready``: the host tier
    holds the prompt's tail, which follows chunk ``request.full``; ``costs``: the measured
    costs (None: not measured yet, the rules decide)."""
    if costs is not None:
        return choose_by_benefit(run, request, policy, tail_ready, costs)
    return _by_rules(run, request, policy, tail_ready)


def _by_rules(run: HitRun, request: HitRequest, policy: HitPolicy, tail_ready: bool) -> Hit:
    def tokens(end: int) -> int:
        return request.covered(end, policy.chunk_tokens)

    min_async = policy.wait_tokens
    if not (policy.sync_capable and request.num_tokens is not None):
        total = tokens(run.end)
        if run.pending and tokens(request.full) - total >= min_async:
            return Hit(None)
        if total >= min_async:
            return Hit(total, load_async=True)
        if run.retry and tokens(request.full) >= min_async:
            return Hit(None)
        return Hit(0)
    host_end = run.host_end
    if tail_ready and host_end == request.full:
        host_end += 1
    in_host, total = tokens(host_end), max(tokens(host_end), tokens(run.end))
    if run.pending and tokens(request.full) - total >= min_async:
        return Hit(None)  # a remote tier may hold more than it would cost to wait for
    if total - in_host >= min_async:
        return Hit(total, load_async=True)  # a long read from disk: worth a step, not a stall
    if total == 0 and run.retry and tokens(request.full) >= min_async:
        return Hit(None)
    sync_end = run.end if run.sync_end is None else run.sync_end
    # the host part, and a short read from a local disk, before the step's forward
    return Hit(max(in_host, tokens(sync_end)))

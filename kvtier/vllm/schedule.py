"""vLLM's ``SchedulerOutput`` as the scheduler half's ``StepRequests``: only what changed.

vLLM 0.32 (``vllm/v1/core/sched/output.py``): a request scheduled for the first time
(``scheduled_new_reqs``; with Model Runner V2, and from vLLM 0.34 always, also one resumed after
a preemption) carries its whole block table. A request scheduled before
(``scheduled_cached_reqs``) carries the blocks allocated to it this step (``new_block_ids``, None
for none), which extend its table, unless it is resumed after a preemption (``resumed_req_ids``,
gone in 0.34): then they are its whole table. Every other change to a table happens in place and
unannounced: a sliding window replacing the blocks it left with the null block (``scheduled.py``
accounts for it).

The running requests stay vLLM's own columns (``CachedRequestData`` is one list per field): at
512 concurrent requests, a Python object per request and step cost more than all kvtier's
decisions of a decode step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtier.scheduler.scheduled import ScheduledRequest, StepRequests

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput


def step_requests(output: SchedulerOutput) -> StepRequests:
    """The requests ``output`` runs, in its order (new ones, then those running before), each
    with its new blocks: O(new requests) in Python, the running ones vLLM's columns joined.

    Never reads a request's whole table unless vLLM hands it over anew.
    """
    new = output.scheduled_new_reqs
    cached = output.scheduled_cached_reqs
    whole = set(range(len(new)))
    resumed = getattr(cached, "resumed_req_ids", None)  # vLLM 0.32 and 0.33 only
    if resumed:  # whole tables again (rare)
        whole.update(len(new) + i for i, req_id in enumerate(cached.req_ids) if req_id in resumed)
    if not new:  # most steps of a busy engine: vLLM's lists as they are
        return StepRequests(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens,
                            output.num_scheduled_tokens, frozenset(whole))  # fmt: skip
    return StepRequests(
        [r.req_id for r in new] + cached.req_ids,
        [r.block_ids for r in new] + cached.new_block_ids,  # type: ignore[operator]
        [r.num_computed_tokens for r in new] + cached.num_computed_tokens,
        output.num_scheduled_tokens,
        frozenset(whole),
    )


def scheduled_requests(output: SchedulerOutput) -> list[ScheduledRequest]:
    """Every request ``output`` runs, in its order, as a ``ScheduledRequest``: what
    ``step_requests`` hands the scheduler half, one by one."""
    return list(step_requests(output))


def rewritten_early(output: SchedulerOutput) -> list[int]:
    """Blocks the model runner writes before the connector's ``handle_preemptions``, where the
    workers wait for the stores the plan flushes: with Model Runner V2 (vLLM's default on CUDA)
    the new blocks it zeroes (``new_block_ids_to_zero``: Mamba or mixed-precision caches) and
    the copies it makes of a block a prefix-cache hit ends inside (``kv_cache_block_copies``).
    V1 writes them after; both are taken alike (a store failed for nothing is stored again)."""
    zeroed = getattr(output, "new_block_ids_to_zero", None) or []
    copies = getattr(output, "kv_cache_block_copies", None) or []
    return [*zeroed, *(copy.dst_block_id for copy in copies)]

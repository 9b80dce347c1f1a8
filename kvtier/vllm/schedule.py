"""vLLM's ``SchedulerOutput`` as the scheduler half's ``ScheduledRequest``s: only what changed.

vLLM 0.32 (``vllm/v1/core/sched/output.py``): a request scheduled for the first time
(``scheduled_new_reqs``; with Model Runner V2 also one resumed after a preemption) carries its
whole block table. A request scheduled before (``scheduled_cached_reqs``) carries the blocks
allocated to it this step (``new_block_ids``, None for none), which extend its table, unless it
is resumed after a preemption (``resumed_req_ids``): then they are its whole table. Every other
change to a table happens in place and unannounced: a sliding window replacing the blocks it left
with the null block (``scheduled.py`` accounts for it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtier.scheduler.scheduled import ScheduledRequest

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput


def scheduled_requests(output: SchedulerOutput) -> list[ScheduledRequest]:
    """The requests ``output`` runs, each with its new blocks: O(requests + new blocks).

    Never reads a request's whole table unless vLLM hands it over anew.
    """
    tokens = output.num_scheduled_tokens
    scheduled = [
        ScheduledRequest(
            new.req_id,
            new.block_ids,
            new.num_computed_tokens + tokens[new.req_id],
            tokens[new.req_id],
        )
        for new in output.scheduled_new_reqs
    ]
    cached = output.scheduled_cached_reqs
    resumed = cached.resumed_req_ids
    for req_id, block_ids, computed in zip(
        cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, strict=True
    ):
        count = tokens[req_id]
        appended = req_id not in resumed
        scheduled.append(ScheduledRequest(req_id, block_ids, computed + count, count, appended))
    return scheduled

"""``kvtier bench scheduler --adapter``: the simulated steps as vLLM's own ``SchedulerOutput``.

Built as vLLM 0.32's scheduler builds it (fresh lists per request: new requests with their whole
tables, running ones with the blocks allocated this step or None, resumed ones with their whole
tables in ``resumed_req_ids``), then read by the adapter's own ``kvtier.vllm.schedule
.step_requests``. Imports vLLM.
"""

from __future__ import annotations

from collections.abc import Callable

from kvtier.apps.bench.scheduler.sim import Adapter, Scheduled
from kvtier.scheduler.scheduled import StepRequests


def vllm_adapter() -> Adapter:
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    from kvtier.vllm.schedule import step_requests

    def make(scheduled: list[Scheduled]) -> Callable[[], StepRequests]:
        first = [s for s in scheduled if s.whole and not s.resumed]
        cached = [s for s in scheduled if not (s.whole and not s.resumed)]
        new_reqs = [
            NewRequestData(
                req_id=s.req_id,
                prompt_token_ids=None,
                mm_features=[],
                sampling_params=None,
                pooling_params=None,
                block_ids=tuple(list(t) for t in s.tables),
                num_computed_tokens=s.computed,
                lora_request=None,
            )
            for s in first
        ]
        cached_reqs = CachedRequestData(
            req_ids=[s.req_id for s in cached],
            resumed_req_ids={s.req_id for s in cached if s.resumed},
            new_token_ids=[],
            all_token_ids={},
            new_block_ids=[_new_block_ids(s) for s in cached],
            num_computed_tokens=[s.computed for s in cached],
            num_output_tokens=[1 for _ in cached],
        )
        tokens = {s.req_id: s.tokens for s in scheduled}
        output = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached_reqs,
            num_scheduled_tokens=tokens,
            total_num_scheduled_tokens=sum(tokens.values()),
            scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={},
            finished_req_ids=set(),
            free_encoder_mm_hashes=[],
        )
        return lambda: step_requests(output)

    return make


def _new_block_ids(s: Scheduled) -> tuple[list[int], ...] | None:
    if s.resumed:
        return tuple(list(t) for t in s.tables)
    return tuple(s.new) if any(s.new) else None

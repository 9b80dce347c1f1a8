"""``kvtier bench scheduler --adapter``: the simulated steps as vLLM's own ``SchedulerOutput``.

Built as vLLM's scheduler builds it (fresh lists per request: new requests with their whole
tables, running ones with the blocks allocated this step or None, resumed ones with their whole
tables in ``resumed_req_ids``, or from vLLM 0.34 as new ones), then read by the adapter's own
``kvtier.vllm.schedule.step_requests``. Imports vLLM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from kvtier.apps.bench.scheduler.sim import Adapter, Scheduled
from kvtier.scheduler.scheduled import StepRequests


def vllm_adapter() -> Adapter:
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    from kvtier.vllm.schedule import step_requests

    # vLLM 0.34 sends a resumed request as a new one, and its cached requests no token ids
    resumed_apart = "resumed_req_ids" in {f.name for f in dataclasses.fields(CachedRequestData)}

    def make(scheduled: list[Scheduled]) -> Callable[[], StepRequests]:
        first = [s for s in scheduled if s.whole and not (s.resumed and resumed_apart)]
        cached = [s for s in scheduled if not (s.whole and not (s.resumed and resumed_apart))]
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
                prefill_token_ids=[],
            )
            for s in first
        ]
        resumed = {s.req_id for s in cached if s.resumed}
        apart: dict[str, Any] = {"resumed_req_ids": resumed, "all_token_ids": {}}
        cached_reqs = CachedRequestData(
            req_ids=[s.req_id for s in cached],
            new_token_ids=[],
            new_block_ids=[_new_block_ids(s) for s in cached],
            num_computed_tokens=[s.computed for s in cached],
            num_output_tokens=[1 for _ in cached],
            **(apart if resumed_apart else {}),
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

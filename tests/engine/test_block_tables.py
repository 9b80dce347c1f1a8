"""kvtier keeps each request's block table from the blocks vLLM allocates each step (never reading
a whole table again): the adapter's reading of vLLM's ``SchedulerOutput``, and, every step of real
engines (preemptions; a sliding window shorter than a chunk), tables that agree with vLLM's own."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from harness import connector, engine, generate, greedy, kvtier_transfer, prompts, settle
from vllm import LLM
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

import kvtier
from kvtier.addresses import NULL_BLOCK
from kvtier.scheduler.connector import ScheduledRequest, SchedulerConnector
from kvtier.step_plan import StepPlan
from kvtier.vllm.schedule import scheduled_requests


def test_the_adapter_hands_over_new_blocks_and_whole_tables_only_when_vllm_does() -> None:
    new = NewRequestData(
        req_id="n", prompt_token_ids=None, mm_features=[], sampling_params=None,
        pooling_params=None, block_ids=([1, 2, 3],), num_computed_tokens=32, lora_request=None,
    )  # fmt: skip
    cached = CachedRequestData(
        req_ids=["grows", "same", "resumed"],
        resumed_req_ids={"resumed"},
        new_token_ids=[],
        all_token_ids={},
        new_block_ids=[([7],), None, ([8, 9],)],
        num_computed_tokens=[95, 96, 0],
        num_output_tokens=[3, 4, 5],
    )
    tokens = {"n": 60, "grows": 1, "same": 1, "resumed": 40}
    output = SchedulerOutput(
        scheduled_new_reqs=[new], scheduled_cached_reqs=cached, num_scheduled_tokens=tokens,
        total_num_scheduled_tokens=102, scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={}, finished_req_ids=set(), free_encoder_mm_hashes=[],
    )  # fmt: skip
    assert scheduled_requests(output) == [
        ScheduledRequest("n", ([1, 2, 3],), 92, 60, appended=False),
        ScheduledRequest("grows", ([7],), 96, 1, appended=True),
        ScheduledRequest("same", None, 97, 1, appended=True),
        ScheduledRequest("resumed", ([8, 9],), 40, 40, appended=False),
    ]


def _agree_with_vllm(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """After every plan, each scheduled request's table in kvtier equals vLLM's, except blocks a
    sliding window freed in place (vLLM's null block), which kvtier must count as dropped.
    Every store reads only blocks its request still holds. Returns running counts: tables
    compared, blocks known freed only by kvtier's window rule, stores checked."""
    client: Any = llm.llm_engine.engine_core  # in-process: the engine core itself
    manager = client.engine_core.scheduler.kv_cache_manager
    counts = {"tables": 0, "dropped": 0, "stores": 0}
    build = SchedulerConnector.build_plan

    def spy(self: SchedulerConnector, scheduled: Iterable[ScheduledRequest], *args: Any,
            **kwargs: Any) -> StepPlan:  # fmt: skip
        scheduled = list(scheduled)
        plan = build(self, scheduled, *args, **kwargs)
        for request in scheduled:
            state = self.requests.get(request.req_id)
            if state is None:
                continue
            theirs = manager.get_block_ids(request.req_id)
            for g, (ours, vllm_ids) in enumerate(zip(state.block_ids, theirs, strict=True)):
                assert len(ours) == len(vllm_ids), (request.req_id, g)
                for i, (mine, real) in enumerate(zip(ours, vllm_ids, strict=True)):
                    freed = real == NULL_BLOCK and (mine == NULL_BLOCK or i < state.dropped[g])
                    assert mine == real or freed, (request.req_id, g, i, mine, real)
                    counts["dropped"] += freed and mine != NULL_BLOCK
            counts["tables"] += 1
        for job in plan.stores:  # a store reads only blocks its request still holds
            held = {block for ids in manager.get_block_ids(job.req_id) for block in ids}
            assert set(job.src.block_ids.tolist()) <= held - {NULL_BLOCK}, job
            counts["stores"] += 1
        return plan

    monkeypatch.setattr(SchedulerConnector, "build_plan", spy)
    return counts


def test_tables_agree_with_vllm_through_preemptions(
    tiny_model: Path, reference: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_prompts = prompts(tiny_model, [200, 230, 180, 210], seed=43)
    tight = {"num_gpu_blocks_override": 24, "max_model_len": 512}  # preempts
    expected = reference(tiny_model, token_prompts, max_tokens=64, **tight)
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(block_size=64), **tight) as llm:
        counts = _agree_with_vllm(llm, monkeypatch)
        for _ in range(2):
            assert generate(llm, token_prompts, greedy(64)) == expected
            settle(llm)
            llm.reset_prefix_cache()
        assert kvtier.stats(llm).preemptions > 0
        assert counts["tables"] > 100
        connector(llm).scheduler.check_integrity()


def test_tables_agree_with_vllm_when_a_window_frees_blocks_inside_a_chunk(
    hybrid_model: Path, reference: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """128-token chunks, a 64-token sliding window: vLLM frees a chunk's first blocks before its
    last token is computed; kvtier never stores such a chunk, and the outputs stay right."""
    token_prompts = prompts(hybrid_model, [300, 200, 450], seed=53)
    expected = reference(hybrid_model, token_prompts, max_tokens=64)
    with engine(hybrid_model, kv_transfer_config=kvtier_transfer(block_size=128)) as llm:
        counts = _agree_with_vllm(llm, monkeypatch)
        for _ in range(2):
            assert generate(llm, token_prompts, greedy(64)) == expected
            settle(llm)
            llm.reset_prefix_cache()
        scheduler = connector(llm).scheduler
        assert counts["tables"] > 100
        assert counts["dropped"] > 0  # blocks only the window rule knew were freed
        assert counts["stores"] > 0
        scheduler.check_integrity()

"""kvtier under pressure: eviction every round, many concurrent requests, aborts, preemption."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import connector, engine, generate, greedy, kvtier_transfer, prompts, settle

import kvtier
from kvtier.tiers.host.io.copy_cpu import CpuCopyHandler


def _expected(reference: Any, model: Path, token_prompts: list[list[int]]) -> list[list[int]]:
    """``token_prompts``' outputs from the engine without kvtier (its default arguments); the
    module's other such sets of the tiny model too, from the same engine (one engine start
    instead of three)."""
    heads = prompts(model, [192, 128, 160, 96], seed=21)
    tails = prompts(model, [40 + 9 * i for i in range(8)], seed=22)
    others = [prompts(model, [260, 200, 330, 150, 280, 240], seed=11),
              [head + tail[1:] for head in heads for tail in tails],
              prompts(model, [330, 200], seed=71)]  # fmt: skip
    sets = [(p, 8) for p in (token_prompts, *others)]
    outputs: list[list[list[int]]] = reference.many(model, sets)
    return outputs[0]


def test_host_tier_smaller_than_the_working_set(tiny_model: Path, reference: Any) -> None:
    token_prompts = prompts(tiny_model, [260, 200, 330, 150, 280, 240], seed=11)
    expected = _expected(reference, tiny_model, token_prompts)
    # a 64-token chunk of the tiny model is 64 KiB: room for 8 of the prompts' 22 chunks
    transfer = kvtier_transfer(block_size=64, cpu_bytes_to_use="512KiB")
    with engine(tiny_model, kv_transfer_config=transfer) as llm:
        for _ in range(3):
            assert generate(llm, token_prompts) == expected
            settle(llm)
            connector(llm).scheduler.check_integrity()
            llm.reset_prefix_cache()
        stats = kvtier.stats(llm)
        assert connector(llm).scheduler.manager.capacity == 8
        assert stats.cpu.evicted_chunks > 0
        assert stats.cpu.hit_chunks > 0
        assert connector(llm).scheduler.manager.num_pinned == 0


def test_32_concurrent_prompts_sharing_prefixes(tiny_model: Path, reference: Any) -> None:
    heads = prompts(tiny_model, [192, 128, 160, 96], seed=21)
    tails = prompts(tiny_model, [40 + 9 * i for i in range(8)], seed=22)
    token_prompts = [head + tail[1:] for head in heads for tail in tails]
    expected = _expected(reference, tiny_model, token_prompts)
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(block_size=64)) as llm:
        assert generate(llm, token_prompts) == expected
        settle(llm)
        llm.reset_prefix_cache()
        assert generate(llm, token_prompts) == expected
        settle(llm)
        scheduler = connector(llm).scheduler
        scheduler.check_integrity()
        assert scheduler.manager.num_pinned == 0
        assert kvtier.stats(llm).cpu.hit_chunks > 0


def test_request_aborted_while_waiting_for_its_load(hybrid_model: Path, reference: Any) -> None:
    """A hybrid model's hit (two groups) loads while the request waits: abort it then."""
    token_prompts = prompts(hybrid_model, [400], seed=31)
    expected = reference(hybrid_model, token_prompts)
    with engine(hybrid_model, kv_transfer_config=kvtier_transfer()) as llm:
        assert generate(llm, token_prompts) == expected
        settle(llm)
        llm.reset_prefix_cache()
        engine_core = llm.llm_engine.engine_core.engine_core
        llm.llm_engine.add_request("doomed", {"prompt_token_ids": token_prompts[0]}, greedy())
        engine_core.step()  # schedules the load; the request waits for it
        (request,) = engine_core.scheduler.requests.values()  # vLLM suffixes the id
        assert request.status.name == "WAITING_FOR_REMOTE_KVS"
        assert kvtier.stats(llm).cpu.hit_chunks > 0
        llm.llm_engine.abort_request(["doomed"])
        settle(llm)
        scheduler = connector(llm).scheduler
        assert scheduler.manager.num_pinned == 0
        assert not scheduler.requests
        assert not engine_core.scheduler.requests  # vLLM released its blocks too
        scheduler.check_integrity()
        assert generate(llm, token_prompts) == expected  # the engine goes on, correct


def test_preempted_requests_flush_their_stores(tiny_model: Path, reference: Any) -> None:
    token_prompts = prompts(tiny_model, [200, 230, 180, 210], seed=41)
    # 768 tokens of engine KV for the ~1100 the four requests need at once
    tight = {"num_gpu_blocks_override": 24, "max_model_len": 512}
    expected = reference(tiny_model, token_prompts, max_tokens=64, **tight)
    transfer = kvtier_transfer(block_size=64)
    with engine(tiny_model, kv_transfer_config=transfer, **tight) as llm:
        assert generate(llm, token_prompts, greedy(64)) == expected
        settle(llm)
        stats = kvtier.stats(llm)
        assert stats.preemptions > 0
        llm.reset_prefix_cache()
        assert generate(llm, token_prompts, greedy(64)) == expected
        settle(llm)
        scheduler = connector(llm).scheduler
        assert scheduler.manager.num_pinned == 0
        assert not scheduler.requests
        scheduler.check_integrity()


def test_a_failed_load_is_recomputed(
    tiny_model: Path, reference: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load that fails (here: every copy into the engine raises) is reported to vLLM through
    get_block_ids_with_load_errors; the engine recomputes those tokens and the output is right."""
    token_prompts = prompts(tiny_model, [330, 200], seed=71)
    expected = _expected(reference, tiny_model, token_prompts)
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(block_size=64)) as llm:
        assert generate(llm, token_prompts) == expected
        settle(llm)
        llm.reset_prefix_cache()

        def broken(self: CpuCopyHandler, plan: object) -> None:
            if not self.store:
                raise OSError("injected: host memory unreadable")
            original(self, plan)

        original = CpuCopyHandler._copy
        monkeypatch.setattr(CpuCopyHandler, "_copy", broken)
        assert generate(llm, token_prompts) == expected
        settle(llm)
        stats = kvtier.stats(llm)
        assert stats.cpu.failed_loads > 0
        assert stats.cpu.loaded_chunks == 0
        scheduler = connector(llm).scheduler
        assert scheduler.manager.num_pinned == 0
        scheduler.check_integrity()

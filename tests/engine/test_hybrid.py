"""A hybrid model (sliding-window and full attention layers: two KV cache groups) through kvtier.

Blocks a sliding window dropped are vLLM's null block 0: they are never stored or loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import connector, engine, full_chunks, generate, kvtier_transfer, prompts, settle

import kvtier
from kvtier.addresses import NULL_BLOCK
from kvtier.scheduler.connector import SchedulerConnector
from kvtier.step_plan import StepPlan

LENGTHS = [300, 200, 450, 130]  # all longer than the 64-token sliding window
# these tests check the transfers of two groups, not when loading pays: load every hit
LOAD_ALL = {"min_async_load_tokens": 1}


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[StepPlan]:
    """Every plan the scheduler half hands to the workers (a spy on our own code, not vLLM)."""
    seen: list[StepPlan] = []
    build = SchedulerConnector.build_plan

    def spy(self: SchedulerConnector, *args: Any, **kwargs: Any) -> StepPlan:
        plan = build(self, *args, **kwargs)
        seen.append(plan)
        return plan

    monkeypatch.setattr(SchedulerConnector, "build_plan", spy)
    return seen


@pytest.mark.parametrize("chunk", [32, 64])
def test_hybrid_model_reset_and_regenerate(
    hybrid_model: Path, reference: Any, plans: list[StepPlan], chunk: int
) -> None:
    token_prompts = prompts(hybrid_model, LENGTHS, seed=51)
    expected = reference(hybrid_model, token_prompts)
    with engine(
        hybrid_model, kv_transfer_config=kvtier_transfer(block_size=chunk, **LOAD_ALL)
    ) as llm:
        scheduler = connector(llm).scheduler
        assert [g.sliding_window for g in scheduler.groups].count(None) == 1  # two groups
        assert generate(llm, token_prompts) == expected
        settle(llm)
        first = kvtier.stats(llm).cpu.hit_chunks
        llm.reset_prefix_cache()
        assert generate(llm, token_prompts) == expected
        settle(llm)
        assert kvtier.stats(llm).cpu.hit_chunks - first >= 0.9 * full_chunks(token_prompts, chunk)
        assert scheduler.manager.num_pinned == 0
        scheduler.check_integrity()

    stores = [job.src for plan in plans for job in plan.stores]
    loads = [job.dst for plan in plans for job in plan.loads]
    assert stores and loads
    for spec in stores + loads:
        assert NULL_BLOCK not in spec.block_ids.tolist()
    # both groups moved blocks, and the sliding group moved fewer than the full one
    sliding = next(g for g, s in enumerate(scheduler.groups) if s.sliding_window is not None)
    full = 1 - sliding
    assert sum(s.group_sizes[sliding] for s in loads) > 0
    assert sum(s.group_sizes[sliding] for s in loads) < sum(s.group_sizes[full] for s in loads)


def test_hybrid_model_from_disk_then_from_both_tiers(
    hybrid_model: Path, reference: Any, tmp_path: Path
) -> None:
    """A restart loads both groups from disk; then a host tier too small for the prompts serves
    what it still holds and the disk the rest (a host run then a disk run, per group)."""
    token_prompts = prompts(hybrid_model, LENGTHS, seed=52)
    expected = reference(hybrid_model, token_prompts)
    wanted = full_chunks(token_prompts, 64)
    disk = {"path": str(tmp_path / "tier"), "bytes": "256MiB"}
    with engine(
        hybrid_model, kv_transfer_config=kvtier_transfer(block_size=64, disk=disk, **LOAD_ALL)
    ) as llm:
        assert generate(llm, token_prompts) == expected
        settle(llm)
    small = kvtier_transfer(block_size=64, disk=disk, cpu_bytes_to_use="1MiB", **LOAD_ALL)
    with engine(hybrid_model, kv_transfer_config=small) as llm:
        assert generate(llm, token_prompts) == expected  # a new engine: all from disk
        settle(llm)
        stats = kvtier.stats(llm)
        assert stats.tiers["disk"].hit_chunks >= 0.9 * wanted
        assert stats.cpu.hit_chunks == 0
        llm.reset_prefix_cache()
        assert generate(llm, token_prompts) == expected
        settle(llm)
        stats = kvtier.stats(llm)
        assert stats.cpu.hit_chunks > 0  # promoted when loaded from disk
        assert stats.tiers["disk"].hit_chunks > 0.9 * wanted  # and more from disk again
        assert stats.tiers["disk"].bad_chunks == stats.tiers["disk"].failed_loads == 0
        connector(llm).scheduler.check_integrity()


def test_prefixes_ending_inside_a_block_are_never_served_past_where_they_agree(
    hybrid_model: Path, reference: Any
) -> None:
    """vLLM hashes every 16 tokens here (``prefix_match_unit``, allowed with two KV cache
    groups), inside 32-token blocks: a hash ends every half block. Prompts that agree on 80 and
    150 tokens get the outputs they get alone, from the chunks they share (2 and 4)."""
    base = prompts(hybrid_model, [300, 300, 300], seed=53)
    shared = [base[0], base[0][:80] + base[1][80:], base[0][:150] + base[2][150:]]
    expected = reference.many(hybrid_model, [([p], 8) for p in shared])
    config = kvtier_transfer(block_size=32, **LOAD_ALL)
    with engine(hybrid_model, prefix_match_unit=16, kv_transfer_config=config) as llm:
        got, hits = [], []
        for prompt in shared:
            llm.reset_prefix_cache()  # what the engine shares comes from kvtier
            got.append(generate(llm, [prompt]))
            settle(llm)
            hits.append(kvtier.stats(llm).cpu.hit_chunks)
        connector(llm).scheduler.check_integrity()
    assert got == expected
    assert hits == [0, 2, 6], hits

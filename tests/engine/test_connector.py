"""kvtier in real vLLM (in-process, CPU): reused KV is used, and never changes an output token.

Reference: greedy outputs of the same prompts with no connector. Each test generates, empties the
engine's own prefix cache with ``reset_prefix_cache()``, and generates again: the second pass must
come from kvtier and equal the reference token for token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from harness import (
    connector,
    engine,
    full_chunks,
    generate,
    kvtier_transfer,
    prompts,
    settle,
)

import kvtier

LENGTHS = [40, 100, 250, 300, 64, 500, 129, 450]


def _expected(reference: Any, model: Path, token_prompts: list[list[int]]) -> list[list[int]]:
    """``token_prompts``' outputs from the engine without kvtier (its default arguments); the
    module's other such sets too, from the same engine (one engine start instead of three)."""
    seen = prompts(model, [300, 20], seed=3)
    mixed = [seen[0], prompts(model, [200, 10], seed=4)[0], seen[1],
             prompts(model, [200, 10], seed=4)[1]]  # fmt: skip
    others = [prompts(model, [480], seed=7), seen, mixed]
    sets = [(p, 8) for p in (token_prompts, *others)]
    outputs: list[list[list[int]]] = reference.many(model, sets)
    return outputs[0]


@pytest.mark.parametrize(
    ("engine_block", "factor"), [(32, 1), (32, 4), (64, 1), (64, 4)], ids=lambda v: str(v)
)
def test_second_pass_comes_from_kvtier_and_equals_reference(
    tiny_model: Path, reference: Any, engine_block: int, factor: int
) -> None:
    token_prompts = prompts(tiny_model, LENGTHS)
    expected = reference(tiny_model, token_prompts, block_size=engine_block)
    chunk = engine_block * factor
    transfer = kvtier_transfer(block_size=chunk)
    with engine(tiny_model, block_size=engine_block, kv_transfer_config=transfer) as llm:
        assert generate(llm, token_prompts) == expected
        settle(llm)
        first = kvtier.stats(llm).cpu.hit_chunks
        llm.reset_prefix_cache()
        assert generate(llm, token_prompts) == expected
        settle(llm)
        stats = kvtier.stats(llm)
        assert stats.cpu.hit_chunks - first >= 0.9 * full_chunks(token_prompts, chunk)
        assert stats.cpu.failed_loads == 0
        # vLLM's stat loggers got each step's changes (test_observability.py): none are left
        assert connector(llm).get_kv_connector_stats() is None
        connector(llm).scheduler.check_integrity()
        assert connector(llm).scheduler.manager.num_pinned == 0


def test_loaded_kv_is_what_the_engine_uses(tiny_model: Path, reference: Any) -> None:
    """Overwrite the host copies of a prompt's chunks: the output must change."""
    token_prompts = prompts(tiny_model, [480], seed=7)
    expected = _expected(reference, tiny_model, token_prompts)
    with engine(tiny_model, kv_transfer_config=kvtier_transfer()) as llm:
        assert generate(llm, token_prompts) == expected
        settle(llm)
        slots = list(connector(llm).scheduler.manager.stored().values())
        assert len(slots) >= 14
        host = _worker(llm).host
        assert host is not None
        generator = torch.Generator().manual_seed(0)
        # float32 noise of the engine's own scale, on those slots' records
        noise = torch.randn(len(slots), host.record_bytes // 4, generator=generator)
        host.memory[slots] = noise.view(torch.uint8)
        llm.reset_prefix_cache()
        assert generate(llm, token_prompts) != expected
        assert kvtier.stats(llm).cpu.hit_chunks >= 14


def test_short_and_fresh_prompts_pass_through(tiny_model: Path, reference: Any) -> None:
    """A prompt shorter than one chunk, and one never seen (empty hit), next to cached ones."""
    seen = prompts(tiny_model, [300, 20], seed=3)
    fresh = prompts(tiny_model, [200, 10], seed=4)
    mixed = [seen[0], fresh[0], seen[1], fresh[1]]
    expected_seen = _expected(reference, tiny_model, seen)
    expected_mixed = _expected(reference, tiny_model, mixed)
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(block_size=64)) as llm:
        assert generate(llm, seen) == expected_seen
        settle(llm)
        llm.reset_prefix_cache()
        assert generate(llm, mixed) == expected_mixed
        settle(llm)
        scheduler = connector(llm).scheduler
        assert scheduler.manager.num_pinned == 0
        assert not scheduler.requests  # every request's state was released
        scheduler.check_integrity()


def _worker(llm: Any) -> Any:
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    group = get_kv_transfer_group()
    return group.worker

"""A tier from outside kvtier (``memory_tier.py``, under tests/) plugged into a real engine by
its import path alone: it takes its own config section, sits in the chain below host memory, and
serves a second pass with the host tier reset, outputs equal to the engine without kvtier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import memory_tier
import pytest
from harness import connector, engine, full_chunks, generate, kvtier_transfer, prompts, settle

import kvtier

CHUNK = 64  # tokens per chunk: two engine blocks of 32
LENGTHS = [300, 500, 450, 700, 333, 640, 290, 410, 520, 380]  # ten prompts


def test_an_outside_tier_serves_a_second_pass(tiny_model: Path, reference: Any) -> None:
    token_prompts = prompts(tiny_model, LENGTHS, seed=41)
    expected = reference(tiny_model, token_prompts)
    extra = {"block_size": CHUNK, "tiers": ["memory_tier:SPEC"], "memory": {"max_chunks": 512},
             "reset_keeps_tiers": True}  # fmt: skip
    memory_tier.STORE.clear()
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(**extra)) as llm:
        assert [tier.name for tier in connector(llm).scheduler.lower] == ["memory"]
        assert generate(llm, token_prompts) == expected
        settle(llm)
        llm.reset_prefix_cache(reset_connector=True)  # the host tier forgets: hits are the tier's
        assert generate(llm, token_prompts) == expected
        settle(llm)
        memory = kvtier.stats(llm).tiers["memory"]
        assert memory.loaded_chunks >= 0.9 * full_chunks(token_prompts, CHUNK), memory
        assert memory.bad_chunks == memory.failed_loads == 0
        connector(llm).scheduler.check_integrity()
    memory_tier.STORE.clear()


def test_an_outside_tiers_section_is_checked_like_kvtiers_own() -> None:
    from kvtier.config import KVTierConfig

    with pytest.raises(ValueError, match="'memory.max_chunks' is required"):
        KVTierConfig.from_extra_config({"cpu_bytes_to_use": 1, "tiers": ["memory_tier:SPEC"],
                                        "memory": {}}, 32)  # fmt: skip
    with pytest.raises(ValueError, match="unknown key 'memory'"):
        KVTierConfig.from_extra_config({"cpu_bytes_to_use": 1, "memory": {"max_chunks": 1}}, 32)
    with pytest.raises(ValueError, match="cannot import 'no_such_tier'"):
        KVTierConfig.from_extra_config({"cpu_bytes_to_use": 1, "tiers": ["no_such_tier:SPEC"]}, 32)

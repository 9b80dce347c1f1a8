"""Which of vLLM's KV cache group kinds kvtier takes: those whose blocks never change in place."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    SlidingWindowSpec,
)

from kvtier.scheduler.hit import GroupSpec
from kvtier.vllm.assembly import _group_spec

SHAPE = {"block_size": 32, "num_kv_heads": 2, "head_size": 32, "dtype": torch.float32}


def test_full_attention_and_sliding_windows_are_taken() -> None:
    assert _group_spec(FullAttentionSpec(**SHAPE)) == GroupSpec(32, None)
    assert _group_spec(SlidingWindowSpec(**SHAPE, sliding_window=64)) == GroupSpec(32, 64)


def test_a_group_that_frees_blocks_in_place_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="ChunkedLocalAttentionSpec are not supported"):
        _group_spec(ChunkedLocalAttentionSpec(**SHAPE, attention_chunk_size=128))

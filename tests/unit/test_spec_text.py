"""A KV cache group's spec as the layout fingerprint names it (``spec_text``): its fields off their
defaults, so that a field a release adds at its default changes nothing (alike in the newest
release: ``test_release_keys.py``), and a spec that differs is named otherwise."""

from __future__ import annotations

import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVQuantMode,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

from kvtier.vllm.spec_text import spec_text

F32 = torch.float32


def test_only_fields_off_their_defaults_are_named() -> None:
    full = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=F32)
    assert spec_text(full) == (
        "FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32, "
        "head_size_v=32)"
    )
    others = [
        FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=F32,
                          sliding_window=64),
        FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=F32,
                          kv_quant_mode=KVQuantMode.FP8_PER_TENSOR),
        SlidingWindowSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=F32,
                          sliding_window=64),
        FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.bfloat16),
    ]  # fmt: skip
    texts = {spec_text(spec) for spec in [full, *others]}
    assert len(texts) == 5
    assert "sliding_window=64" in spec_text(others[0])
    assert "kv_quant_mode=<KVQuantMode.FP8_PER_TENSOR: 1>" in spec_text(others[1])


def test_a_uniform_groups_layers_are_named_in_order() -> None:
    full = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=F32)
    first = UniformTypeKVCacheSpecs(block_size=32, kv_cache_specs={"b": full, "a": full})
    second = UniformTypeKVCacheSpecs(block_size=32, kv_cache_specs={"a": full, "b": full})
    assert spec_text(first) == spec_text(second)
    assert spec_text(first).startswith("UniformTypeKVCacheSpecs(block_size=32, ")
    assert "{'a': FullAttentionSpec(" in spec_text(first)

"""Canonical block views: one row per engine block, K/V split, aliased groups share views."""

from __future__ import annotations

import pytest
import torch

from kvtier.layout import block_views, build_layout


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def test_cpu_layout_is_one_row_per_block() -> None:
    # vLLM CPU: (num_blocks, kv_heads, block_size, 2 * head_size)
    kv = torch.randn(5, 2, 32, 64)
    (view,) = block_views(kv, num_blocks=5)
    assert view.dtype == torch.int64
    assert view.shape == (5, 2 * 32 * 64 * 4 // 8)
    for b in range(5):
        assert _bytes(view[b]) == _bytes(kv[b])


def test_flash_attention_layout_splits_k_and_v() -> None:
    # CUDA FlashAttention: (2, num_blocks, block_size, kv_heads, head_size)
    kv = torch.randn(2, 6, 16, 2, 32, dtype=torch.bfloat16)
    k, v = block_views(kv, num_blocks=6)
    for b in range(6):
        assert _bytes(k[b]) == _bytes(kv[0, b])
        assert _bytes(v[b]) == _bytes(kv[1, b])
    assert k.data_ptr() != v.data_ptr()


def test_explicit_block_dim_resolves_two_blocks() -> None:
    kv = torch.randn(2, 2, 16, 2, 32)  # K/V first, and only 2 blocks: ambiguous without a hint
    k, v = block_views(kv, num_blocks=2, block_dim=1)
    assert _bytes(k[1]) == _bytes(kv[0, 1])
    assert _bytes(v[0]) == _bytes(kv[1, 0])


def test_padded_block_stride_keeps_rows_apart() -> None:
    backing = torch.arange(4 * 24, dtype=torch.int32)
    kv = backing.as_strided((4, 16), (24, 1))  # 16 words of page, 8 words of padding per block
    (view,) = block_views(kv, num_blocks=4)
    assert view.shape[1] * view.element_size() == 64
    assert view.stride(0) * view.element_size() == 96
    assert _bytes(view[3]) == _bytes(kv[3])


def test_aliased_groups_share_views_and_memory_counts_once() -> None:
    # vLLM 0.32 hybrid: layer i of the full group and of the sliding group share one buffer
    buffer = torch.zeros(2 * 8 * 256, dtype=torch.uint8)
    layer0, layer1 = (buffer[i * 2048 : (i + 1) * 2048].view(8, 256) for i in range(2))
    caches = {"full.0": layer0, "full.1": layer1, "swa.0": layer0, "swa.1": layer1}
    layout = build_layout(caches, [["full.0", "full.1"], ["swa.0", "swa.1"]], num_blocks=8)
    assert len(layout.views) == 2
    assert layout.groups == ((0, 1), (0, 1))
    assert layout.distinct_bytes == buffer.numel()
    assert layout.bytes_per_block() == 512


def test_separate_groups_get_their_own_views() -> None:
    caches = {"a": torch.zeros(4, 64), "b": torch.zeros(4, 32)}
    layout = build_layout(caches, [["a"], ["b"]], num_blocks=4)
    assert layout.groups == ((0,), (1,))
    assert layout.page_bytes == (256, 128)
    assert layout.bytes_per_block() == 384


def test_missing_block_dim_and_unknown_layer_are_refused() -> None:
    with pytest.raises(ValueError, match="no dimension of size 7"):
        block_views(torch.zeros(4, 8), num_blocks=7)
    with pytest.raises(ValueError, match="'ghost'"):
        build_layout({"a": torch.zeros(4, 8)}, [["ghost"]], num_blocks=4)

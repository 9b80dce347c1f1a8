"""A request's hashes as kvtier's core reads them: one per engine block, whatever vLLM's unit;
the context parallelism that would break a chunk's naming refused."""

from __future__ import annotations

import pytest
import torch
from vllm.config import CacheConfig, KVTransferConfig, ParallelConfig, VllmConfig
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)

from kvtier.config import KVTierConfig
from kvtier.vllm.assembly import SchedulerSide
from kvtier.vllm.block_hashes import EveryNth, hashes_per_block, per_block
from kvtier.vllm.kv_role import KVRole

SHAPE = {"block_size": 32, "num_kv_heads": 2, "head_size": 32, "dtype": torch.float32}
GROUPS = [
    KVCacheGroupSpec(["full"], FullAttentionSpec(**SHAPE)),
    KVCacheGroupSpec(["window"], SlidingWindowSpec(**SHAPE, sliding_window=64)),
]
TRANSFER = KVTransferConfig(
    kv_connector="KVTierConnector", kv_connector_module_path="kvtier.vllm", kv_role="kv_both"
)


def _kv_cache(groups: list[KVCacheGroupSpec]) -> KVCacheConfig:
    return KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=groups)


def test_every_nth_hash_ends_a_block_and_follows_the_list_as_it_grows() -> None:
    hashes = [bytes([i]) for i in range(7)]
    view = EveryNth(hashes, 2)
    assert len(view) == 3 and list(view) == [b"\x01", b"\x03", b"\x05"]
    assert view[-1] == b"\x05" and view[1:] == [b"\x03", b"\x05"] and view[5:9] == []
    with pytest.raises(IndexError):
        view[3]
    hashes.append(b"\x07")  # the engine hashed another unit: a fourth block is full
    assert len(view) == 4 and view[-1] == b"\x07"


@pytest.mark.parametrize(("unit", "expected"), [(None, 1), (16, 2), (8, 4)])
def test_vllms_prefix_match_unit_sets_the_hashes_per_block(unit: int | None, expected: int) -> None:
    config = VllmConfig(
        cache_config=CacheConfig(block_size=32, prefix_match_unit=unit), kv_transfer_config=TRANSFER
    )
    assert hashes_per_block(config, _kv_cache(GROUPS)) == expected


def test_a_hashing_unit_that_does_not_divide_the_block_is_refused_naming_why() -> None:
    parallel = ParallelConfig(tensor_parallel_size=2, decode_context_parallel_size=2)
    config = VllmConfig(
        cache_config=CacheConfig(block_size=32), parallel_config=parallel,
        kv_transfer_config=TRANSFER,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"every 64 tokens .*decode_context_parallel_size=2.*32"):
        hashes_per_block(config, _kv_cache(GROUPS[:1]))
    with pytest.raises(ValueError, match="every 48 tokens"):
        per_block(64, 48)


def test_prefill_context_parallelism_is_refused_naming_it() -> None:
    """Its ranks share a tensor-parallel rank and a pipeline stage, which name a rank's share."""
    config = VllmConfig(kv_transfer_config=TRANSFER)
    config.parallel_config.prefill_context_parallel_size = 2  # V2's, which needs CUDA to build
    kvtier = KVTierConfig.from_extra_config({"cpu_bytes_to_use": "1MiB"}, 32)
    with pytest.raises(ValueError, match="prefill_context_parallel_size=2"):
        SchedulerSide.build(config, _kv_cache(GROUPS), kvtier, KVRole(config, kvtier))

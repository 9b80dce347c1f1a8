"""kvtier's tiers in vLLM's KV events: what a router is told each tier holds, beside the
engine's own ("GPU") blocks.

    kv_events(prefix_events, block_size) -> [BlockStored | BlockRemoved]

Each ``PrefixEvent`` of the scheduler half (``scheduler/prefix_events.py``) becomes vLLM's event
of the same blocks, in the engine's block hashes as vLLM publishes its own, with the tier as its
``medium`` ("CPU", "DISK", "REDIS").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.v1.core.kv_cache_utils import BlockHash, ExternalBlockHash, maybe_convert_block_hash

from kvtier.scheduler.prefix_events import PrefixEvent


def kv_events(events: Iterable[PrefixEvent], block_size: int) -> Iterator[KVCacheEvent]:
    for event in events:
        hashes, medium = [_external(h) for h in event.block_hashes], event.tier.upper()
        if event.stored:
            parent = event.parent
            yield BlockStored(
                block_hashes=hashes,
                parent_block_hash=None if parent is None else _external(parent),
                token_ids=list(event.token_ids), block_size=block_size, lora_id=None,
                medium=medium, lora_name=None, group_idx=event.group,
            )  # fmt: skip
        else:
            yield BlockRemoved(block_hashes=hashes, medium=medium, group_idx=event.group)


def _external(block_hash: bytes) -> ExternalBlockHash:
    """A block hash as vLLM publishes its own (an int: ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``)."""
    return maybe_convert_block_hash(BlockHash(block_hash))

"""kvtier's tiers in vLLM's KV events: what a router is told each tier holds, beside the
engine's own ("GPU") blocks.

    block_tags(request, block_size) -> tags | None    what else names its blocks' KV
    kv_events(prefix_events, block_size) -> [BlockStored | BlockRemoved]

Each ``PrefixEvent`` of the scheduler half (``scheduler/prefix_events.py``) becomes vLLM's event
of the same blocks, in the engine's block hashes as vLLM publishes its own, with the tier as its
``medium`` ("CPU", "DISK", "REDIS"), and with what else names their KV as vLLM tells it of its
own blocks: the request's LoRA adapter (``lora_id``, ``lora_name``) and each block's
``extra_keys`` (the adapter's name, the cache salt of a prompt's first block), made by vLLM's
own functions. A router that keys blocks by their tokens keeps prompts of two adapters or two
salts apart by them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.v1.core.kv_cache_utils import (
    BlockHash,
    ExternalBlockHash,
    generate_block_hash_extra_keys,
    maybe_convert_block_hash,
    to_event_extra_keys,
)

from kvtier.scheduler.prefix_events import PrefixEvent

if TYPE_CHECKING:
    from vllm.v1.request import Request


class Tags(NamedTuple):
    """What vLLM's own event of a request's blocks says of them besides their tokens."""

    lora_id: int | None = None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None


def block_tags(request: Request, block_size: int) -> Callable[[int, int], Tags] | None:
    """``Tags`` of ``request``'s engine blocks ``[first, end)`` of ``block_size`` tokens, as
    vLLM's block pool tells them (None where there is nothing to tell: no adapter, no salt; a
    request whose KV its tokens do not name, images or prompt embeddings, is never told)."""
    lora = request.lora_request
    if lora is None and not request.cache_salt:
        return None

    def tags(first: int, end: int) -> Tags:
        keys = [generate_block_hash_extra_keys(request, b * block_size, (b + 1) * block_size, 0)[0]
                for b in range(first, end)]  # fmt: skip
        if lora is None:
            return Tags(extra_keys=to_event_extra_keys(keys))
        return Tags(lora.adapter_id, lora.name, to_event_extra_keys(keys))

    return tags


def kv_events(events: Iterable[PrefixEvent], block_size: int) -> Iterator[KVCacheEvent]:
    for event in events:
        hashes, medium = [_external(h) for h in event.block_hashes], event.tier.upper()
        if event.stored:
            parent = event.parent
            tags = event.tags if isinstance(event.tags, Tags) else _NONE
            yield BlockStored(
                block_hashes=hashes,
                parent_block_hash=None if parent is None else _external(parent),
                token_ids=list(event.token_ids), block_size=block_size, lora_id=tags.lora_id,
                medium=medium, lora_name=tags.lora_name, extra_keys=tags.extra_keys,
                group_idx=event.group,
            )  # fmt: skip
        else:
            yield BlockRemoved(block_hashes=hashes, medium=medium, group_idx=event.group)


_NONE = Tags()


def _external(block_hash: bytes) -> ExternalBlockHash:
    """A block hash as vLLM publishes its own (an int: ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``)."""
    return maybe_convert_block_hash(BlockHash(block_hash))

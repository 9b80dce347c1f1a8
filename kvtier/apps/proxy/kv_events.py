"""vLLM's KV events as the proxy reads them: decoded by field name, unknown fields ignored.

vLLM publishes ``KVEventBatch(ts, events, data_parallel_rank)`` as a msgpack array, each event a
map tagged ``type`` (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``); before vLLM PR
#42892 an event was a positional array led by its tag. Both are read here without importing
vLLM (the proxy never does), and a field vLLM adds later is ignored, never an error.

    decode_batch(payload) -> list[Event]   ValueError for what is not a batch of events
"""

from __future__ import annotations

from enum import Enum
from typing import Any, NamedTuple

import msgspec

# the fields of the positional (pre-#42892) encoding, in order
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                  "medium")  # fmt: skip
_REMOVED_FIELDS = ("block_hashes", "medium")


class Kind(Enum):
    STORED = "BlockStored"
    REMOVED = "BlockRemoved"
    CLEARED = "AllBlocksCleared"


class Event(NamedTuple):
    kind: Kind
    block_hashes: tuple[int | bytes, ...] = ()
    parent: int | bytes | None = None
    token_ids: tuple[int, ...] = ()
    block_size: int = 0
    medium: str = "GPU"  # None in an event means the engine's own memory
    group: int = 0


_decoder = msgspec.msgpack.Decoder()


def decode_batch(payload: bytes) -> list[Event]:
    """The events of one published batch, in order; events of an unknown type are skipped."""
    try:
        batch = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not msgpack: {exc}") from None
    if not isinstance(batch, list | dict):
        raise ValueError(f"a batch is an array or a map, not {type(batch).__name__}")
    raw = batch[1] if isinstance(batch, list) and len(batch) > 1 else None
    if isinstance(batch, dict):
        raw = batch.get("events")
    if not isinstance(raw, list):
        raise ValueError("a batch without a list of events")
    events = [_event(item) for item in raw]
    return [event for event in events if event is not None]


def _event(item: Any) -> Event | None:
    if isinstance(item, list) and item and isinstance(item[0], str):
        tag, values = item[0], item[1:]
        names = _STORED_FIELDS if tag == Kind.STORED.value else _REMOVED_FIELDS
        item = {"type": tag, **dict(zip(names, values))}
    if not isinstance(item, dict):
        raise ValueError(f"an event is a map, not {type(item).__name__}")
    try:
        kind = Kind(item.get("type"))
    except ValueError:
        return None  # a type this proxy does not know: nothing it can index
    if kind is Kind.CLEARED:
        return Event(kind)
    hashes = item.get("block_hashes")
    if not isinstance(hashes, list) or not all(isinstance(h, int | bytes) for h in hashes):
        raise ValueError(f"{kind.value}: block_hashes is not a list of hashes")
    medium = item.get("medium") or "GPU"
    group = item.get("group_idx") or 0
    if kind is Kind.REMOVED:
        return Event(kind, tuple(hashes), medium=str(medium), group=int(group))
    tokens = item.get("token_ids") or []
    size = item.get("block_size")
    if not isinstance(size, int) or not isinstance(tokens, list):
        raise ValueError("BlockStored: block_size or token_ids missing")
    parent = item.get("parent_block_hash")
    return Event(kind, tuple(hashes), parent, tuple(tokens), size, str(medium), int(group))

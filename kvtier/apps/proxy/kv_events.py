"""vLLM's KV events as the proxy reads them: decoded by field name, unknown fields ignored.

vLLM publishes ``KVEventBatch(ts, events, data_parallel_rank)`` as a msgpack array, each event a
map tagged ``type`` (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``); before vLLM PR
#42892 an event was a positional array led by its tag. Both are read here without importing
vLLM (the proxy never does), and a field vLLM adds later is ignored, never an error.

What names a block's KV besides its tokens is read too: the LoRA adapter (``lora_name``) and,
from ``extra_keys`` (untagged, one entry per block), the cache salt of a prompt's first block.
A block whose extra keys hold anything else (an image's ``(identifier, offset)``, a prompt
embedding's digest, a key vLLM adds later) cannot be named by token ids: it and the event's
blocks after it are marked ``opaque_from``, never indexed.

    decode_batch(payload) -> list[Event]   ValueError for what is not a batch of events
"""

from __future__ import annotations

from enum import Enum
from typing import Any, NamedTuple

import msgspec

# the fields of the positional (pre-#42892) encoding, in order
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                  "medium", "lora_name")  # fmt: skip
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
    lora: str | None = None  # the LoRA adapter the blocks were computed with
    salt: str | None = None  # the cache salt of the prompt's first block (an event without parent)
    opaque_from: int | None = None  # the first block its tokens do not name (None: none)


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
    lora = item.get("lora_name")
    lora = lora if isinstance(lora, str) and lora else None
    salt, opaque = _extra(item.get("extra_keys"), lora, parent is None)
    return Event(kind, tuple(hashes), parent, tuple(tokens), size, str(medium), int(group),
                 lora, salt, opaque)  # fmt: skip


def _extra(keys: Any, lora: str | None, first: bool) -> tuple[str | None, int | None]:
    """The salt in ``keys`` (an event's ``extra_keys``: per block, the adapter's name first
    where it has one, then images' pairs, the salt, prompt embeddings' digests), and the first
    block whose keys hold more than the adapter and, on a prompt's ``first`` block, a salt."""
    if not isinstance(keys, list):
        return None, None
    salt = None
    for block, entry in enumerate(keys):
        rest = list(entry) if isinstance(entry, list | tuple) else [] if entry is None else [entry]
        if lora is not None and rest[:1] == [lora]:
            rest = rest[1:]
        if block == 0 and first and len(rest) == 1 and isinstance(rest[0], str) and rest[0]:
            salt, rest = rest[0], []
        if rest:
            return salt, block
    return salt, None

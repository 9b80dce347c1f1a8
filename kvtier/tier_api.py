"""Everything a tier from outside kvtier needs, in one module: import this, nothing else.

A tier is a module exporting a ``TierSpec`` (docs/DESIGN.md §8), plugged by its import path
(``"tiers": ["my_pkg.my_tier:SPEC"]``) or an entry point in group ``kvtier.tiers``:

    config      a frozen dataclass with ``parse(raw, key)`` built from ``mapping``, ``required``,
                ``optional``, ``positive_int``, ``positive_size``, ``non_negative_float``,
                ``non_empty_str`` (each error a ValueError naming the dotted key)
    index       the scheduler half's: a ``TierIndex`` (``lookup -> Found``, ``traits ->
                Traits``, ``usage() -> Usage``, prepare/complete load and store, ...); one
                that sorts what it finds at start-up by the keys' namespace is ``Namespaced``
    a rank's    a ``ChunkTier`` (``read``/``write`` a chunk's record, ``prefetch``), wrapped in
    side        ``WorkerTier(name, load=TierLoadHandler(...), write=TierWriteHandler(...))``;
                ``view_bytes`` gives a record's views, ``ChunkError`` is a bad or absent chunk
    spec        ``TierSpec(name, hit_source, section, parse, scheduler=..., worker=...)``, the
                builders taking a ``SchedulerContext`` / ``WorkerContext``

Keys are ``ChunkKey``s (``key_group`` names a key's KV cache group). The handlers and the
engine's layout are imported when first used (they bring torch), so that a config naming the
tier is parsed without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kvtier.config_parse import (
    mapping,
    non_empty_str,
    non_negative_float,
    optional,
    positive_int,
    positive_size,
    required,
)
from kvtier.keys import ChunkKey, key_group
from kvtier.tiers.base.chunk_format import Buffer, ChunkError
from kvtier.tiers.base.chunk_tier import ChunkTier, FlushTier, view_bytes
from kvtier.tiers.base.index import Found, Namespaced, TierIndex, Traits, Usage
from kvtier.tiers.base.spec import SchedulerContext, TierSpec, WorkerContext, WorkerTier

if TYPE_CHECKING:
    from kvtier.layout import KVLayout
    from kvtier.tiers.base.chunk_io import TierLoadHandler, TierWriteHandler

_LAZY = {  # name -> the module that defines it, imported when the name is first used
    "KVLayout": "kvtier.layout",
    "TierLoadHandler": "kvtier.tiers.base.chunk_io",
    "TierWriteHandler": "kvtier.tiers.base.chunk_io",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kvtier.tier_api' has no attribute {name!r}")


__all__ = [
    "Buffer", "ChunkError", "ChunkKey", "ChunkTier", "FlushTier", "Found", "KVLayout", "Namespaced",
    "SchedulerContext", "TierIndex", "TierLoadHandler", "TierSpec", "TierWriteHandler",
    "Traits", "Usage", "WorkerContext", "WorkerTier", "key_group", "mapping", "non_empty_str",
    "non_negative_float", "optional", "positive_int", "positive_size", "required", "view_bytes",
]  # fmt: skip

"""What the worker half's handlers of a tier below host memory need from it, one rank's view.

The disk tier (``disk/files.py``: a verified file per chunk and rank) and the Redis tier
(``redis/tier.py``: a verified record per chunk and rank) both are one, as a tier from outside
kvtier may be; the load and write handlers of ``chunk_io.py`` move chunks through any.

    prefetch(key)              start fetching ``key`` (the handler calls it a few chunks ahead,
                               in the order it then reads them)
    read(key, out)             fetch and verify the chunk's record into ``out`` (byte buffers whose
                               concatenation receives it, usually one); ChunkError: bad or
                               absent (a miss), OSError: unreachable
    write(key, payload) -> n   write this rank's share: its record, the concatenation of the
                               ``payload`` buffers (usually one); OSError when it could not

A tier that a shutdown should write the host chunks it lacks to is also a ``FlushTier``
(below; ``worker/shutdown_flush.py`` drives it): ``file_bytes(group)``, ``holds_many(keys)``,
``write_many(keys, payloads)``.

A chunk's record is its bytes as ``records.py`` lays them out: its group's views in order,
each its ``factor`` pages back to back (``view_bytes`` gives their lengths). A tier stores and
returns it as it is; the handlers hand it over in one piece, straight from a host slot or into a
staging area.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from kvtier.keys import ChunkKey
from kvtier.tiers.base.chunk_format import Buffer

if TYPE_CHECKING:  # (the engine's views are torch's: not imported to parse a config)
    from kvtier.layout import KVLayout


class ChunkTier(Protocol):
    factor: int
    layout: KVLayout
    read_ahead: int  # chunks the load handler prefetches ahead of the one it reads

    def prefetch(self, key: ChunkKey) -> None: ...

    def read(self, key: ChunkKey, out: Sequence[np.ndarray]) -> None: ...

    def write(self, key: ChunkKey, payload: Sequence[Buffer]) -> int: ...


def view_bytes(layout: KVLayout, group: int, factor: int) -> list[int]:
    """Payload bytes of a chunk of ``group`` (``factor`` blocks) in each of its views, in order."""
    return [layout.page_bytes[view] * factor for view in layout.groups[group]]


class FlushTier(Protocol):
    """A tier below host memory as one worker rank writes it at shutdown (``DiskTier``,
    ``RedisTier``): the bytes a chunk of ``group`` takes there, which keys it holds, and
    pipelined writes (the bytes of each, None where it refused one; OSError: down)."""

    layout: KVLayout

    def file_bytes(self, group: int) -> int: ...

    def holds_many(self, keys: Sequence[ChunkKey]) -> list[bool]: ...

    def write_many(
        self, keys: Sequence[ChunkKey], payloads: Sequence[Sequence[Buffer]]
    ) -> list[int | None]: ...

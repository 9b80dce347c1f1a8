"""A chunk's record: its bytes as host memory, a disk file and a Redis record all hold them.

A chunk of group ``g`` is the group's views in order, each its ``factor`` engine pages back to
back::

    view groups[g][0]: page 0 | page 1 | ... | page factor-1
    view groups[g][1]: page 0 | ...
    ...

This is, byte for byte, the payload of a chunk file (``tiers/chunk_format.py``) and of a Redis
record, as kvtier has always written them, so a record moves between host memory and a tier as
one buffer. A host slot is ``record_bytes`` long, the largest group's record; a chunk of a smaller
group leaves the rest of its slot unused.

    RecordLayout.of(layout, factor)       the layout of a rank's records
    .view_bytes(g) -> [int]              bytes of each view of group g in its record
    .group_bytes(g) -> int               bytes of group g's record
    .offsets(g) -> (int, ...)            where each view of group g starts in the record
    HostRecords                          host memory as a tier writes from it: a record a slot
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:  # (the engine's views are torch's: not imported to parse a config)
    from kvtier.layout import KVLayout


@dataclass(frozen=True)
class RecordLayout:
    page_bytes: tuple[int, ...]  # per view: bytes of one engine block's page
    groups: tuple[tuple[int, ...], ...]  # per group: its views, in record order
    factor: int  # engine blocks per chunk
    # per group: where each view starts in a record, then its end (a job asks chunk by chunk)
    _offsets: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.factor < 1:
            raise ValueError(f"kvtier: block_size_factor must be >= 1, got {self.factor}")
        offsets = tuple(
            tuple(accumulate(self.view_bytes(g), initial=0)) for g in range(len(self.groups))
        )
        object.__setattr__(self, "_offsets", offsets)

    @classmethod
    def of(cls, layout: KVLayout, factor: int) -> RecordLayout:
        return cls(layout.page_bytes, layout.groups, factor)

    def view_bytes(self, group: int) -> list[int]:
        return [self.page_bytes[view] * self.factor for view in self.groups[group]]

    def group_bytes(self, group: int) -> int:
        return self._offsets[group][-1]

    @property
    def record_bytes(self) -> int:
        """Bytes of a host slot: the largest group's record (0 without views)."""
        return max((offsets[-1] for offsets in self._offsets), default=0)

    def offsets(self, group: int) -> tuple[int, ...]:
        return self._offsets[group][:-1]


class HostRecords(Protocol):
    """Host memory as a tier's writes read it (``tiers/host/buffers.py``'s ``HostTier``):
    ``num_chunks`` slots, each holding a chunk's record."""

    @property
    def num_chunks(self) -> int: ...

    def record(self, slot: int, group: int) -> np.ndarray:
        """The bytes of ``slot`` a chunk of ``group`` uses (a view)."""
        ...

"""Where the chunks of one side of a transfer are: one address spec per medium.

Both halves speak these: the scheduler half names sources and destinations with them, the worker
half's handlers (registered per ``(src, dst)`` medium) read them. Plain, picklable data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvtier.keys import ChunkKey
from kvtier.media import Medium

NULL_BLOCK = 0  # vLLM's placeholder for blocks a group does not keep (outside a sliding window)


class TransferSpec:
    """Where the chunks of one side of a transfer are, in one medium (its name)."""

    @property
    def medium(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class EngineBlocks(TransferSpec):
    """Engine blocks of one transfer, flattened group by group (DESIGN §4, vLLM PR #38453).

    ``group_sizes[g]`` blocks of ``block_ids`` belong to group ``g`` (may be 0);
    ``block_indices[g]`` is the logical index, inside the request, of group ``g``'s first block, so
    a transfer may start in the middle of a chunk.
    """

    block_ids: np.ndarray = field(repr=False)  # int64, (sum(group_sizes),)
    group_sizes: tuple[int, ...]
    block_indices: tuple[int, ...]

    @property
    def medium(self) -> str:
        return Medium.ENGINE


@dataclass(frozen=True)
class HostChunks(TransferSpec):
    """Host-tier slots of one transfer, flattened group by group in the engine spec's order."""

    slots: np.ndarray = field(repr=False)  # int64

    @property
    def medium(self) -> str:
        return Medium.CPU


@dataclass(frozen=True)
class TierChunks(TransferSpec):
    """Chunks in a tier of the chain (``tier``: its name, the medium), by key, flattened group
    by group (a key names its group); the tier names each rank's share of a chunk.

    ``staged``: copy the source now, in ``transfer_async``, because its memory is reused right
    after (a chunk written back as it is evicted from the host tier).
    """

    tier: str
    keys: tuple[ChunkKey, ...]
    staged: bool = False

    @property
    def medium(self) -> str:
        return self.tier

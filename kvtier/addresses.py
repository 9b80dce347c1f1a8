"""Where the chunks of one side of a transfer are: one address spec per medium.

Both halves speak these: the scheduler half names sources and destinations with them, the worker
half's handlers (registered per ``(src, dst)`` medium) read them. Plain, picklable data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from kvtier.keys import ChunkKey
from kvtier.media import Medium


class TransferSpec:
    """Where the chunks of one side of a transfer are, in one medium."""

    medium: ClassVar[Medium]


@dataclass(frozen=True)
class EngineBlocks(TransferSpec):
    """Engine blocks of one transfer, flattened group by group (DESIGN §4, vLLM PR #38453).

    ``group_sizes[g]`` blocks of ``block_ids`` belong to group ``g`` (may be 0);
    ``block_indices[g]`` is the logical index, inside the request, of group ``g``'s first block, so
    a transfer may start in the middle of a chunk.
    """

    medium: ClassVar[Medium] = Medium.ENGINE
    block_ids: np.ndarray = field(repr=False)  # int64, (sum(group_sizes),)
    group_sizes: tuple[int, ...]
    block_indices: tuple[int, ...]


@dataclass(frozen=True)
class HostChunks(TransferSpec):
    """Host-tier slots of one transfer, flattened group by group in the engine spec's order."""

    medium: ClassVar[Medium] = Medium.CPU
    slots: np.ndarray = field(repr=False)  # int64


@dataclass(frozen=True)
class DiskChunks(TransferSpec):
    """Chunks in the disk tier, by key, flattened group by group (a key names its group).

    ``staged``: copy the source now, in ``transfer_async``, because its memory is reused right
    after (a chunk written back as it is evicted from the host tier).
    """

    medium: ClassVar[Medium] = Medium.DISK
    keys: tuple[ChunkKey, ...]
    staged: bool = False


@dataclass(frozen=True)
class RedisChunks(DiskChunks):
    """Chunks in the Redis/Valkey tier, by key: like ``DiskChunks``, one record per chunk and
    rank (``tiers/redis_keys.py`` names it)."""

    medium: ClassVar[Medium] = Medium.REDIS


@dataclass(frozen=True)
class PeerBlocks(TransferSpec):
    """A prefill engine's blocks of one finished request, pulled by the decode engine.

    ``endpoints[rank]`` is the (host, port) of the prefill rank that worker rank ``rank`` pulls
    from; ``block_ids[g]`` are the prefill engine's blocks of group ``g``, paired one to one with
    the destination's blocks of that group.
    """

    medium: ClassVar[Medium] = Medium.PEER
    endpoints: tuple[tuple[str, int], ...]
    req_id: str
    block_ids: tuple[tuple[int, ...], ...]

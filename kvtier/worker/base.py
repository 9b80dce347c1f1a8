"""The worker half's transfer contract: address specs per medium, handlers per (src, dst) pair.

Primitives:
    transfer_async(job_id, src, dst) -> bool   submit a copy; False if it could not be submitted
    get_finished() -> list[TransferResult]     jobs finished since the last call, each once
    wait(job_ids)                              block until those jobs finished (tests, shutdown)
    shutdown()                                 finish what is in flight and release threads/streams
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

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


class TransferResult(NamedTuple):
    job_id: int
    success: bool
    bytes: int
    seconds: float
    bad: tuple[int, ...] = ()  # chunks of the job that failed (positions in its key order)


class TransferHandler(ABC):
    """Moves bytes between two media. Jobs submitted to one handler finish in submission order."""

    @abstractmethod
    def transfer_async(self, job_id: int, src: TransferSpec, dst: TransferSpec) -> bool: ...

    @abstractmethod
    def get_finished(self) -> list[TransferResult]: ...

    @abstractmethod
    def wait(self, job_ids: Collection[int]) -> None: ...

    def shutdown(self) -> None:
        """Release threads or streams; jobs in flight finish first."""

"""The worker half's transfer contract: handlers per (src, dst) medium (see ``addresses.py``).

Primitives:
    transfer_async(job_id, src, dst) -> bool   submit a copy; False if it could not be submitted
    get_finished() -> list[TransferResult]     jobs finished since the last call, each once
    wait(job_ids)                              block until those jobs finished (tests, shutdown)
    shutdown()                                 finish what is in flight and release threads/streams
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from typing import NamedTuple

from kvtier.addresses import TransferSpec


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

    def wait_any(self, timeout: float) -> None:
        """Block, the GIL released, until a job finished or none is in flight, at most
        ``timeout``: for an engine step with nothing to compute. Default: return at once."""

    def shutdown(self) -> None:
        """Release threads or streams; jobs in flight finish first."""

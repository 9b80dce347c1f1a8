"""The worker half's transfer contract: handlers per (src, dst) medium (see ``addresses.py``).

Primitives:
    transfer_async(job_id, src, dst) -> bool   submit a copy; False if it could not be submitted
    transfer_batch(transfers) -> [bool]        submit several at once (a step's stores): a
                                               handler may copy them as one; transfers of one
                                               job id are its parts (engine <-> host handlers)
    get_finished() -> list[TransferResult]     jobs finished since the last call, each once
    wait(job_ids)                              block until those jobs finished (tests, shutdown)
    fence(job_ids)                             the engine's work queued next runs after those
                                               jobs (a GPU handler: on the device, no block)
    shutdown()                                 finish what is in flight and release threads/streams
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from typing import NamedTuple

from kvtier.addresses import TransferSpec


class Transfer(NamedTuple):
    job_id: int
    src: TransferSpec
    dst: TransferSpec


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

    def transfer_batch(self, transfers: Sequence[Transfer]) -> list[bool]:
        """Submit ``transfers`` in order, each as ``transfer_async`` would (False: refused).
        A handler may copy them as one, and report them together; default: one by one."""
        return [self.transfer_async(*transfer) for transfer in transfers]

    @abstractmethod
    def get_finished(self) -> list[TransferResult]: ...

    @abstractmethod
    def wait(self, job_ids: Collection[int]) -> None: ...

    def fence(self, job_ids: Collection[int]) -> None:
        """Make the engine's work queued after this call (the step's forward) run after those
        jobs. Default: block until they finished; a handler on a GPU stream makes the engine's
        stream wait for them instead, and reports them once done (``get_finished``)."""
        self.wait(job_ids)

    def wait_any(self, timeout: float) -> None:
        """Block, the GIL released, until a job finished or none is in flight, at most
        ``timeout``: for an engine step with nothing to compute. Default: return at once."""

    def shutdown(self) -> None:
        """Release threads or streams; jobs in flight finish first."""

"""The worker half's entry point: routes jobs to the handler of their (src, dst) media."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kvtier.addresses import TransferSpec
from kvtier.tiers.base.handler import Transfer, TransferHandler, TransferResult


class TransferWorker:
    """Owns the handlers of one worker rank. Job ids are the caller's, unique while in flight."""

    def __init__(self) -> None:
        self._handlers: dict[tuple[str, str], TransferHandler] = {}
        self._job_handler: dict[int, TransferHandler] = {}

    def register_handler(self, src: str, dst: str, handler: TransferHandler) -> None:
        """``handler`` moves ``src`` -> ``dst`` (media: ``media.py``)."""
        if (src, dst) in self._handlers:
            raise ValueError(f"kvtier: a handler for {src} -> {dst} is registered")
        self._handlers[(src, dst)] = handler

    def transfer_async(self, job_id: int, spec: tuple[TransferSpec, TransferSpec]) -> bool:
        """Submit job ``job_id`` copying ``spec[0]`` to ``spec[1]``; False if it was refused."""
        src, dst = spec
        handler = self._handler(src.medium, dst.medium)
        if job_id in self._job_handler:
            raise ValueError(f"kvtier: transfer job {job_id} is already in flight")
        if not handler.transfer_async(job_id, src, dst):
            return False
        self._job_handler[job_id] = handler
        return True

    def transfer_batch(self, transfers: Sequence[Transfer]) -> list[bool]:
        """Submit ``transfers`` (one step's, e.g. its stores), each handler's together, in
        order; per transfer whether it was submitted (False: refused)."""
        batches: dict[tuple[str, str], list[int]] = {}  # media -> positions in transfers
        for position, (job_id, src, dst) in enumerate(transfers):  # raise before any submits
            if job_id in self._job_handler:
                raise ValueError(f"kvtier: transfer job {job_id} is already in flight")
            media = (src.medium, dst.medium)
            if media not in batches:
                self._handler(*media)
            batches.setdefault(media, []).append(position)
        submitted = [False] * len(transfers)
        for media, positions in batches.items():
            handler = self._handlers[media]
            batch = [transfers[p] for p in positions]
            for position, ok in zip(positions, handler.transfer_batch(batch), strict=True):
                submitted[position] = ok
                if ok:
                    self._job_handler[transfers[position].job_id] = handler
        return submitted

    def get_finished(self) -> list[TransferResult]:
        """Jobs finished since the last call, each reported once."""
        finished = [r for h in self._handlers.values() for r in h.get_finished()]
        for result in finished:
            self._job_handler.pop(result.job_id, None)
        return finished

    def _handler(self, src: str, dst: str) -> TransferHandler:
        handler = self._handlers.get((src, dst))
        if handler is None:
            known = ", ".join(f"{s}->{d}" for s, d in self._handlers)
            raise ValueError(f"kvtier: no handler for {src} -> {dst} (have: {known})")
        return handler

    def wait(self, job_ids: Collection[int]) -> None:
        for handler in self._running(job_ids):
            handler.wait(job_ids)

    def wait_any(self, job_ids: Collection[int], timeout: float) -> None:
        """Block, the GIL released, until a job of the handlers running ``job_ids`` finished,
        at most ``timeout`` per handler (``TransferHandler.wait_any``)."""
        for handler in self._running(job_ids):
            handler.wait_any(timeout)

    def fence(self, job_ids: Collection[int]) -> None:
        """The engine's next work runs after those jobs (``TransferHandler.fence``)."""
        for handler in self._running(job_ids):
            handler.fence(job_ids)

    def _running(self, job_ids: Collection[int]) -> set[TransferHandler]:
        """The handlers running those of ``job_ids`` still in flight."""
        return {self._job_handler[j] for j in job_ids if j in self._job_handler}

    @property
    def num_in_flight(self) -> int:
        return len(self._job_handler)

    def shutdown(self) -> None:
        for handler in self._handlers.values():
            handler.shutdown()

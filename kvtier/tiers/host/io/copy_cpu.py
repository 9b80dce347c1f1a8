"""Engine <-> host copies for CPU engine tensors, split across copy lanes.

A job's pages are cut into pieces of about equal bytes that the job's thread and its helper lanes
(``copy_lanes.py``) claim one at a time, so that two cores move bytes at once. The copies are
numpy's (``pages/direct.py``): they release the GIL and start no threads (a torch copy would make
each lane an OpenMP master with a team of its own beside the engine's).

Loads run inline: ``transfer_async`` returns once the job's bytes are in the engine blocks (vLLM
waits for them before the forward), and ``get_finished`` reports the job. Stores run inline too by
default, right after the step's forward (``handlers.engine_host_handlers`` says why); with
``inline=False`` they run on the handler's job thread, in submission order, and ``wait`` and
``wait_any`` block with the GIL released. A step's stores come together (``transfer_batch``) and
copy as one (``row_batch.py``): one claim of the lanes for all of them.

Contracts that keep an engine from hanging: a job never waits for a helper lane that is gone; a
store submitted after shutdown fails and is counted; a shutdown run on a kvtier thread does not
join that thread. The lanes are sized from the cores this thread may run on
(``handlers.copy_lanes``: vLLM binds a rank's threads, and threads created here inherit the mask).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from functools import partial

from kvtier.layout import KVLayout
from kvtier.pages import PageMover, Pages
from kvtier.tiers.base.chunk_plan import GroupCopy
from kvtier.tiers.base.handler import Transfer, TransferResult
from kvtier.tiers.base.job_thread import JobThread
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.io.copy_lanes import CopyLanes
from kvtier.tiers.host.io.engine_host import EngineHostHandler
from kvtier.tiers.host.io.row_batch import RowBatch, plan_rows

logger = logging.getLogger(__name__)

MIN_PIECE_BYTES = 1 << 20  # below this a claim costs more than a second lane saves
PIECES_PER_LANE = 8  # small enough pieces that lanes finish together


class CpuCopyHandler(EngineHostHandler):
    """``inline``: copy in ``transfer_async`` itself instead of on the handler's job thread.

    ``lanes`` threads copy each job: the one running it and ``lanes - 1`` helpers.
    """

    def __init__(
        self, layout: KVLayout, host: HostTier, store: bool, inline: bool, lanes: int
    ) -> None:
        super().__init__(layout, host, store)
        self._memory = host.memory.view(-1)  # (num_chunks * record_bytes,) bytes
        self._mover = PageMover(layout.views) if layout.views else None
        name = "kvtier-store" if store else "kvtier-load"
        # a store on a thread is background work (it never holds up a step); inline, it is not
        background = store and not inline
        self._lanes = CopyLanes(name, max(lanes, 1) - 1, self.device, background=background)
        self._thread = None if inline else JobThread(name, self.device, background=background)
        self._inline_finished: list[TransferResult] = []  # the caller's thread only
        self._factor = host.block_size_factor

    def _submit(self, job_id: int, plan: list[GroupCopy], nbytes: int) -> None:
        if self._thread is not None:
            self._thread.submit(job_id, lambda: self._run(job_id, plan, nbytes))
            return
        try:
            result = self._run(job_id, plan, nbytes)
        except Exception:
            logger.exception("kvtier: transfer job %d failed", job_id)
            result = TransferResult(job_id, False, 0, 0.0)
        self._inline_finished.append(result)

    def transfer_batch(self, transfers: Sequence[Transfer]) -> list[bool]:
        """Inline, several jobs (a step's stores) copy as one (``row_batch.py``): planned with
        Python ints, split across the lanes. Transfers sharing a job id are that job's parts,
        reported as one job. A job ``plan_copy`` refuses (any of its parts) is refused alone; if
        a job names a block or slot out of range, or the joined copy fails, each job is copied
        alone instead (``EngineHostHandler``), so only the jobs that fail by themselves are
        reported failed."""
        if self._thread is not None or len(transfers) < 2:
            return super().transfer_batch(transfers)
        groups = len(self.layout.groups)
        planned: dict[int, list[tuple[int, list[int], list[int]]] | None] = {}
        for job_id, src, dst in transfers:
            rows = planned.setdefault(job_id, [])
            if rows is None:
                continue  # a part refused: the job is
            engine, host = self._sides(src, dst)
            try:
                rows += plan_rows(engine, host, self._factor, groups)
            except ValueError as error:
                logger.error("kvtier: refused transfer job %d: %s", job_id, error)
                planned[job_id] = None
        jobs = {job_id: rows for job_id, rows in planned.items() if rows is not None}
        submitted = [planned[transfer.job_id] is not None for transfer in transfers]
        batch = RowBatch.of(list(jobs.values()), groups)
        num_rows = self.host.num_chunks * self._factor
        if not batch.within(self.layout.num_blocks, num_rows):
            return super().transfer_batch(transfers)
        nbytes = {job_id: sum(len(ids) * self.layout.group_block_bytes[g] for g, ids, _ in rows)
                  for job_id, rows in jobs.items()}  # fmt: skip
        started, total = time.perf_counter(), max(sum(nbytes.values()), 1)
        try:
            self._copy(batch, total)
        except Exception:
            logger.exception("kvtier: a batch of %d transfer jobs failed", len(jobs))
            again = [t for t in transfers if t.job_id in jobs]
            refused = {t.job_id for t, ok in zip(again, super().transfer_batch(again)) if not ok}
            return [ok and t.job_id not in refused for t, ok in zip(transfers, submitted)]
        seconds = time.perf_counter() - started
        self._inline_finished += [  # each job its share of the time, by its bytes
            TransferResult(job_id, True, size, seconds * size / total)
            for job_id, size in nbytes.items()
        ]
        return submitted

    def _run(self, job_id: int, plan: list[GroupCopy], nbytes: int) -> TransferResult:
        started = time.perf_counter()
        self._copy(RowBatch.of_plan(plan, len(self.layout.groups)), nbytes)
        return TransferResult(job_id, True, nbytes, time.perf_counter() - started)

    def _copy(self, batch: RowBatch, total: int) -> None:
        """Copy ``batch`` (``total`` bytes) on this thread and the helper lanes; raise on a
        failure (ids and rows were range-checked)."""
        if self._mover is None:
            return
        pages = Pages.join([
            self.host.page_map(group, ids, rows)
            for group, (ids, rows) in enumerate(zip(batch.ids, batch.rows, strict=True))
            if len(ids)
        ])  # fmt: skip
        piece_bytes = max(MIN_PIECE_BYTES, -(-total // (self._lanes.lanes * PIECES_PER_LANE)))
        pieces = self._mover.pieces(pages, self._memory, self.store, piece_bytes)
        self._lanes.run([partial(self._run_piece, piece) for piece in pieces])

    def _run_piece(self, piece: Callable[[], None]) -> None:
        piece()

    def get_finished(self) -> list[TransferResult]:
        finished, self._inline_finished = self._inline_finished, []
        return finished + (self._thread.get_finished() if self._thread is not None else [])

    def wait(self, job_ids: Collection[int]) -> None:
        if self._thread is not None:
            self._thread.wait(job_ids)

    def wait_any(self, timeout: float) -> None:
        """Block, the GIL released, until a store finished or none is queued (at most
        ``timeout``): for an engine thread that would otherwise spin through empty steps."""
        if self._thread is not None:
            self._thread.wait_any(timeout)

    def shutdown(self) -> None:
        if self._thread is not None:
            self._thread.shutdown()
        self._lanes.shutdown()

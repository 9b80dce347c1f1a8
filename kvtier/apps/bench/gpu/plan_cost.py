"""What a host job's planning costs the engine's thread, per mechanism, without moving a byte.

    JobPlanner(layout, host, mechanism)   an ``EngineHostHandler`` that plans each job as the
                                          CUDA handler does before it queues anything, and stops
    measure(layout, host, job, reps) -> {mechanism: summary of milliseconds}

The connector's CUDA handler plans a job on the engine's thread before the device does anything:
the job's plan (``EngineHostHandler``), then its grids and the grid kernel's tables
(``pages/grid.py``): for ``kernel`` over host memory, for ``dma`` over the staging area's batches
(``pages/staged_grids.py``, with their host copies).
Timed here on the rig's own layout and host tier, on any device, with the copies left out: a CPU
shows what a GPU's host thread pays per job (``submit_ms``, on a GPU, adds the launches).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

from kvtier.addresses import EngineBlocks, HostChunks
from kvtier.apps.bench.gpu.figures import summary
from kvtier.layout import KVLayout
from kvtier.pages import PageMover, grid
from kvtier.pages.mechanism import Mechanism
from kvtier.tiers.base.chunk_plan import GroupCopy
from kvtier.tiers.base.handler import TransferResult
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.io.engine_host import EngineHostHandler


class JobPlanner(EngineHostHandler):
    """Plans each job it is given (``planned``: the last one's tables or batches); moves
    nothing and reports nothing."""

    def __init__(self, layout: KVLayout, host: HostTier, mechanism: Mechanism) -> None:
        super().__init__(layout, host, store=True)
        self.mechanism = mechanism
        self.views = grid.view_table(layout.views)
        # DMA's planning is the mover's own (``staged_batches``); it moves nothing here
        self.mover = PageMover(layout.views, mechanism=mechanism, host_piece=host.pin_piece_bytes)
        self.planned: grid.Tables | None = None

    def _submit(self, job_id: int, plan: list[GroupCopy], nbytes: int) -> None:
        grids = self.host.page_grids(plan)
        if self.mechanism is Mechanism.KERNEL:
            self.planned = grid.tables(grids, self.views, self.host.memory.data_ptr())
            return
        staged = [g for batch in self.mover.staged_batches(grids) for g in batch.grids]
        self.planned = grid.tables(staged, self.views, 0)  # at the staging area's offsets

    def get_finished(self) -> list[TransferResult]:
        return []

    def fence(self, job_ids: Collection[int]) -> None:
        pass

    def wait(self, job_ids: Collection[int]) -> None:
        pass


def measure(
    layout: KVLayout, host: HostTier, job: tuple[EngineBlocks, HostChunks], reps: int
) -> dict[str, Any]:
    """Milliseconds the engine's thread plans the store ``job`` (blocks -> slots of ``host``),
    per mechanism (the first plan of each, a warm-up, not counted)."""
    found: dict[str, Any] = {}
    for mechanism in Mechanism:
        planner = JobPlanner(layout, host, mechanism)
        seconds = []
        for rep in range(reps + 1):
            started = time.perf_counter()
            if not planner.transfer_async(rep, *job):
                raise RuntimeError(f"the {mechanism.value} planner refused the request")
            seconds.append(time.perf_counter() - started)
        found[mechanism.value] = summary([s * 1e3 for s in seconds[1:]])
    return found

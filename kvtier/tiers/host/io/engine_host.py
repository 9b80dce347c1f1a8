"""Copies between the engine's blocks and the host tier, in either direction.

``EngineHostHandler`` validates and plans a job (``plan.py``); subclasses decide where the copies
run: a thread for CPU engine tensors (``copy_cpu.py``), a CUDA stream for GPU ones
(``copy_cuda.py``). ``handlers.py`` picks the pair for a layout; this module imports neither.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Sequence

from kvtier.addresses import EngineBlocks, HostChunks, TransferSpec
from kvtier.layout import KVLayout
from kvtier.tiers.base.chunk_plan import (
    GroupCopy,
    check_groups,
    check_range,
    plan_copy,
)
from kvtier.tiers.base.handler import Transfer, TransferHandler
from kvtier.tiers.host.buffers import HostTier

logger = logging.getLogger(__name__)


class EngineHostHandler(TransferHandler):
    """One direction between engine blocks and host slots: ``store`` is engine -> host."""

    def __init__(self, layout: KVLayout, host: HostTier, store: bool) -> None:
        self.layout = layout
        self.host = host
        self.store = store
        self.device = layout.device  # captured once, before any copy runs

    def transfer_async(self, job_id: int, src: TransferSpec, dst: TransferSpec) -> bool:
        return self.transfer_batch([Transfer(job_id, src, dst)])[0]

    def transfer_batch(self, transfers: Sequence[Transfer]) -> list[bool]:
        """Plan each job (a bad one is refused alone) and submit it. Transfers sharing a job id
        are that job's parts (a step's stores: one job): planned together, one refused refuses
        the job, copied and reported as one."""
        plans: dict[int, list[GroupCopy] | None] = {}
        for job_id, src, dst in transfers:
            if job_id in plans and plans[job_id] is None:
                continue  # a part refused: the job is
            plan = self._checked_plan(job_id, src, dst)
            plans[job_id] = None if plan is None else [*(plans.get(job_id) or []), *plan]
        block = self.layout.group_block_bytes
        for job_id, plan in plans.items():
            if plan is not None:
                nbytes = sum(len(copy.block_ids) * block[copy.group] for copy in plan)
                self._submit(job_id, plan, nbytes)
        return [plans[transfer.job_id] is not None for transfer in transfers]

    def _checked_plan(
        self, job_id: int, src: TransferSpec, dst: TransferSpec
    ) -> list[GroupCopy] | None:
        engine, host = self._sides(src, dst)
        try:
            return self._plan(engine, host)
        except ValueError as error:
            logger.error("kvtier: refused transfer job %d: %s", job_id, error)
            return None

    def _sides(self, src: TransferSpec, dst: TransferSpec) -> tuple[EngineBlocks, HostChunks]:
        """The job's engine side and host side (``TypeError``: not this handler's media)."""
        engine, host = (src, dst) if self.store else (dst, src)
        if not isinstance(engine, EngineBlocks) or not isinstance(host, HostChunks):
            raise TypeError(
                f"kvtier: {type(self).__name__} moves EngineBlocks <-> HostChunks, "
                f"got {type(src).__name__} -> {type(dst).__name__}"
            )
        return engine, host

    @abstractmethod
    def _submit(self, job_id: int, plan: list[GroupCopy], nbytes: int) -> None:
        """Start the copies of ``plan``; report ``job_id`` through ``get_finished`` when done."""

    def _plan(self, engine: EngineBlocks, host: HostChunks) -> list[GroupCopy]:
        check_groups(engine, len(self.layout.groups))
        check_range("engine block id", engine.block_ids, self.layout.num_blocks)
        check_range("host slot", host.slots, self.host.num_chunks)
        return plan_copy(engine, host, self.host.block_size_factor)

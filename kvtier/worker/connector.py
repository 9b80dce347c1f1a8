"""The worker half, one per rank: runs the scheduler's plan and reports what finished.

Each step, in the engine's order:
    begin_step(plan)     before the forward: wait for the stores the plan flushes (the first
                         also begins pinning a GPU's host tier)
    start_loads()        submit the plan's loads (the requests wait for them, off this step)
    start_stores()       after the forward: submit the plan's tier writes, then its stores
    finished(ids)     -> (finished_sending, finished_recving, failed_recving) request ids
    report()          -> WorkerReport of the jobs this rank finished since the last report
    drain()              wait for every transfer in flight (before vLLM unmaps the KV memory)

Every rank, pipeline ranks that produce no tokens included, reports every job it ran, also on
steps without a forward pass, so the scheduler can count a job done on all ranks.

Besides the host tier, a rank has one ``WorkerTier`` per tier of the chain and per request source
(``tiers/spec.py``), built by the tiers' packages: their handlers are registered by their names
(tier -> engine, host -> tier), and the connector loops over them, naming none.

The jobs in flight, and what each one's end means, are ``jobs.py``'s; this rank's counters
``rank_counters.py``; each tier's own work is in its package.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from kvtier.addresses import TransferSpec
from kvtier.layout import KVLayout, build_layout, host_num_chunks
from kvtier.media import Medium
from kvtier.step_plan import LoadJob, StepPlan, StoreJob, TierWriteJob, WorkerReport
from kvtier.tiers.base.handler import Transfer
from kvtier.tiers.base.spec import WorkerTier
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.io.handlers import engine_host_handlers
from kvtier.tiers.host.room import check_room
from kvtier.worker.jobs import InFlight, JobKind, Jobs
from kvtier.worker.rank_counters import RankCounters
from kvtier.worker.shutdown_flush import FlushTarget, flush_tiers
from kvtier.worker.transfer_worker import TransferWorker

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.01  # the longest a step with no forward pass waits for a tier's load
SHUTDOWN_FLUSH_S = 4.0  # the longest a shutdown writes host chunks to the lower tiers
SUSPECT_STEPS = 3  # steps after a failed load before the scheduler forgot what it spoiled


# a tier's side on this rank, from its views, host tier and layout description (``describe``)
TierBuilder = Callable[[KVLayout, HostTier, str], WorkerTier | None]


class WorkerConnector:
    def __init__(
        self,
        cpu_bytes_to_use: int,
        block_size_factor: int,
        world_size: int,
    ) -> None:
        self.cpu_bytes_to_use = cpu_bytes_to_use
        self.factor = block_size_factor
        self.world_size = world_size
        self.layout: KVLayout | None = None
        self.host: HostTier | None = None
        self.transfers = TransferWorker()
        self._loads: list[LoadJob] = []  # this step's, not yet submitted
        self._stores: list[StoreJob] = []
        self._tier_writes: list[TierWriteJob] = []
        self._held: set[str] = set()  # finished requests whose stores the scheduler waits for
        self._tier_room: dict[str, int] = {}
        self._forward = True
        self.tiers: dict[str, WorkerTier] = {}  # the chain's and the request sources', by name
        self.layout_description = ""  # ``KVLayout.describe``, once registered
        self.counters = RankCounters()
        self.jobs = Jobs(self.counters)
        self._steps = 0  # reports made: one per engine step
        self._failed_step = -SUSPECT_STEPS  # the last step in which a load failed here
        self._failed_loads_seen = 0

    def register(
        self,
        kv_caches: Mapping[str, torch.Tensor],
        group_layers: Sequence[Sequence[str]],
        num_blocks: int,
        tiers: Sequence[TierBuilder] = (),
        packing: str = "",
    ) -> None:
        """Build the block views and the host tier for this rank's KV tensors, then each
        tier's side on this rank (``tiers``, in the chain's order; a builder may give none).
        ``packing``: how the attention kernel packs a page (``KVLayout.packing``)."""
        self.layout = build_layout(kv_caches, group_layers, num_blocks, packing=packing)
        self.layout_description = self.layout.describe()
        chunks = host_num_chunks(
            self.layout.bytes_per_block(), self.world_size, self.factor, self.cpu_bytes_to_use
        )
        if self.layout.device.type == "cuda":  # pinned as it serves: is the memory there?
            check_room(self.layout, chunks, self.factor, self.world_size)
        # on a GPU, pinned from the first step on: vLLM captures its CUDA graphs before it
        self.host = HostTier(self.layout, chunks, self.factor, pin_now=False)
        store, load = engine_host_handlers(self.layout, self.host)
        self.transfers.register_handler(Medium.ENGINE, Medium.CPU, store)
        self.transfers.register_handler(Medium.CPU, Medium.ENGINE, load)
        for build in tiers:
            tier = build(self.layout, self.host, self.layout_description)
            if tier is not None:
                self.add_tier(tier)
        logger.info(
            "kvtier: host tier of %d chunks (%.1f MiB on this rank), %d views, %d groups",
            chunks, self.host.nbytes / 2**20, len(self.layout.views), len(group_layers),
        )  # fmt: skip

    def add_tier(self, tier: WorkerTier) -> None:
        """A tier's side on this rank: its handlers, under its name."""
        if tier.name in self.tiers or tier.name in (Medium.ENGINE, Medium.CPU):
            raise ValueError(f"kvtier: two tiers named {tier.name!r}")
        self.tiers[tier.name] = tier
        if tier.load is not None:
            self.transfers.register_handler(tier.name, Medium.ENGINE, tier.load)
        if tier.write is not None:
            self.transfers.register_handler(Medium.CPU, tier.name, tier.write)

    def tier(self, name: str) -> WorkerTier:
        """This rank's side of tier ``name`` (KeyError: none)."""
        return self.tiers[name]

    # ---- each step -------------------------------------------------------------------------

    def begin_step(self, plan: StepPlan) -> None:
        """Take this step's plan; finish the earlier stores whose blocks are about to be reused."""
        if self.host is not None:
            self.host.start_pinning()  # once, at the first step
        self._loads, self._stores = list(plan.loads), list(plan.stores)
        self._tier_writes = list(plan.tier_writes)
        self._tier_room = plan.tier_room
        self._forward = plan.forward
        self._held.update(plan.held)
        if plan.forget:  # stores the scheduler failed (KV from a failed load): never flushed
            self.jobs.forget(plan.forget)
        for name, messages in plan.messages.items():
            tier = self.tiers.get(name)
            if tier is None:
                raise RuntimeError(f"kvtier: messages for tier {name!r}, which this rank lacks")
            tier.begin_step(messages)
        if self.host is not None and plan.num_chunks > self.host.num_chunks:
            raise RuntimeError(
                f"kvtier: the scheduler manages {plan.num_chunks} host chunks but this rank "
                f"holds {self.host.num_chunks}: ranks with unequal KV memory are not supported"
            )
        if plan.flush:
            self.transfers.fence(plan.flush)

    def start_loads(self) -> None:
        """Submit this step's loads. vLLM calls this before the forward when the step holds a
        synchronous load: those are finished before it returns, and are not reported as received
        (their requests are running); a failed one reports its blocks, recomputed this step."""
        loads, self._loads = self._loads, []
        for load in loads:  # a request may load from several tiers: it is done when all are
            if not load.sync:
                self.jobs.load_started(load.job_id, load.req_id)
        for load in loads:
            kind = JobKind.SYNC_LOAD if load.sync else JobKind.LOAD
            self._submit(load.job_id, InFlight(kind, load.req_id, load.dst), (load.src, load.dst))
        in_flight = self.jobs.in_flight
        sync = [load.job_id for load in loads if load.sync and load.job_id in in_flight]
        if sync:
            self.transfers.fence(sync)
            self._poll()

    def start_stores(self) -> None:
        writes, self._tier_writes = self._tier_writes, []
        for write in writes:  # first: a staged write copies slots this step's stores reuse
            writing = InFlight(JobKind.TIER_WRITE, chunks=len(write.dst.keys))
            self._submit(write.job_id, writing, (write.src, write.dst))
        stores, self._stores = self._stores, []
        if not stores:
            return
        jobs: dict[int, list[StoreJob]] = {}  # a job's parts (a step's stores: one job)
        for part in stores:
            jobs.setdefault(part.job_id, []).append(part)
        for job_id, parts in jobs.items():
            self.jobs.stores_started(job_id, parts)
        submitted = [False] * len(stores)
        try:  # together: a handler may copy a step's stores as one
            submitted = self.transfers.transfer_batch(
                [Transfer(part.job_id, part.src, part.dst) for part in stores]
            )
        except Exception:
            logger.exception("kvtier: could not submit %d store jobs", len(jobs))
        ok = dict(zip((part.job_id for part in stores), submitted, strict=True))
        for job_id, parts in jobs.items():
            requests = tuple(dict.fromkeys(part.req_id for part in parts))
            self.jobs.submitted(job_id, InFlight(JobKind.STORE, requests=requests), ok[job_id])

    def _submit(self, job_id: int, job: InFlight, spec: tuple[TransferSpec, TransferSpec]) -> None:
        submitted = False
        try:
            submitted = self.transfers.transfer_async(job_id, spec)
        except Exception:
            logger.exception("kvtier: could not submit transfer job %d", job_id)
        self.jobs.submitted(job_id, job, submitted)

    def _poll(self) -> None:
        for result in self.transfers.get_finished():
            self.jobs.finished(result)

    def finished(self, finished_req_ids: Iterable[str]) -> tuple[set[str], set[str], set[str]]:
        """Requests whose transfers finished on this rank: (sending, receiving, failed receiving).

        A held request is reported once its stores here are done; a load is reported when its
        copy finished, failed or not (a failed one also as failed, so the engine recomputes).
        """
        del finished_req_ids  # the plan's ``held`` says which finished requests wait for stores
        if not self._forward:
            self._wait_idle()
        self._poll()
        offered: set[str] = set()
        for tier in self.tiers.values():
            offered |= tier.holding()
        return self.jobs.requests_done(self._held, offered)

    def _wait_idle(self) -> None:
        """A step with nothing to compute while transfers run: block (the GIL released) until
        one finishes, at most ``IDLE_WAIT_S``. An engine loop that spins through empty steps
        holding the GIL would starve the threads doing the transfers it waits for."""
        jobs, in_flight = self.jobs, self.jobs.in_flight
        if jobs.loading:  # from host memory (a GPU's copy), a tier, a request source
            kind = JobKind.LOAD
        elif jobs.storing:
            kind = JobKind.STORE
        elif any(job.kind is JobKind.TIER_WRITE for job in in_flight.values()):
            kind = JobKind.TIER_WRITE
        else:
            if not in_flight:  # what a tier waits for on its own (a prefill's offers)
                for tier in self.tiers.values():
                    tier.wait_idle(IDLE_WAIT_S)
            return
        waited = [job_id for job_id, job in in_flight.items() if job.kind is kind]
        self.transfers.wait_any(waited, IDLE_WAIT_S)

    def take_failed_blocks(self) -> set[int]:
        return self.jobs.take_failed_blocks()

    def drain(self) -> None:
        """Wait for every transfer in flight: the engine's KV memory is about to be unmapped."""
        self.transfers.wait(list(self.jobs.in_flight))

    def report(self) -> WorkerReport:
        outcomes = self.jobs.take_outcomes()
        self._steps += 1
        if self.counters.failed_loads != self._failed_loads_seen:
            self._failed_loads_seen = self.counters.failed_loads
            self._failed_step = self._steps
        return WorkerReport(outcomes)

    def shutdown(self, flush_s: float = SHUTDOWN_FLUSH_S) -> None:
        """Finish the queued transfers, then write the host chunks the lower tiers lack, for
        at most what is left of ``flush_s`` seconds (``shutdown_flush.py``), then close."""
        deadline = time.monotonic() + flush_s
        self.transfers.shutdown()
        for tier in self.tiers.values():
            if tier.flush is None:  # kept open for the flush: closed after it
                tier.close()
        if self.host is not None:
            try:
                self._poll()  # stores finished since the last step: their slots' keys
                self._flush_host(self.host, deadline)
            except Exception:  # never let a cache's flush break the engine's shutdown
                logger.exception("kvtier: shutdown flush failed")
        for tier in self.tiers.values():
            if tier.flush is not None:
                tier.close()
        if self.host is not None:
            self.host.close()  # unpinned once nothing copies to it

    def _flush_host(self, host: HostTier, deadline: float) -> None:
        """Write the host chunks each tier of the chain lacks, newest first, each within its room,
        so that a restarted engine, and the fleet, find them whatever the write policy and the
        writes the scheduler had queued (nothing else runs now)."""
        targets = []
        for name, tier in self.tiers.items():
            if tier.flush is not None:
                room = self._tier_room.get(name)
                rank_room = None if room is None else room // self.world_size
                targets.append(FlushTarget(name, tier.flush, rank_room))
        if not targets or not self.jobs.slot_keys:
            return
        if self._steps - self._failed_step < SUSPECT_STEPS:
            # a synchronous load that failed spoils the stores of its step (KV computed from
            # its blocks); the scheduler's ``forget`` of them may not have arrived: write none
            logger.warning("kvtier: a load failed in the last %d steps: no host chunk written "
                           "to the lower tiers at shutdown", SUSPECT_STEPS)  # fmt: skip
            return
        chunks = list(reversed(self.jobs.slot_keys.items()))
        flush_tiers(targets, host.record, chunks, deadline, self.counters)

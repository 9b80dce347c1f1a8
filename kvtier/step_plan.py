"""What crosses between the two halves each step: plain, picklable data, never tensors.

Scheduler -> workers: ``StepPlan`` (this step's loads and stores, the tiers' writes, which earlier
stores to finish before the forward, which finished requests the scheduler holds for their stores,
and each tier's messages to its worker side, e.g. the peer tier's offers to decode engines).
Workers -> scheduler: ``WorkerReport`` (jobs finished on this rank), summed over ranks by
``merge`` before the scheduler sees it: a job is done when ``world_size`` ranks reported it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtier.addresses import EngineBlocks, HostChunks, TierChunks, TransferSpec
from kvtier.keys import ChunkKey


@dataclass(frozen=True)
class LoadJob:
    """``sync``: the engine runs the request in this very step, so the load must be done before
    the forward (vLLM then starts loads before it); otherwise the request waits for the load."""

    job_id: int
    req_id: str
    src: TransferSpec  # host slots, a tier's chunks, a peer's blocks
    dst: EngineBlocks
    sync: bool = False


@dataclass(frozen=True)
class StoreJob:
    job_id: int
    req_id: str
    src: EngineBlocks
    dst: HostChunks
    keys: tuple[ChunkKey, ...] = ()  # of dst's slots: a worker's shutdown flush names them


@dataclass(frozen=True)
class TierWriteJob:
    """Host-tier chunks to write to a tier of the chain (``dst.staged``: their slots are reused
    now)."""

    job_id: int
    src: HostChunks
    dst: TierChunks


@dataclass
class StepPlan:
    loads: list[LoadJob] = field(default_factory=list)
    stores: list[StoreJob] = field(default_factory=list)
    tier_writes: list[TierWriteJob] = field(default_factory=list)  # run before the stores
    flush: list[int] = field(default_factory=list)  # store jobs to finish before the forward
    held: list[str] = field(default_factory=list)  # finished requests kept for their stores
    messages: dict[str, list[object]] = field(default_factory=dict)  # tier -> its worker side's
    forget: list[ChunkKey] = field(default_factory=list)  # host copies that hold no chunk
    num_chunks: int = 0  # the host tier's size as the scheduler manages it
    tier_room: dict[str, int] = field(default_factory=dict)  # tier -> bytes (all ranks) it may
    # still take: a shutdown flush's bound (absent: the tier's own budget)
    forward: bool = True  # the step computes tokens (False: the engine only waits, e.g. for loads)


@dataclass
class JobOutcome:
    """One job on one or more ranks: how many ranks finished it, and how many of them failed.

    ``bad``: positions (in the job's key order) of the chunks that failed on any rank.
    """

    ranks: int = 0
    failed: int = 0
    bytes: int = 0
    seconds: float = 0.0
    bad: list[int] = field(default_factory=list)

    def add(self, other: JobOutcome) -> None:
        """Sum ``other``'s ranks into this one (seconds: the slowest rank)."""
        self.ranks += other.ranks
        self.failed += other.failed
        self.bytes += other.bytes
        self.seconds = max(self.seconds, other.seconds)
        self.bad = sorted({*self.bad, *other.bad})


@dataclass
class WorkerReport:
    jobs: dict[int, JobOutcome] = field(default_factory=dict)

    def merge(self, other: WorkerReport) -> WorkerReport:
        jobs = {job_id: JobOutcome() for job_id in self.jobs}
        for job_id, outcome in [*self.jobs.items(), *other.jobs.items()]:
            jobs.setdefault(job_id, JobOutcome()).add(outcome)
        return WorkerReport(jobs)

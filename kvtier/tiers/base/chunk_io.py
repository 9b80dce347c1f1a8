"""Transfers of a tier of the chain, each direction on its own thread: the worker half's handler
pair of any ``chunk_tier.py`` tier (disk; Redis, whose writes are pipelined: ``redis/io.py``).

``TierLoadHandler`` (tier -> engine): reads each chunk's record (``host/records.py``) into a
staging area, and only once every check passed (``ChunkTier.read``) moves it into the engine
blocks, on the device of the engine tensors (never a hard-coded one). Records are read a batch
at a time, ``readers`` of them at once where the tier allows it (``chunk_reads.py``). On the CPU
a batch is ``readers`` records, each scattered once read, one numpy copy a record
(``record_scatter.py``), in two halves where there are several readers. On a GPU the staging
area is pinned, in two halves (``stage_bytes`` each, or a record a reader): a half's records
are moved by one ``PageMover`` load, given as grids (``staged_grids``: one per group, its views
times the blocks; by default the copy kernel straight from the pinned half,
``pages/mover.py``), while the next half is read: with several readers, a batch's reads are
started before the one before it is waited for and moved, so that they never wait for a move.
A chunk that fails a check fails the job, and the engine recomputes its blocks; the job still
verifies every other chunk (without moving it) and names ALL the bad ones at once, so that one
pass drops every bad file, not one per pass.

``TierWriteHandler`` (host tier -> tier): writes each chunk's record straight from its host slot,
one buffer. A ``staged`` job copies the records first, in ``transfer_async``, because this step's
stores reuse the slots (a chunk written back as it is evicted); otherwise the scheduler keeps the
slots pinned until the write is done. A write that fails (a full disk, an I/O error) fails that
chunk of the job, with a warning; the scheduler writes it again while host memory holds it
(``tier_writes.py``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

import numpy as np
import torch

from kvtier.addresses import EngineBlocks, HostChunks, TierChunks, TransferSpec
from kvtier.keys import ChunkKey, key_group
from kvtier.layout import KVLayout
from kvtier.pages import PageMover
from kvtier.pages.grid import PageGrid, record_grid
from kvtier.pages.streams import on_stream
from kvtier.tiers.base.chunk_format import Buffer
from kvtier.tiers.base.chunk_plan import GroupCopy, check_range, join_by_group, plan_copy
from kvtier.tiers.base.chunk_reads import ChunkRead, ChunkReader, plan_reads
from kvtier.tiers.base.chunk_tier import ChunkTier
from kvtier.tiers.base.handler import TransferResult
from kvtier.tiers.base.job_thread import JobThread, ThreadedHandler, engine_ready
from kvtier.tiers.base.record_scatter import RecordScatter
from kvtier.tiers.base.records import HostRecords, RecordLayout

logger = logging.getLogger(__name__)

WARN_EVERY = 100  # after the first, one warning per this many failed writes
READ_AHEAD = 4  # chunk files the kernel is asked to read ahead of the one being loaded
STAGE_BYTES = 32 << 20  # a GPU load's staging half: records moved to the device together


class TierLoadHandler(ThreadedHandler):
    def __init__(
        self, layout: KVLayout, tier: ChunkTier, name: str, readers: int = 1,
        stage_bytes: int = STAGE_BYTES,
    ) -> None:  # fmt: skip
        self.layout = layout
        self.tier = tier
        self.name = name
        self.device = layout.device  # captured once, before any copy runs
        self.records = RecordLayout.of(layout, tier.factor)
        self._thread = JobThread(f"kvtier-{name}-load", self.device)
        self._reader = ChunkReader(tier, name, readers)
        gpu = self.device.type == "cuda"
        record = max(self.records.record_bytes, 1)
        per_half = max(readers, stage_bytes // record) if gpu else readers
        halves = 2 if gpu or readers > 1 else 1  # one read while the other is moved
        # (halves, records, record_bytes): a record read into each, then moved to the engine
        self._stage = torch.empty((halves, per_half, record), dtype=torch.uint8, pin_memory=gpu)
        self._stage_np = self._stage.numpy()
        self._scatter = RecordScatter(layout, self.records) if layout.views and not gpu else None
        self._mover = PageMover(layout.views) if gpu and layout.views else None
        self._stream = torch.cuda.Stream(self.device) if gpu else None  # type: ignore[no-untyped-call]
        # each half's last move, made once: recorded again only after that move was waited for
        self._moved = [_event() for _ in range(halves)] if gpu else []
        self._moving = [False] * halves  # its event recorded, not yet waited for
        self.bad_chunks = 0

    def transfer_async(self, job_id: int, src: TransferSpec, dst: TransferSpec) -> bool:
        if not isinstance(src, TierChunks) or not isinstance(dst, EngineBlocks):
            raise TypeError(f"kvtier: {self.name} loads move TierChunks -> EngineBlocks, got "
                            f"{type(src).__name__} -> {type(dst).__name__}")  # fmt: skip
        try:
            if len(dst.group_sizes) > len(self.layout.groups):
                raise ValueError(f"{len(dst.group_sizes)} groups, the layout has "
                                 f"{len(self.layout.groups)}")  # fmt: skip
            check_range("engine block id", dst.block_ids, self.layout.num_blocks)
            positions = HostChunks(np.arange(len(src.keys), dtype=np.int64))
            plan = plan_copy(dst, positions, self.tier.factor)
            for copy in plan:
                chunks = {int(r) // self.tier.factor for r in copy.host_rows}
                if any(key_group(src.keys[c]) != copy.group for c in chunks):
                    raise ValueError(f"a key of another group in group {copy.group}'s chunks")
        except ValueError as error:
            logger.error("kvtier: refused %s load %d: %s", self.name, job_id, error)
            return False
        ready = engine_ready(self.device)  # the engine may still read the blocks' former contents
        self._thread.submit(job_id, lambda: self._load(job_id, src.keys, plan, ready))
        return True

    def _load(
        self,
        job_id: int,
        keys: tuple[ChunkKey, ...],
        plan: list[GroupCopy],
        ready: torch.cuda.Event | None,
    ) -> TransferResult:
        """Verify every chunk of the job; move each good one until the first bad one.

        A failed job's blocks are all recomputed by the engine, so a chunk read after a bad one
        is only verified (its file removed if bad, kept if good). ``bad``: the positions, in
        ``keys`` order, of every chunk that failed a check or could not be read.
        """
        started = time.perf_counter()
        if ready is not None and self._stream is not None:
            self._stream.wait_event(ready)
        reads = plan_reads(plan, self.tier.factor)
        # readers beside each other keep the tier busy themselves; and a disk file the kernel
        # is asked to read ahead lands in the page cache in small pages, which a later load
        # (from the cache) copies slower than the large ones its own reads bring
        ahead = 0 if self._reader.beside else self.tier.read_ahead
        per_half = self._stage_np.shape[1]
        for n in range(min(ahead, len(reads))):
            self.tier.prefetch(keys[reads[n].chunk])
        bad: list[int] = []
        nbytes, half = 0, 0

        def prefetch(start: int, i: int) -> None:  # read start + i's turn: fetch one further on
            if ahead and start + i + ahead < len(reads):
                self.tier.prefetch(keys[reads[start + i + ahead].chunk])

        def submit(start: int, half: int) -> Reading:
            batch = reads[start : start + per_half]  # read into slots 0.. of the half
            self._reuse(half)
            into = [self._stage_np[half, slot, : self.records.group_bytes(read.group)]
                    for slot, read in enumerate(batch)]  # fmt: skip
            done = self._reader.submit([keys[read.chunk] for read in batch], into,
                                       partial(prefetch, start))  # fmt: skip
            return Reading(half, batch, done)

        # readers beside each other: the next batch is read while this thread waits for one
        # and moves it (into the other half), so that the readers never wait for a move
        ahead_batches = 1 if self._reader.beside and len(self._stage_np) > 1 else 0
        pending: deque[Reading] = deque()
        try:
            for start in range(0, len(reads), per_half):
                pending.append(submit(start, half))
                half = (half + 1) % len(self._stage_np)
                if len(pending) > ahead_batches:
                    nbytes += self._finish(pending.popleft(), bad)
            while pending:
                nbytes += self._finish(pending.popleft(), bad)
        finally:
            for reading in pending:  # raised: no read may go on into a half the next job uses
                with contextlib.suppress(Exception):  # the first error is the one raised
                    reading.done()
        if self._stream is not None:
            self._stream.synchronize()
        self.bad_chunks += len(bad)
        elapsed = time.perf_counter() - started
        return TransferResult(job_id, not bad, nbytes, elapsed, bad=tuple(sorted(bad)))

    def shutdown(self) -> None:
        super().shutdown()  # the queued jobs first: they read
        self._reader.shutdown()

    def _finish(self, reading: Reading, bad: list[int]) -> int:
        """Wait for a batch's reads; move it unless a chunk of the job failed (then the job's
        blocks are recomputed, and the rest is only verified): the bytes moved. ``bad`` gets
        the batch's failed chunks."""
        good = reading.done()
        bad += [read.chunk for read, ok in zip(reading.batch, good) if not ok]
        if bad:
            return 0
        self._move(reading.half, list(enumerate(reading.batch)))
        block = self.layout.group_block_bytes
        return sum(len(read.block_ids) * block[read.group] for read in reading.batch)

    def _reuse(self, half: int) -> None:
        """Wait until the last move out of staging half ``half`` completed."""
        if self._moving[half]:
            self._moved[half].synchronize()
            self._moving[half] = False

    def _move(self, half: int, staged: list[tuple[int, ChunkRead]]) -> None:
        """The records in staging half ``half`` into their engine blocks."""
        if self._scatter is not None:  # the CPU: a numpy copy per record, the GIL released
            for slot, read in staged:
                self._scatter(self._stage_np[half, slot], read.group, read.first, read.block_ids)
            return
        if self._mover is None:  # no views
            return
        grids = staged_grids(self.records, staged, self._stage_np.shape[2])
        assert self._stream is not None
        with on_stream(self._stream):
            self._mover.load(grids, self._stage[half].view(-1))
            self._moved[half].record(self._stream)
        self._moving[half] = True


def _event() -> torch.cuda.Event:
    return torch.cuda.Event()  # type: ignore[no-untyped-call]


class Reading(NamedTuple):
    """A batch of a load being read into a staging half: ``done()`` waits for its reads."""

    half: int
    batch: list[ChunkRead]
    done: Callable[[], list[bool]]


def staged_grids(
    records: RecordLayout, staged: Sequence[tuple[int, ChunkRead]], record_bytes: int
) -> list[PageGrid]:
    """The pages of records staged side by side (``(slot, read)``: chunk ``read`` in slot
    ``slot``, ``record_bytes`` a slot) as one grid per group: its views times the blocks."""
    factor = records.factor
    copies = join_by_group(
        GroupCopy(read.group, read.block_ids,
                  slot * factor + read.first + np.arange(len(read.block_ids), dtype=np.int64))
        for slot, read in staged
    )  # fmt: skip
    return [record_grid(records.groups[c.group], records.offsets(c.group), c.block_ids,
                        c.host_rows, factor, record_bytes) for c in copies]  # fmt: skip


class TierWriteHandler(ThreadedHandler):
    def __init__(self, host: HostRecords, tier: ChunkTier, name: str) -> None:
        self.host = host
        self.tier = tier
        self.name = name
        # host memory only; at normal priority: a pinned write holds its host chunks until done
        self._thread = JobThread(f"kvtier-{name}-write", torch.device("cpu"))
        self.write_errors = 0

    def transfer_async(self, job_id: int, src: TransferSpec, dst: TransferSpec) -> bool:
        if not isinstance(src, HostChunks) or not isinstance(dst, TierChunks):
            raise TypeError(f"kvtier: {self.name} writes move HostChunks -> TierChunks, got "
                            f"{type(src).__name__} -> {type(dst).__name__}")  # fmt: skip
        slots = src.slots
        groups = len(self.tier.layout.groups)
        if any(key_group(key) >= groups for key in dst.keys):
            logger.error("kvtier: refused %s write %d: a key of a group not in the layout",
                         self.name, job_id)  # fmt: skip
            return False
        if len(slots) != len(dst.keys) or (
            len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= self.host.num_chunks)
        ):
            logger.error("kvtier: refused %s write %d: %d slots for %d keys, or out of range",
                         self.name, job_id, len(slots), len(dst.keys))  # fmt: skip
            return False
        payloads: list[list[Buffer]] = [  # each chunk's record, one buffer
            [self.host.record(slot, key_group(key))] for key, slot in zip(dst.keys, slots.tolist())
        ]
        if dst.staged:  # the slots are overwritten by this step's stores: copy them now
            payloads = [[np.array(record) for record in payload] for payload in payloads]
        self._thread.submit(job_id, lambda: self._write(job_id, dst.keys, payloads))
        return True

    def _write(
        self, job_id: int, keys: tuple[ChunkKey, ...], payloads: list[list[Buffer]]
    ) -> TransferResult:
        started = time.perf_counter()
        nbytes, failed = 0, []
        for i, (key, payload) in enumerate(zip(keys, payloads)):
            try:
                nbytes += self.tier.write(key, payload)
            except OSError as error:
                failed.append(i)
                if self.write_errors % WARN_EVERY == 0:
                    logger.warning("kvtier: %s write failed (%d so far): %s",
                                   self.name, self.write_errors + 1, error)  # fmt: skip
                self.write_errors += 1
        elapsed = time.perf_counter() - started
        return TransferResult(job_id, not failed, nbytes, elapsed, bad=tuple(failed))

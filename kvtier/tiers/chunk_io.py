"""Transfers of a tier of the chain, each direction on its own thread: the worker half's handler
pair of any ``chunk_tier.py`` tier (disk; Redis, whose writes are pipelined: ``redis/io.py``).

``TierLoadHandler`` (tier -> engine): reads a chunk's file into a staging buffer, and only once
every check passed (``ChunkTier.read``) scatters its rows into the engine blocks, on the device of
the engine tensors (never a hard-coded one). A chunk that fails a check fails the job, and the
engine recomputes its blocks; the job still verifies every other chunk (without scattering it) and
names ALL the bad ones at once, so that one pass drops every bad file, not one per pass.

``TierWriteHandler`` (host tier -> tier): writes chunks from their host slots. A ``staged`` job
copies the slots first, in ``transfer_async``, because this step's stores reuse them (a chunk
written back as it is evicted); otherwise the scheduler keeps the slots pinned until the write is
done. A write that fails (a full disk, an I/O error) fails that chunk of the job, with a
warning; the scheduler writes it again while host memory holds it (``tier_writes.py``).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from kvtier.addresses import EngineBlocks, HostChunks, TierChunks, TransferSpec
from kvtier.keys import ChunkKey, key_group
from kvtier.layout import KVLayout
from kvtier.tiers.chunk_format import Buffer, ChunkError
from kvtier.tiers.chunk_tier import ChunkTier
from kvtier.tiers.host.buffers import HostTier
from kvtier.worker.base import TransferResult
from kvtier.worker.engine_host import check_range
from kvtier.worker.job_thread import JobThread, ThreadedHandler
from kvtier.worker.plan import GroupCopy, plan_copy

logger = logging.getLogger(__name__)

WARN_EVERY = 100  # after the first, one warning per this many failed writes
READ_AHEAD = 4  # chunk files the kernel is asked to read ahead of the one being loaded


class TierLoadHandler(ThreadedHandler):
    def __init__(self, layout: KVLayout, tier: ChunkTier, name: str) -> None:
        self.layout = layout
        self.tier = tier
        self.name = name
        self.device = layout.device  # captured once, before any copy runs
        self._thread = JobThread(f"kvtier-{name}-load", self.device)
        pin = self.device.type == "cuda"
        factor = tier.factor
        # one chunk of each view, as (factor, page_words): a file is read here, then scattered
        self._staging = [
            torch.empty((factor, view.shape[1]), dtype=view.dtype, pin_memory=pin)
            for view in layout.views
        ]
        self._staging_np = [stage.numpy() for stage in self._staging]
        self._staging_bytes = [stage.reshape(-1).view(np.uint8) for stage in self._staging_np]
        cpu = self.device.type == "cpu"
        self._engine_np = [view.numpy() if cpu else np.empty(0) for view in layout.views]
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
        self._thread.submit(job_id, lambda: self._load(job_id, src.keys, plan))
        return True

    def _load(
        self, job_id: int, keys: tuple[ChunkKey, ...], plan: list[GroupCopy]
    ) -> TransferResult:
        """Verify every chunk of the job; scatter each good one until the first bad one.

        A failed job's blocks are all recomputed by the engine, so a chunk read after a bad one
        is only verified (its file removed if bad, kept if good). ``bad``: the positions, in
        ``keys`` order, of every chunk that failed a check or could not be read.
        """
        started = time.perf_counter()
        factor, nbytes = self.tier.factor, 0
        reads = []  # (position in keys, group copy, its rows in that chunk), in reading order
        for copy in plan:
            chunk_of_row = copy.host_rows // factor
            for chunk in dict.fromkeys(chunk_of_row.tolist()):
                reads.append((chunk, copy, np.flatnonzero(chunk_of_row == chunk)))
        ahead = self.tier.read_ahead
        for n in range(min(ahead, len(reads))):
            self.tier.prefetch(keys[reads[n][0]])
        bad: list[int] = []
        for n, (chunk, copy, mine) in enumerate(reads):
            if n + ahead < len(reads):  # fetched while this one is handled
                self.tier.prefetch(keys[reads[n + ahead][0]])
            views = self.layout.groups[copy.group]
            try:
                self.tier.read(keys[chunk], [self._staging_bytes[v] for v in views])
            except (ChunkError, OSError) as error:
                if not isinstance(error, ChunkError):
                    logger.warning("kvtier: %s chunk unreadable: %s", self.name, error)
                bad.append(chunk)
                continue
            if bad:  # the job failed: its blocks are recomputed, this chunk was only verified
                continue
            ids = copy.block_ids[mine]
            first = int(copy.host_rows[mine[0]]) % factor  # a chunk's rows are consecutive
            for view in views:
                self._scatter(view, ids, first)
            nbytes += len(ids) * sum(self.layout.page_bytes[v] for v in views)
        self.bad_chunks += len(bad)
        elapsed = time.perf_counter() - started
        return TransferResult(job_id, not bad, nbytes, elapsed, bad=tuple(sorted(bad)))

    def _scatter(self, view: int, ids: np.ndarray, first: int) -> None:
        """Staging rows ``first:first + len(ids)`` of ``view`` into engine blocks ``ids``."""
        engine = self.layout.views[view]
        if engine.device.type == "cpu":  # numpy, one copy: no OpenMP team on this thread
            self._engine_np[view][ids] = self._staging_np[view][first : first + len(ids)]
            return
        picked = self._staging[view][first : first + len(ids)].to(engine.device, non_blocking=True)
        engine.index_copy_(0, torch.from_numpy(ids).to(engine.device), picked)
        torch.cuda.current_stream(engine.device).synchronize()  # staging is reused next


class TierWriteHandler(ThreadedHandler):
    def __init__(self, host: HostTier, tier: ChunkTier, name: str) -> None:
        self.host = host
        self.tier = tier
        self.name = name
        # host memory only; at normal priority: a pinned write holds its host chunks until done
        self._thread = JobThread(f"kvtier-{name}-write", torch.device("cpu"))
        self._rows = [buffer.numpy() for buffer in host.buffers]  # (num_chunks, chunk words)
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
        payloads: list[list[Buffer]] = [
            [self._rows[v][slot] for v in self.tier.layout.groups[key_group(key)]]
            for key, slot in zip(dst.keys, slots.tolist())
        ]
        if dst.staged:  # the slots are overwritten by this step's stores: copy them now
            payloads = [[np.array(row) for row in payload] for payload in payloads]
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

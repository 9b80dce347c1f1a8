"""Engine <-> host copies for CUDA engine tensors, staged through one area per direction.

A job is cut into segments (``segments.py``: one view's blocks <-> consecutive host rows) and moved
in batches of at most ``stage_bytes``. A store gathers each segment's engine blocks on the device
into one contiguous device staging area (``index_select`` into its slice), then moves the batch to
the host; a load is the mirror image, ending in ``index_copy_`` into the engine blocks. The host
side of a batch goes one of two ways:

- staged, when its segments average under ``direct_min_bytes``: ONE device <-> host copy of the
  whole batch through the direction's pinned staging buffer, and a CPU copy between that buffer and
  the host tier's rows, only once the device copy that reads or fills it has completed;
- direct, for larger segments: one copy per segment straight between the device staging area and
  the host tier's pinned rows. The tier keeps one buffer per view, so a single transfer would cost
  a CPU copy of every byte; a segment of 128 KiB or more is moved about as fast on its own.

Streams, events, threads. One stream per direction. Each job first waits for the engine's stream
as it was at submission: a store reads blocks the step just wrote, a load fills blocks the engine
may still read from before. Stores run on the handler's job thread, in submission order (it binds
the device once, in its initializer); a store has finished when its last event has. Loads run
inline: ``transfer_async`` returns once the load's event completed, so the forward sees its bytes.
The staging areas are reused by every job of a direction: the device area in stream order, the
pinned buffer only after the copy that used it completed (an event).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from typing import NamedTuple

import numpy as np
import torch

from kvtier.layout import KVLayout
from kvtier.tiers.host.buffers import HostTier
from kvtier.worker.base import TransferResult
from kvtier.worker.engine_host import EngineHostHandler
from kvtier.worker.job_thread import JobThread
from kvtier.worker.plan import GroupCopy
from kvtier.worker.segments import Segment, job_segments, split_segments

logger = logging.getLogger(__name__)

STAGE_BYTES = 64 << 20  # the most a batch stages, on the device and in pinned memory
DIRECT_MIN_BYTES = 128 << 10  # segments this large are copied one by one, without a CPU copy


class Batch(NamedTuple):
    """Segments staged together: segment ``i`` lies at ``offsets[i]`` of the staging area."""

    segments: list[Segment]
    offsets: list[int]
    nbytes: int
    ids: np.ndarray  # every segment's engine block ids, in order (int64)

    def staged(self, direct_min_bytes: int) -> bool:
        """Whether the batch crosses to the host in one copy through the pinned buffer."""
        return len(self.segments) > 1 and self.nbytes < direct_min_bytes * len(self.segments)


def stage_batches(
    segments: Sequence[Segment], page_bytes: Sequence[int], stage_bytes: int
) -> list[Batch]:
    """``segments`` in batches of at most ``stage_bytes``, each segment at its staging offset."""
    batches = []
    for part in split_segments(segments, page_bytes, stage_bytes):
        sizes = [len(s.ids) * page_bytes[s.view] for s in part]
        offsets = np.cumsum([0, *sizes]).tolist()
        ids = np.concatenate([s.ids for s in part]).astype(np.int64, copy=False)
        batches.append(Batch(part, offsets[:-1], offsets[-1], ids))
    return batches


class CudaCopyHandler(EngineHostHandler):
    def __init__(
        self,
        layout: KVLayout,
        host: HostTier,
        store: bool,
        stage_bytes: int = STAGE_BYTES,
        direct_min_bytes: int = DIRECT_MIN_BYTES,
    ) -> None:
        super().__init__(layout, host, store)
        self.stage_bytes = stage_bytes
        self.direct_min_bytes = direct_min_bytes
        self._page_bytes = layout.page_bytes
        self._stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        # byte views: (num_blocks, page_bytes) on the device, (rows, page_bytes) pinned
        self._engine = [view.view(torch.uint8) for view in layout.views]
        self._rows = [host.page_rows(i).view(torch.uint8) for i in range(len(layout.views))]
        self._rows_np = [rows.numpy() for rows in self._rows]
        self._device_stage = torch.empty(0, dtype=torch.uint8, device=self.device)
        self._pinned_stage = torch.empty(0, dtype=torch.uint8, pin_memory=True)
        self._pinned_read: torch.cuda.Event | None = None  # a load's last copy out of it
        self._thread = JobThread("kvtier-store", self.device) if store else None
        self._finished: list[TransferResult] = []  # loads: the caller's thread only

    def _submit(self, job_id: int, plan: list[GroupCopy], nbytes: int) -> None:
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record(torch.cuda.current_stream(self.device))  # the engine's work so far
        if self._thread is not None:
            self._thread.submit(job_id, lambda: self._run(job_id, ready, plan, nbytes))
            return
        try:
            result = self._run(job_id, ready, plan, nbytes)
        except Exception:
            logger.exception("kvtier: transfer job %d failed", job_id)
            result = TransferResult(job_id, False, 0, 0.0)
        self._finished.append(result)

    def _run(
        self, job_id: int, ready: torch.cuda.Event, plan: list[GroupCopy], nbytes: int
    ) -> TransferResult:
        started = time.perf_counter()
        segments = job_segments(plan, self.layout)
        batches = stage_batches(segments, self._page_bytes, self.stage_bytes)
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(ready)
            for batch in batches:
                if self.store:
                    self._store_batch(batch)
                else:
                    self._load_batch(batch)
            done = self._record()
        done.synchronize()
        return TransferResult(job_id, True, nbytes, time.perf_counter() - started)

    def _store_batch(self, batch: Batch) -> None:
        ids = torch.from_numpy(batch.ids).to(self.device, non_blocking=True)
        area = self._device_area(batch.nbytes)
        for (view, _, _), part, at in self._parts(batch):
            torch.index_select(self._engine[view], 0, ids[at : at + len(part)], out=part)
        if not batch.staged(self.direct_min_bytes):
            for (view, first, seg_ids), part, _ in self._parts(batch):
                self._rows[view][first : first + len(seg_ids)].copy_(part, non_blocking=True)
            return
        pinned = self._pinned_area(batch.nbytes)
        pinned.copy_(area, non_blocking=True)
        self._record().synchronize()
        staged = pinned.numpy()
        for (view, first, seg_ids), offset in zip(batch.segments, batch.offsets):
            size = len(seg_ids) * self._page_bytes[view]
            rows = self._rows_np[view][first : first + len(seg_ids)]
            np.copyto(rows, staged[offset : offset + size].reshape(rows.shape))

    def _load_batch(self, batch: Batch) -> None:
        ids = torch.from_numpy(batch.ids).to(self.device, non_blocking=True)
        area = self._device_area(batch.nbytes)
        if batch.staged(self.direct_min_bytes):
            if self._pinned_read is not None:  # the last copy out of the buffer completed
                self._pinned_read.synchronize()
            pinned = self._pinned_area(batch.nbytes)
            staged = pinned.numpy()
            for (view, first, seg_ids), offset in zip(batch.segments, batch.offsets):
                size = len(seg_ids) * self._page_bytes[view]
                rows = self._rows_np[view][first : first + len(seg_ids)]
                np.copyto(staged[offset : offset + size].reshape(rows.shape), rows)
            area.copy_(pinned, non_blocking=True)
            self._pinned_read = self._record()
        else:
            for (view, first, seg_ids), part, _ in self._parts(batch):
                part.copy_(self._rows[view][first : first + len(seg_ids)], non_blocking=True)
        for (view, _, _), part, at in self._parts(batch):
            self._engine[view].index_copy_(0, ids[at : at + len(part)], part)

    def _parts(self, batch: Batch) -> list[tuple[Segment, torch.Tensor, int]]:
        """Per segment: itself, its ``(blocks, page_bytes)`` slice of the device staging area, and
        the index of its first id in ``batch.ids``."""
        parts, at = [], 0
        for segment, offset in zip(batch.segments, batch.offsets):
            page, count = self._page_bytes[segment.view], len(segment.ids)
            part = self._device_stage[offset : offset + count * page].view(count, page)
            parts.append((segment, part, at))
            at += count
        return parts

    def _device_area(self, nbytes: int) -> torch.Tensor:
        """The device staging area's first ``nbytes``; grown on the stream that uses it."""
        if self._device_stage.numel() < nbytes:
            self._device_stage = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self._device_stage[:nbytes]

    def _pinned_area(self, nbytes: int) -> torch.Tensor:
        """The pinned staging buffer's first ``nbytes``; call only once its last copy completed."""
        if self._pinned_stage.numel() < nbytes:
            self._pinned_stage = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return self._pinned_stage[:nbytes]

    def _record(self) -> torch.cuda.Event:
        event = torch.cuda.Event(blocking=self.store)  # type: ignore[no-untyped-call]
        event.record(self._stream)
        return event

    def get_finished(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished + (self._thread.get_finished() if self._thread is not None else [])

    def wait(self, job_ids: Collection[int]) -> None:
        if self._thread is not None:
            self._thread.wait(job_ids)

    def shutdown(self) -> None:
        if self._thread is not None:
            self._thread.shutdown()
        self._stream.synchronize()

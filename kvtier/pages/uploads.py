"""A job's index tables onto the device through memory kept for them: no allocation per job.

    Uploads(device)
    .put(table) -> torch.Tensor   ``table`` (1-D, int64 values) on ``device``, its copy queued
                                  on the current stream
    .queued()                     what the current stream has queued so far is all that reads
                                  what ``put`` gave since the last call: that memory is taken
                                  again once this much of the stream is done

A job's tables (``grid.Tables``; the copy kernel's descriptors) are a few KiB, uploaded on the
engine's thread before the job's kernel can start. Uploaded the plain way (``pin_memory()``, then
``.to(device)``) each costs a pinned and a device allocation and two tensors: on the H200's
host, about 0.2 ms under cProfile of the 1 ms a host job's submit took (``kvtier bench gpu``'s
``submit_profile``; ``call_us`` times it alone), and the copy starts that much later. Here an
upload takes a slot, pinned host memory and device memory kept from job to job (grown when a
table outgrows it). A slot is taken again once an event recorded after the work that read it
is done: checked, never waited for. A slot still in use means another one; with ``MOST_SLOTS``
in use, the plain way.
"""

from __future__ import annotations

import numpy as np
import torch

MOST_SLOTS = 16  # slots in use at once, past which an upload goes the plain way
SMALLEST = 1024  # int64 entries of a slot, at least (8 KiB)


class _Slot:
    """Host and device memory for one table in flight, and the event that frees it."""

    def __init__(self, entries: int, device: torch.device) -> None:
        cuda = device.type == "cuda"
        self.host = torch.empty(entries, dtype=torch.int64, pin_memory=cuda)
        self.host_np = self.host.numpy()
        self.device = torch.empty(entries, dtype=torch.int64, device=device)
        # on the CPU the copy is done when it returns: a slot is free again at ``queued``
        self.event = torch.cuda.Event() if cuda else None  # type: ignore[no-untyped-call]
        self.taken = False  # given out since the last ``queued``
        self.recorded = False  # its event recorded, not yet seen done

    def free(self) -> bool:
        if self.taken:
            return False
        if self.recorded:
            assert self.event is not None
            if not self.event.query():  # type: ignore[no-untyped-call]
                return False
            self.recorded = False
        return True


class Uploads:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.slots: list[_Slot] = []
        self._taken: list[_Slot] = []
        self._index: int | None = None  # on CUDA: the device's, for the quickest stream lookup
        if device.type == "cuda":
            self._index = torch.cuda.current_device() if device.index is None else device.index

    def put(self, table: np.ndarray) -> torch.Tensor:
        n = len(table)
        slot = self._take(n)
        if slot is None:  # every slot in use
            plain = torch.from_numpy(np.ascontiguousarray(table, dtype=np.int64))
            if self.device.type != "cuda":
                return plain
            return plain.pin_memory().to(self.device, non_blocking=True)
        slot.host_np[:n] = table
        out = slot.device[:n]
        out.copy_(slot.host[:n], non_blocking=True)
        return out

    def queued(self) -> None:
        for slot in self._taken:
            if slot.event is not None:
                slot.event.record(torch.cuda.current_stream(self._index))
                slot.recorded = True
            slot.taken = False
        self._taken.clear()

    def _take(self, n: int) -> _Slot | None:
        """A free slot of ``n`` entries or more: one that fits, else one grown, else a new one
        (None: ``MOST_SLOTS`` in use)."""
        outgrown = None
        for at, slot in enumerate(self.slots):
            if slot.free():
                if len(slot.host_np) >= n:
                    return self._taking(slot)
                outgrown = at if outgrown is None else outgrown
        if outgrown is None and len(self.slots) >= MOST_SLOTS:
            return None
        slot = _Slot(max(SMALLEST, 1 << max(n - 1, 0).bit_length()), self.device)
        if outgrown is None:
            self.slots.append(slot)
        else:  # its work is done: its memory replaced by more
            self.slots[outgrown] = slot
        return self._taking(slot)

    def _taking(self, slot: _Slot) -> _Slot:
        slot.taken = True
        self._taken.append(slot)
        return slot
